// The strict command-line reading of every subcommand, over CLI11:
// `--flag value`, `--flag=value`, boolean `--flag`, and positional
// arguments. Unknown flags, a flag given twice and malformed values throw
// kvcheck::Error (kUsage) naming the flag.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace kvcheck::cli {

/// `--shard I/N`: run the I-th of N shards (0 <= I < N).
struct ShardFlag {
  std::int64_t index = 0;
  std::int64_t count = 1;
};

/// Parsed arguments of one subcommand.
class Args {
 public:
  /// Parses argv[first..argc). `value_flags` take a value, `bool_flags` do not.
  Args(int argc, char** argv, int first, const std::set<std::string>& value_flags,
       const std::set<std::string>& bool_flags);

  bool has(const std::string& flag) const { return values_.count(flag) || bools_.count(flag); }
  std::optional<std::string> get(const std::string& flag) const;
  std::string get_or(const std::string& flag, const std::string& fallback) const;
  /// Decimal integer value in [lo, hi] (no sign but '-', no blanks, no
  /// 0x); throws naming the flag otherwise.
  std::int64_t integer(const std::string& flag, std::int64_t fallback, std::int64_t lo,
                       std::int64_t hi) const;
  /// Decimal seconds in (0, hi] (DIGITS[.DIGITS], no exponent, no hex, no
  /// inf); throws naming the flag otherwise.
  double seconds(const std::string& flag, double fallback, double hi) const;
  /// Comma-separated integers in [lo, hi].
  std::vector<std::int64_t> integers(const std::string& flag, std::int64_t lo, std::int64_t hi) const;
  /// `flag` as I/N (N in 1..1000000, I in 0..N-1); nullopt when absent.
  std::optional<ShardFlag> shard(const std::string& flag) const;
  const std::vector<std::string>& positional() const { return positional_; }
  /// Throws naming the first stray positional argument when there is one.
  void no_positional(const std::string& command) const;

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> bools_;
  std::vector<std::string> positional_;
  /// The words after an exec --impl value up to the next flag the command
  /// takes: an adapter command that was not quoted whole.
  std::vector<std::string> impl_tail_;
  /// "--impl 'exec:...'" with impl_tail_ joined in (empty when impl_tail_ is).
  std::string quoted_impl_;
};

/// The one name of `names` that `word` most likely misspells: within two
/// edits (one for words of four letters or fewer), or the only name that
/// begins with `word` (four letters or more); "" when there is none or no
/// single nearest one. What "did you mean" suggests for flags and commands.
std::string closest_name(const std::string& word, const std::vector<std::string>& names);

/// Parses one decimal integer for `flag`, in [lo, hi].
std::int64_t parse_integer(const std::string& flag, const std::string& text, std::int64_t lo,
                           std::int64_t hi);

/// --precision: the reference's requested precision, 53, 113 (default) or
/// 169 bits (check, replay and audit).
int precision_flag(const Args& args);

}  // namespace kvcheck::cli
