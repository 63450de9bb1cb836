#include "properties/option_table.hpp"

#include <algorithm>
#include <cstdio>
#include <initializer_list>
#include <cstdlib>

#include "support/assert.hpp"

namespace kvcheck::properties {

std::set<std::string> option_flags(unsigned commands) {
  std::set<std::string> flags;
  for (const OptionRow& row : kCheckOptions) {
    if ((row.commands & commands) == commands) flags.emplace(row.flag);
  }
  return flags;
}

std::set<std::string> option_flags(unsigned commands, bool bool_flags) {
  std::set<std::string> flags;
  for (const OptionRow& row : kCheckOptions) {
    if ((row.commands & commands) == commands && row.value.empty() == bool_flags) flags.emplace(row.flag);
  }
  return flags;
}

const OptionRow& option_row(CheckOption id) {
  const auto index = static_cast<std::size_t>(id);
  KVCHECK_ASSERT(index < std::size(kCheckOptions) && kCheckOptions[index].id == id);
  return kCheckOptions[index];
}

std::string decimal_text(double value) {
  // Fixed notation with the fewest decimals that read back exactly: "10",
  // "2.5", "0.1" (never an exponent, which the flags refuse).
  char text[512];
  for (int decimals = 0; decimals <= 340; ++decimals) {
    std::snprintf(text, sizeof text, "%.*f", decimals, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  return text;
}

std::optional<std::string> option_text(CheckOption id, const CheckOptions& options) {
  switch (id) {
    case CheckOption::kImpl:
      return shell_quote(options.run.backend);
    case CheckOption::kFault:
      return options.run.fault;
    case CheckOption::kAgainst:
      return options.run.against.empty() ? std::string("none") : shell_quote(options.run.against);
    case CheckOption::kBitwise:
      return std::string(options.run.bitwise ? "on" : "off");
    case CheckOption::kRepeatBitwise:
      return std::string(options.run.repeat_bitwise ? "on" : "off");
    case CheckOption::kPrecision:
      return std::to_string(options.run.precision_bits);
    case CheckOption::kStepTimeout:
      return decimal_text(options.run.step_timeout_seconds);
    case CheckOption::kReference:
      return std::string(options.run.reference == Reference::kMpfr ? "mpfr" : "certified");
    case CheckOption::kExecEncoding:
      return std::string(engines::exec_encoding_name(options.run.exec_encoding));
    case CheckOption::kCases:
      return std::to_string(options.cases);
    case CheckOption::kSeed:
      return std::to_string(options.seed);
    case CheckOption::kCaseSeed:
      // "none" when every case has its own seed: compared, never printed
      // (a run without --case-seed leaves it at its default).
      return options.only_case_seed ? std::to_string(*options.only_case_seed) : std::string("none");
    case CheckOption::kProfile:
      return profile_name(options.profile);
    case CheckOption::kMinRunShare:
      return decimal_text(options.min_run_share);
    case CheckOption::kNoCoverageGate:
      return std::string(options.coverage_gate ? "on" : "off");
    case CheckOption::kMaxFailures: return std::to_string(options.max_failures);
    case CheckOption::kThreads:
      return std::to_string(options.threads);
    case CheckOption::kMemoryLimit:
    case CheckOption::kWorkLimit:
    case CheckOption::kRecord:
    case CheckOption::kShard:
    case CheckOption::kOut:
    case CheckOption::kReport:
    case CheckOption::kJunit:
    case CheckOption::kHtml:
      return std::nullopt;
  }
  return std::nullopt;
}

namespace {

/// "FLAG VALUE" of every row of `command` for which `wanted` holds, in
/// table order: rows in `always` whatever their value, the rest where
/// `given` differs from the default.
std::string arguments(const CheckOptions& given, unsigned command, bool (*wanted)(const OptionRow&),
                      std::initializer_list<CheckOption> always) {
  const CheckOptions defaults;
  std::string out;
  for (const OptionRow& row : kCheckOptions) {
    if (!(row.commands & command) || !wanted(row)) continue;
    const auto text = option_text(row.id, given);
    const bool named = std::find(always.begin(), always.end(), row.id) != always.end();
    if (!named && text == option_text(row.id, defaults)) continue;
    if (!out.empty()) out += " ";
    // A boolean flag is given or not: the flag alone.
    out += row.value.empty() ? std::string(row.flag) : std::string(row.flag) + " " + *text;
  }
  return out;
}

}  // namespace

std::string replay_arguments(const RunOptions& run) {
  CheckOptions given;
  given.run = run;
  // The cache is always named; the rest only where the run left the default.
  return arguments(
      given, kForReplay, [](const OptionRow& row) { return row.effect == OptionEffect::kRun; },
      {CheckOption::kImpl});
}

std::string case_arguments(const CheckOptions& options) {
  return arguments(
      options, kForCheck,
      [](const OptionRow& row) {
        return row.id != CheckOption::kCases &&
               (row.effect == OptionEffect::kRun || row.effect == OptionEffect::kCases);
      },
      {CheckOption::kImpl, CheckOption::kSeed});
}

}  // namespace kvcheck::properties
