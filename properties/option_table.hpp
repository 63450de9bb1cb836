// The options of `kvcheck check` and `kvcheck replay`, listed once: each
// option's flag, the commands that take it, what it changes, and the key its
// value has in a check shard's document. From this table the CLI registers
// the flags of check and replay (cli/commands.cpp) and reads a shard's
// recorded command line back (cli/merge_command.cpp), the replay command a
// failing check prints is written (replay_arguments), and the options a
// shard document must record are known (shard_key).
//
// A new option is one row here, one case in option_text() and one in the
// CLI's reader (both switches cover every row: -Wswitch makes a missing one
// a build error). An option that changes a verdict and that replay takes
// appears in every printed replay command whose run gave it a value other
// than its default, so the command reproduces the run exactly.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "properties/check.hpp"

namespace kvcheck::properties {

// An option whose value is "" in the table is a boolean flag (given or not).

/// Which commands take an option (bits).
enum OptionCommands : unsigned {
  kForCheck = 1u,   ///< `kvcheck check`
  kForReplay = 2u,  ///< `kvcheck replay`
  /// Recorded: the command line a report (and a check shard) records keeps
  /// it; options that never change a result (where files go, how many
  /// threads or shards ran, how the reference was computed) are left out, so
  /// the report of a run does not depend on them.
  kRecorded = 4u,
};

/// What an option changes.
enum class OptionEffect : std::uint8_t {
  kNothing,  ///< no result: where files go, threads, shards, memory, how the reference is computed
  kRun,      ///< the outcome of one scenario's run: the cache, its fault, the reference's precision, timeouts
  kCases,    ///< which cases a check draws
  kVerdict,  ///< the check's verdict over its cases (gates), not any one run
};

// X(id, flag, value, commands, effect, shard_key): shard_key is the field of
// a check shard document's "options" that records the option ("" when a
// shard records none). Rows in the order the replay command and the usage
// text list them.
#define KVCHECK_CHECK_OPTIONS(X)                                                                           \
  X(kImpl, "--impl", "IMPL", kForCheck | kForReplay | kRecorded, kRun, "impl")                             \
  X(kFault, "--fault", "NAME", kForCheck | kForReplay | kRecorded, kRun, "fault")                          \
  X(kAgainst, "--against", "IMPL", kForCheck | kForReplay | kRecorded, kRun, "against")                    \
  X(kBitwise, "--bitwise", "", kForCheck | kForReplay | kRecorded, kRun, "bitwise")                        \
  X(kRepeatBitwise, "--repeat-bitwise", "", kForCheck | kForReplay | kRecorded, kRun, "repeat_bitwise")    \
  X(kPrecision, "--precision", "53|113|169", kForCheck | kForReplay | kRecorded, kRun,                     \
    "precision_requested")                                                                                 \
  X(kStepTimeout, "--step-timeout", "S", kForCheck | kForReplay | kRecorded, kRun, "step_timeout_seconds") \
  X(kReference, "--reference", "certified|mpfr", kForCheck | kForReplay, kNothing, "")                     \
  X(kExecEncoding, "--exec-encoding", "json|binary", kForCheck | kForReplay, kNothing, "")                 \
  X(kCases, "--cases", "N", kForCheck | kRecorded, kCases, "cases")                                        \
  X(kSeed, "--seed", "X", kForCheck | kRecorded, kCases, "seed")                                           \
  X(kCaseSeed, "--case-seed", "X", kForCheck | kRecorded, kCases, "case_seed")                             \
  X(kProfile, "--profile", "default|production|trim|paged|layers|prefix", kForCheck | kRecorded, kCases,   \
    "profile")                                                                                             \
  X(kMinRunShare, "--min-run-share", "F", kForCheck | kRecorded, kVerdict, "min_run_share")                \
  X(kNoCoverageGate, "--no-coverage-gate", "", kForCheck | kRecorded, kVerdict, "coverage_gate")           \
  X(kMaxFailures, "--max-failures", "N", kForCheck | kRecorded, kVerdict, "max_failures")                  \
  X(kMemoryLimit, "--memory-limit", "BYTES", kForCheck | kForReplay | kRecorded, kNothing, "")             \
  X(kWorkLimit, "--work-limit", "ROWS", kForCheck | kForReplay | kRecorded, kNothing, "")                  \
  X(kRecord, "--record", "TRACE", kForCheck | kForReplay | kRecorded, kNothing, "")                        \
  X(kThreads, "--threads", "T", kForCheck, kNothing, "")                                                   \
  X(kShard, "--shard", "I/N", kForCheck, kNothing, "")                                                     \
  X(kOut, "--out", "DIR", kForCheck, kNothing, "")                                                         \
  X(kReport, "--report", "FILE", kForReplay | kRecorded, kNothing, "")                                     \
  X(kJunit, "--junit", "FILE", kForReplay | kRecorded, kNothing, "")                                       \
  X(kHtml, "--html", "FILE", kForReplay | kRecorded, kNothing, "")

/// One option of check or replay.
enum class CheckOption : std::uint8_t {
#define KVCHECK_OPTION_ID(id, flag, value, commands, effect, shard_key) id,
  KVCHECK_CHECK_OPTIONS(KVCHECK_OPTION_ID)
#undef KVCHECK_OPTION_ID
};

/// One row of KVCHECK_CHECK_OPTIONS.
struct OptionRow {
  CheckOption id;
  std::string_view flag;       ///< "--precision"
  std::string_view value;      ///< what the usage text shows as its value
  unsigned commands;           ///< OptionCommands bits
  OptionEffect effect;         ///< what it changes
  std::string_view shard_key;  ///< its field in a check shard's options; "" when none
};

/// Every row, in table order.
inline constexpr OptionRow kCheckOptions[] = {
#define KVCHECK_OPTION_ROW(id, flag, value, commands, effect, shard_key) \
  {CheckOption::id, flag, value, commands, OptionEffect::effect, shard_key},
    KVCHECK_CHECK_OPTIONS(KVCHECK_OPTION_ROW)
#undef KVCHECK_OPTION_ROW
};

/// The flags of the options whose commands include every bit of `commands`
/// (kForCheck: what `kvcheck check` takes; kForCheck | kRecorded: what a
/// check's recorded command line may hold).
std::set<std::string> option_flags(unsigned commands);
/// Of those, the boolean flags (an empty value in the table), or the ones
/// that take a value: `bool_flags` false.
std::set<std::string> option_flags(unsigned commands, bool bool_flags);

/// The row of `id`.
const OptionRow& option_row(CheckOption id);

/// The value `options` gives the option, as its flag takes it (quoted for a
/// POSIX shell where needed; read back by the CLI it is the same value):
/// "--precision 169" has "169". nullopt for an option CheckOptions does not
/// hold (where files go, --shard, --memory-limit: the command reads them).
std::optional<std::string> option_text(CheckOption id, const CheckOptions& options);

/// `seconds` (or a fraction) as the shortest decimal DIGITS[.DIGITS] that
/// reads back as the same double: the form `--step-timeout` and
/// `--min-run-share` take (no exponent).
std::string decimal_text(double value);

/// The options that select the same run of one scenario, as replay takes
/// them: "--impl NAME" and then, in table order, every option replay takes
/// that changes a run (OptionEffect::kRun) and that `run` sets to other
/// than its default ("--fault F", "--against B", "--precision B",
/// "--step-timeout S"; a boolean flag as the flag alone),
/// quoted for a shell. The replay command a failing check prints.
std::string replay_arguments(const RunOptions& run);

/// The options of `kvcheck check` that draw the same cases and run them
/// the same way: "--impl NAME", then every check option that changes a run
/// or which cases are drawn (OptionEffect::kRun, kCases) other than its
/// default, "--seed" always, "--cases" never (a case's seed does not depend
/// on how many cases run). The check a counterexample's description names.
std::string case_arguments(const CheckOptions& options);

}  // namespace kvcheck::properties
