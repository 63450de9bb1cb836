// A user's ring-sizing rule as an integer expression in W (window rows),
// k (drafts) and C (prefill chunk rows), for `kvcheck sweep --formula`; for a
// paged cache a pool in blocks, with B (rows per block) as a fourth name.
//
// Grammar (whitespace ignored):
//   expr    := term (('+' | '-') term)*
//   term    := unary (('*' | '/') unary)*
//   unary   := '-' unary | primary
//   primary := integer | 'W' | 'k' | 'C' | 'B' | ('max' | 'min') '(' expr ',' expr ')' | '(' expr ')'
// Arithmetic is on int64 and checked: overflow and division by zero are
// errors, never wrapped values. '/' rounds toward negative infinity.
// Every error is a kvcheck::Error (kUsage) naming the flag and the column.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvcheck::sweep {

/// A parsed sizing formula; cheap to copy and safe to evaluate from several threads.
class Formula {
 public:
  /// Parses `text`; throws kvcheck::Error(kUsage, flag, ...) with the column at fault.
  static Formula parse(std::string_view text, const std::string& flag = "--formula");

  /// Value at (W, k, C) and, for a paged cache, B = `block_size` (0: not
  /// paged, and a formula naming B is an error). Throws
  /// kvcheck::Error(kUsage, flag, ...) on overflow or division by zero, naming
  /// the configuration.
  std::int64_t evaluate(std::int64_t window_keys, std::int64_t drafts, std::int64_t chunk_rows,
                        std::int64_t block_size = 0) const;

  /// The text as the user wrote it.
  const std::string& text() const noexcept { return text_; }

 private:
  /// One node of the expression tree, stored in post-order in nodes_.
  enum class Op : std::uint8_t {
    kLiteral,
    kWindow,
    kDrafts,
    kChunk,
    kBlock,
    kNeg,
    kAdd,
    kSub,
    kMul,
    kDiv,
    kMax,
    kMin
  };
  struct Node {
    Op op = Op::kLiteral;
    std::int64_t value = 0;  ///< literal value
  };
  friend class FormulaParser;

  std::string text_;
  std::string flag_;
  std::vector<Node> nodes_;  ///< reverse Polish: evaluated with a small stack
};

}  // namespace kvcheck::sweep
