#include "cli/args.hpp"

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdlib>

#include "support/error.hpp"

namespace kvcheck::cli {

namespace {

/// The flag a CLI11 parse error is about: its message names it first
/// ("--cases: 1 required TEXT missing") or last ("...not expected: --out").
std::string flag_of(const CLI::ParseError& e, const std::string& fallback) {
  const std::string what = e.what();
  const auto dash = what.find("--");
  if (dash == std::string::npos) return fallback;
  const auto stop = what.find_first_of(": ,=", dash);
  return what.substr(dash, stop == std::string::npos ? std::string::npos : stop - dash);
}

}  // namespace

// CLI11 does the matching (`--flag value`, `--flag=value`, boolean flags,
// arguments in any order); what it accepts that kvcheck does not (a flag
// given twice, a value for a boolean flag, an unknown flag) and every parse
// error becomes one kvcheck::Error(kUsage) naming the flag, so the one-line
// `kvcheck error 100 at FLAG: ...` form and exit 2 hold for every command.
Args::Args(int argc, char** argv, int first, const std::set<std::string>& value_flags,
           const std::set<std::string>& bool_flags) {
  std::vector<std::string> tokens;
  for (int i = argc - 1; i >= first; --i) tokens.emplace_back(argv[i]);  // CLI11 takes them reversed
  // A value for a boolean flag, which CLI11 would read as true/false.
  for (const auto& t : tokens) {
    const auto eq = t.find('=');
    if (t.rfind("--", 0) == 0 && eq != std::string::npos && bool_flags.count(t.substr(0, eq))) {
      throw Error(ErrorId::kUsage, t.substr(0, eq), "takes no value");
    }
  }
  CLI::App app{"kvcheck"};
  app.set_help_flag();  // each command prints its own usage (main.cpp)
  app.allow_extras();   // positional arguments and unknown flags: judged below
  app.positionals_at_end(false);
  std::map<std::string, std::vector<std::string>> given;
  std::map<std::string, CLI::Option*> options;
  for (const auto& f : value_flags) {
    options[f] = app.add_option(f, given[f])
                     ->expected(1)
                     ->allow_extra_args(false)
                     ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  }
  for (const auto& f : bool_flags) options[f] = app.add_flag(f);
  try {
    app.parse(tokens);
  } catch (const CLI::ParseError& e) {
    const std::string flag = flag_of(e, tokens.empty() ? std::string("arguments") : tokens.back());
    const bool missing = dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr;
    throw Error(ErrorId::kUsage, flag, missing ? "needs a value" : e.what());
  }
  for (const auto& f : value_flags) {
    const auto& v = given[f];
    if (v.size() > 1) throw Error(ErrorId::kUsage, f, "given twice");
    if (v.size() == 1) values_[f] = v.front();
  }
  for (const auto& f : bool_flags) {
    if (options[f]->count() > 1) throw Error(ErrorId::kUsage, f, "given twice");
    if (options[f]->count() == 1) bools_.insert(f);
  }
  for (const auto& a : app.remaining()) {
    if (a.rfind("--", 0) == 0 && a != "--") {
      throw Error(ErrorId::kUsage, a.substr(0, a.find('=')),
                  "unknown flag for this command (see `kvcheck help`)");
    }
    positional_.push_back(a);
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
  // Decimal digits with an optional leading '-', nothing else: strtoll alone
  // would also take leading blanks and a '+'.
  const std::size_t first_digit = text[0] == '-' ? 1 : 0;
  if (first_digit == text.size() || text.find_first_not_of("0123456789", first_digit) != std::string::npos) {
    throw Error(ErrorId::kUsage, flag, "expects a decimal integer, got '" + text + "'");
  }
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
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

std::vector<std::int64_t> Args::integers(const std::string& flag, std::int64_t lo, std::int64_t hi) const {
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
  // Decimal only, DIGITS[.DIGITS] or .DIGITS: strtod alone would also read
  // "0x10" as 16, "1e3", "inf" and leading blanks.
  const std::string& t = *text;
  const std::size_t dot = t.find('.');
  const std::string whole = t.substr(0, dot);
  const std::string fraction = dot == std::string::npos ? std::string() : t.substr(dot + 1);
  const bool decimal =
      !t.empty() && t.size() <= 32 && whole.find_first_not_of("0123456789") == std::string::npos &&
      fraction.find_first_not_of("0123456789") == std::string::npos &&
      (!whole.empty() || !fraction.empty()) && (dot == std::string::npos || !fraction.empty());
  char* end = nullptr;
  const double v = decimal ? std::strtod(t.c_str(), &end) : 0;
  if (!decimal || !(v > 0) || v > hi) {
    throw Error(ErrorId::kUsage, flag,
                "expects decimal seconds in (0, " + std::to_string(static_cast<long long>(hi)) + "], got '" +
                    *text + "'");
  }
  return v;
}

std::optional<ShardFlag> Args::shard(const std::string& flag) const {
  const auto text = get(flag);
  if (!text) return std::nullopt;
  const auto slash = text->find('/');
  if (slash == std::string::npos)
    throw Error(ErrorId::kUsage, flag, "expects I/N (shard I of N, 0 <= I < N), got '" + *text + "'");
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

int precision_flag(const Args& args) {
  const auto bits = args.integer("--precision", 113, 1, 1024);
  if (bits != 53 && bits != 113 && bits != 169) {
    throw Error(ErrorId::kUsage, "--precision", "must be 53, 113 (default) or 169 bits");
  }
  return static_cast<int>(bits);
}

}  // namespace kvcheck::cli
