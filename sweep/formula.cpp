// Recursive-descent parser for sizing formulas, emitting reverse Polish.
#include "sweep/formula.hpp"

#include <cctype>
#include <limits>

#include "support/error.hpp"

namespace kvcheck::sweep {

namespace {

// Expressions nested deeper than this are refused (the parser recurses).
constexpr int kMaxDepth = 64;
// Longest formula accepted, in characters.
constexpr std::size_t kMaxFormulaChars = 1024;

}  // namespace

class FormulaParser {
 public:
  FormulaParser(std::string_view text, const std::string& flag, Formula* out)
      : text_(text), flag_(flag), out_(out) {}

  void parse() {
    if (text_.size() > kMaxFormulaChars) {
      throw Error(ErrorId::kUsage, flag_,
                  "formula longer than " + std::to_string(kMaxFormulaChars) + " characters");
    }
    skip_space();
    if (pos_ == text_.size()) fail("empty formula (example: 'W + k' or 'max(W + k, W + C - 1)')");
    expr(0);
    skip_space();
    if (pos_ != text_.size()) fail("unexpected '" + std::string(1, text_[pos_]) + "'");
  }

 private:
  using Op = Formula::Op;

  [[noreturn]] void fail(const std::string& rule) const {
    throw Error(ErrorId::kUsage, flag_,
                rule + " at column " + std::to_string(pos_ + 1) + " of '" + std::string(text_) + "'");
  }

  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }

  bool take(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void expect(char c) {
    if (!take(c)) {
      fail(pos_ < text_.size()
               ? "expected '" + std::string(1, c) + "', found '" + std::string(1, text_[pos_]) + "'"
               : "expected '" + std::string(1, c) + "', found the end");
    }
  }

  void emit(Op op, std::int64_t value = 0) { out_->nodes_.push_back(Formula::Node{op, value}); }

  void expr(int depth) {
    if (depth > kMaxDepth) fail("formula nested too deeply");
    term(depth);
    for (;;) {
      if (take('+')) {
        term(depth);
        emit(Op::kAdd);
      } else if (take('-')) {
        term(depth);
        emit(Op::kSub);
      } else {
        return;
      }
    }
  }

  void term(int depth) {
    unary(depth);
    for (;;) {
      if (take('*')) {
        unary(depth);
        emit(Op::kMul);
      } else if (take('/')) {
        unary(depth);
        emit(Op::kDiv);
      } else {
        return;
      }
    }
  }

  void unary(int depth) {
    if (depth > kMaxDepth) fail("formula nested too deeply");
    if (take('-')) {
      unary(depth + 1);
      emit(Op::kNeg);
      return;
    }
    primary(depth);
  }

  void primary(int depth) {
    skip_space();
    if (pos_ == text_.size()) fail("expected a number, a name or '(', found the end");
    const char c = text_[pos_];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      std::int64_t v = 0;
      const std::size_t start = pos_;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
        const int d = text_[pos_] - '0';
        if (v > (std::numeric_limits<std::int64_t>::max() - d) / 10) {
          pos_ = start;
          fail("integer literal too large");
        }
        v = v * 10 + d;
        ++pos_;
      }
      emit(Op::kLiteral, v);
      return;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      const std::size_t start = pos_;
      while (pos_ < text_.size() &&
             (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) {
        ++pos_;
      }
      const std::string name(text_.substr(start, pos_ - start));
      if (name == "W") return emit(Op::kWindow);
      if (name == "k") return emit(Op::kDrafts);
      if (name == "C") return emit(Op::kChunk);
      if (name == "B") return emit(Op::kBlock);
      if (name == "max" || name == "min") {
        expect('(');
        expr(depth + 1);
        expect(',');
        expr(depth + 1);
        expect(')');
        emit(name == "max" ? Op::kMax : Op::kMin);
        return;
      }
      pos_ = start;
      fail("unknown name '" + name + "' (names: W, k, C; functions: max(a,b), min(a,b))");
    }
    if (c == '(') {
      ++pos_;
      expr(depth + 1);
      expect(')');
      return;
    }
    fail("expected a number, a name or '(', found '" + std::string(1, c) + "'");
  }

  std::string_view text_;
  const std::string& flag_;
  Formula* out_;
  std::size_t pos_ = 0;
};

Formula Formula::parse(std::string_view text, const std::string& flag) {
  Formula f;
  f.text_ = std::string(text);
  f.flag_ = flag;
  FormulaParser(f.text_, flag, &f).parse();
  return f;
}

std::int64_t Formula::evaluate(std::int64_t window_keys, std::int64_t drafts, std::int64_t chunk_rows,
                               std::int64_t block_size) const {
  const auto where = [&] {
    return " evaluating '" + text_ + "' at W=" + std::to_string(window_keys) +
           ", k=" + std::to_string(drafts) + ", C=" + std::to_string(chunk_rows);
  };
  // Reverse Polish needs at most nodes_.size() entries.
  std::vector<std::int64_t> stack;
  stack.reserve(nodes_.size());
  for (const Node& n : nodes_) {
    if (n.op == Op::kBlock) {
      if (block_size <= 0) {
        throw Error(ErrorId::kUsage, flag_,
                    "B (rows per block) is defined only when the sweep runs a paged cache, in '" + text_ + "'");
      }
      stack.push_back(block_size);
      continue;
    }
    if (n.op == Op::kLiteral || n.op == Op::kWindow || n.op == Op::kDrafts || n.op == Op::kChunk) {
      stack.push_back(n.op == Op::kLiteral  ? n.value
                      : n.op == Op::kWindow ? window_keys
                      : n.op == Op::kDrafts ? drafts
                                            : chunk_rows);
      continue;
    }
    if (n.op == Op::kNeg) {
      if (stack.back() == std::numeric_limits<std::int64_t>::min()) {
        throw Error(ErrorId::kUsage, flag_, "integer overflow" + where());
      }
      stack.back() = -stack.back();
      continue;
    }
    const std::int64_t b = stack.back();
    stack.pop_back();
    const std::int64_t a = stack.back();
    std::int64_t r = 0;
    bool overflow = false;
    switch (n.op) {
      case Op::kAdd: overflow = __builtin_add_overflow(a, b, &r); break;
      case Op::kSub: overflow = __builtin_sub_overflow(a, b, &r); break;
      case Op::kMul: overflow = __builtin_mul_overflow(a, b, &r); break;
      case Op::kDiv:
        if (b == 0) throw Error(ErrorId::kUsage, flag_, "division by zero" + where());
        if (a == std::numeric_limits<std::int64_t>::min() && b == -1) {
          overflow = true;
          break;
        }
        // Floor division: C++ truncates toward zero, step down when the signs differ.
        r = a / b;
        if ((a % b != 0) && ((a < 0) != (b < 0))) --r;
        break;
      case Op::kMax: r = a > b ? a : b; break;
      case Op::kMin: r = a < b ? a : b; break;
      default: break;
    }
    if (overflow) throw Error(ErrorId::kUsage, flag_, "integer overflow" + where());
    stack.back() = r;
  }
  return stack.back();
}

}  // namespace kvcheck::sweep
