#include "cli/args.hpp"

#include <cerrno>
#include <cstdlib>

#include "support/error.hpp"

namespace kvcheck::cli {

Args::Args(int argc, char** argv, int first, const std::set<std::string>& value_flags,
           const std::set<std::string>& bool_flags) {
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || a == "--") {
      positional_.push_back(a);
      continue;
    }
    std::optional<std::string> inline_value;
    if (const auto eq = a.find('='); eq != std::string::npos) {
      inline_value = a.substr(eq + 1);
      a = a.substr(0, eq);
    }
    if (value_flags.count(a)) {
      if (!inline_value) {
        if (i + 1 >= argc) throw Error(ErrorId::kUsage, a, "needs a value");
        inline_value = argv[++i];
      }
      if (values_.count(a)) throw Error(ErrorId::kUsage, a, "given twice");
      values_[a] = *inline_value;
    } else if (bool_flags.count(a) && !inline_value) {
      bools_.insert(a);
    } else {
      throw Error(ErrorId::kUsage, a, "unknown flag for this command (see `kvcheck help`)");
    }
  }
}

std::optional<std::string> Args::get(const std::string& flag) const {
  const auto it = values_.find(flag);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Args::get_or(const std::string& flag, const std::string& fallback) const {
  return get(flag).value_or(fallback);
}

std::int64_t parse_integer(const std::string& flag, const std::string& text, std::int64_t lo,
                           std::int64_t hi) {
  if (text.empty()) throw Error(ErrorId::kUsage, flag, "expects an integer, got an empty value");
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (*end != '\0') throw Error(ErrorId::kUsage, flag, "expects an integer, got '" + text + "'");
  if (errno == ERANGE || v < lo || v > hi) {
    throw Error(ErrorId::kUsage, flag,
                "must be in " + std::to_string(lo) + ".." + std::to_string(hi) + ", got " + text);
  }
  return v;
}

std::int64_t Args::integer(const std::string& flag, std::int64_t fallback, std::int64_t lo,
                           std::int64_t hi) const {
  const auto v = get(flag);
  return v ? parse_integer(flag, *v, lo, hi) : fallback;
}

std::vector<std::int64_t> Args::integers(const std::string& flag, std::int64_t lo,
                                         std::int64_t hi) const {
  std::vector<std::int64_t> out;
  const auto v = get(flag);
  if (!v) return out;
  std::size_t start = 0;
  while (start <= v->size()) {
    const auto comma = v->find(',', start);
    const std::string item = v->substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    out.push_back(parse_integer(flag, item, lo, hi));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

double Args::seconds(const std::string& flag, double fallback, double hi) const {
  const auto text = get(flag);
  if (!text) return fallback;
  char* end = nullptr;
  const double v = std::strtod(text->c_str(), &end);
  if (end == text->c_str() || *end != '\0' || !(v > 0) || v > hi) {
    throw Error(ErrorId::kUsage, flag, "expects seconds in (0, " + std::to_string(static_cast<long long>(hi)) +
                                           "], got '" + *text + "'");
  }
  return v;
}

std::optional<ShardFlag> Args::shard(const std::string& flag) const {
  const auto text = get(flag);
  if (!text) return std::nullopt;
  const auto slash = text->find('/');
  if (slash == std::string::npos) throw Error(ErrorId::kUsage, flag, "expects I/N (shard I of N, 0 <= I < N), got '" + *text + "'");
  ShardFlag s;
  s.count = parse_integer(flag, text->substr(slash + 1), 1, 1000000);
  s.index = parse_integer(flag, text->substr(0, slash), 0, s.count - 1);
  return s;
}

void Args::no_positional(const std::string& command) const {
  if (!positional_.empty()) {
    throw Error(ErrorId::kUsage, positional_.front(), command + " takes no positional arguments");
  }
}

}  // namespace kvcheck::cli
