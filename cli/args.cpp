#include "cli/args.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
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

/// Edits (insert, delete, replace) that turn `a` into `b`.
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

/// " (did you mean NAME?)" for the nearest of `names`, or "".
std::string suggestion(const std::string& word, const std::vector<std::string>& names) {
  const std::string near = closest_name(word, names);
  return near.empty() ? std::string() : "; did you mean " + near + "?";
}

}  // namespace

std::string closest_name(const std::string& word, const std::vector<std::string>& names) {
  const std::size_t letters = word.size() - std::min<std::size_t>(word.find_first_not_of('-'), word.size());
  const std::size_t most = letters <= 4 ? 1 : 2;
  std::string best;
  std::size_t best_distance = most + 1;
  bool tie = false;
  for (const std::string& name : names) {
    const std::size_t d = edit_distance(word, name);
    if (d < best_distance) {
      best = name;
      best_distance = d;
      tie = false;
    } else if (d == best_distance) {
      tie = true;
    }
  }
  if (!best.empty() && !tie) return best;
  if (letters < 4) return "";
  std::string only;
  for (const std::string& name : names) {
    if (name.rfind(word, 0) != 0) continue;
    if (!only.empty()) return "";
    only = name;
  }
  return only;
}

// CLI11 does the matching (`--flag value`, `--flag=value`, boolean flags,
// arguments in any order); what it accepts that kvcheck does not (a flag
// given twice, a value for a boolean flag, an unknown flag) and every parse
// error becomes one kvcheck::Error(kUsage) naming the flag, so the one-line
// `kvcheck error 100 at FLAG: ...` form and exit 2 hold for every command.
Args::Args(int argc, char** argv, int first, const std::set<std::string>& value_flags,
           const std::set<std::string>& bool_flags) {
  std::vector<std::string> tokens;
  for (int i = argc - 1; i >= first; --i) tokens.emplace_back(argv[i]);  // CLI11 takes them reversed
  // `--impl exec:python3 adapter.py --bug x`: the words after an exec
  // command, up to the next flag of the command, were meant to be part of it.
  for (int i = first; i < argc; ++i) {
    const std::string t = argv[i];
    std::string command;
    if (t == "--impl" && i + 1 < argc && std::string(argv[i + 1]).rfind("exec:", 0) == 0) {
      command = argv[++i];
    } else if (t.rfind("--impl=exec:", 0) == 0) {
      command = t.substr(7);
    } else {
      continue;
    }
    for (int j = i + 1; j < argc; ++j) {
      const std::string w = argv[j];
      const std::string flag = w.substr(0, w.find('='));
      if (value_flags.count(flag) || bool_flags.count(flag)) break;
      impl_tail_.push_back(w);
    }
    if (impl_tail_.empty()) break;
    for (const auto& w : impl_tail_) command += " " + w;
    std::string quoted = "'";
    for (const char c : command) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    quoted_impl_ = "--impl " + quoted + "'";
    break;
  }
  const std::string unquoted_hint =
      quoted_impl_.empty() ? std::string()
                           : " (the adapter command looks unquoted: give it as one argument, " + quoted_impl_ + ")";
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
  std::vector<std::string> known(value_flags.begin(), value_flags.end());
  known.insert(known.end(), bool_flags.begin(), bool_flags.end());
  for (const auto& a : app.remaining()) {
    if (a.rfind("--", 0) == 0 && a != "--") {
      const std::string flag = a.substr(0, a.find('='));
      if (!unquoted_hint.empty()) throw Error(ErrorId::kUsage, flag, "unknown flag for this command" + unquoted_hint);
      const std::string hint = flag == "--exec" && value_flags.count("--impl")
                                   ? std::string("; an adapter is given as --impl 'exec:COMMAND ARGS'")
                                   : suggestion(flag, known);
      throw Error(ErrorId::kUsage, flag, "unknown flag for this command (see `kvcheck help`)" + hint);
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
  if (positional_.empty()) return;
  const std::string& first = positional_.front();
  if (!impl_tail_.empty()) {
    throw Error(ErrorId::kUsage, first,
                command + " takes no positional arguments: the adapter command looks unquoted; give it as one "
                          "argument: " + quoted_impl_);
  }
  if (first.size() > 1 && first[0] == '-') {
    throw Error(ErrorId::kUsage, first,
                command + " takes no positional arguments, and kvcheck's flags are long ones (`kvcheck " +
                    command + " --help` lists them)");
  }
  throw Error(ErrorId::kUsage, first, command + " takes no positional arguments");
}

int precision_flag(const Args& args) {
  const auto bits = args.integer("--precision", 113, 1, 1024);
  if (bits != 53 && bits != 113 && bits != 169) {
    throw Error(ErrorId::kUsage, "--precision", "must be 53, 113 (default) or 169 bits");
  }
  return static_cast<int>(bits);
}

}  // namespace kvcheck::cli
