// The option table of check and replay (properties/option_table.hpp): the
// replay command it writes, the values it prints, and the rules its rows
// keep (an option that changes a result is recorded, in the command line
// and in a check shard's document).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <set>
#include <string>

#include "properties/option_table.hpp"

namespace p = kvcheck::properties;

TEST_CASE("Option table: the replay command carries every run option other than its default") {
  p::RunOptions run;
  CHECK(p::replay_arguments(run) == "--impl cpu");
  run.backend = "exec:python3 adapters/ring_cache.py --bug window-plus-one";
  run.fault = "window-too-wide";
  run.precision_bits = 53;
  run.step_timeout_seconds = 2.5;
  run.reference = p::Reference::kMpfr;  // never changes a result: not carried
  CHECK(p::replay_arguments(run) ==
        "--impl 'exec:python3 adapters/ring_cache.py --bug window-plus-one' --fault window-too-wide "
        "--precision 53 --step-timeout 2.5");
  run = p::RunOptions{};
  run.precision_bits = 169;
  CHECK(p::replay_arguments(run) == "--impl cpu --precision 169");
  // Two caches side by side: the second cache quoted, a boolean flag alone.
  run = p::RunOptions{};
  run.against = "exec:python3 adapters/paged_cache.py --bug free-early";
  run.bitwise = true;
  CHECK(p::replay_arguments(run) ==
        "--impl cpu --against 'exec:python3 adapters/paged_cache.py --bug free-early' --bitwise");
  run = p::RunOptions{};
  run.repeat_bitwise = true;
  CHECK(p::replay_arguments(run) == "--impl cpu --repeat-bitwise");
}

TEST_CASE("Option table: the check a case came from names what draws and runs it, not the case count") {
  p::CheckOptions options;
  options.seed = 7;
  options.cases = 50;
  CHECK(p::case_arguments(options) == "--impl cpu --seed 7");
  options.run.fault = "window-too-wide";
  options.run.precision_bits = 53;
  options.profile = p::Profile::kProduction;
  options.min_run_share = 0.5;  // the check's gate, not how a case runs
  options.threads = 1;
  CHECK(p::case_arguments(options) ==
        "--impl cpu --fault window-too-wide --precision 53 --seed 7 --profile production");
}

TEST_CASE("Option table: seconds and shares print as the flags read them, exactly") {
  for (const double v : {10.0, 2.5, 0.1, 1e-7, 86400.0, 1.0 / 3, 0.8, 0.0, 1.0}) {
    const std::string text = p::decimal_text(v);
    INFO(text);
    CHECK(text.find_first_not_of("0123456789.") == std::string::npos);
    CHECK(std::strtod(text.c_str(), nullptr) == v);
  }
  CHECK(p::decimal_text(10.0) == "10");
  CHECK(p::decimal_text(0.1) == "0.1");
}

TEST_CASE("Option table: every option that changes a result is recorded, and a shard keeps it") {
  std::set<std::string_view> flags, keys;
  for (const p::OptionRow& row : p::kCheckOptions) {
    INFO(row.flag);
    CHECK(&p::option_row(row.id) == &row);
    CHECK(flags.insert(row.flag).second);
    CHECK(row.commands & (p::kForCheck | p::kForReplay));
    if (row.effect != p::OptionEffect::kNothing) {
      CHECK(row.commands & p::kRecorded);
      // A check shard records what `kvcheck merge` must compare.
      if (row.commands & p::kForCheck) CHECK_FALSE(row.shard_key.empty());
      CHECK(p::option_text(row.id, p::CheckOptions{}).has_value());
    }
    if (!row.shard_key.empty()) CHECK(keys.insert(row.shard_key).second);
  }
  // The flags of each command come from the table.
  CHECK(p::option_flags(p::kForReplay).count("--precision") == 1);
  CHECK(p::option_flags(p::kForReplay).count("--cases") == 0);
  CHECK(p::option_flags(p::kForCheck).count("--step-timeout") == 1);
  CHECK(p::option_flags(p::kForCheck | p::kRecorded).count("--threads") == 0);
}
