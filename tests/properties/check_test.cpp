// A check split into shards (run_cases per shard, merge_tallies,
// finish_check) gives exactly run_check's result: the same counts, coverage,
// lowest failing case and shrunk counterexample, whatever the shard count.
#include <catch2/catch.hpp>

#include "properties/check.hpp"
#include "scenarios/scenario_json.hpp"

using namespace kvcheck;

namespace {

properties::CheckOptions faulted_options() {
  properties::CheckOptions options;
  options.cases = 120;
  options.seed = 5;
  options.threads = 2;
  options.run.fault = impl::Fault::kAcceptNoRollback;
  return options;
}

properties::CheckResult split_run(properties::CheckOptions options, std::int64_t shards) {
  std::vector<properties::CaseTally> tallies;
  for (std::int64_t i = 0; i < shards; ++i) {
    options.shard = {i, shards};
    tallies.push_back(properties::run_cases(options));
  }
  return properties::finish_check(options, properties::merge_tallies(tallies));
}

}  // namespace

TEST_CASE("Check: shards I mod N merged give run_check's result, counterexample included") {
  const properties::CheckOptions options = faulted_options();
  const properties::CheckResult whole = properties::run_check(options);
  REQUIRE(whole.found_failure);
  for (const std::int64_t shards : {1, 2, 3, 7, 121}) {
    INFO("shards " << shards);
    const properties::CheckResult split = split_run(options, shards);
    CHECK(split.cases == whole.cases);
    CHECK(split.failures == whole.failures);
    CHECK(split.coverage_counts == whole.coverage_counts);
    CHECK(split.failing_case_seed == whole.failing_case_seed);
    CHECK(split.shrink_runs == whole.shrink_runs);
    CHECK(scenarios::save_scenario(split.shrunk) == scenarios::save_scenario(whole.shrunk));
    CHECK(split.shrunk_run.first_failure == whole.shrunk_run.first_failure);
  }
}

TEST_CASE("Check: a shard runs exactly the cases index = I mod N, and its lowest failing one") {
  properties::CheckOptions options = faulted_options();
  std::int64_t total = 0, lowest = -1;
  for (std::int64_t i = 0; i < 7; ++i) {
    options.shard = {i, 7};
    const properties::CaseTally t = properties::run_cases(options);
    CHECK(t.cases == (i < 120 % 7 ? 120 / 7 + 1 : 120 / 7));
    if (t.first_failing_case >= 0) {
      CHECK(t.first_failing_case % 7 == i);
      if (lowest < 0 || t.first_failing_case < lowest) lowest = t.first_failing_case;
    }
    total += t.cases;
  }
  CHECK(total == 120);
  options.shard = {};
  CHECK(properties::run_cases(options).first_failing_case == lowest);
}

TEST_CASE("Check: a run with no failure merges without making a cache provider") {
  properties::CheckOptions options;
  options.cases = 40;
  options.seed = 3;
  int made = 0;
  options.provider_factory = [&made] {
    ++made;
    properties::RunOptions run;
    return properties::make_provider(run);
  };
  options.shard = {1, 2};
  const properties::CaseTally tally = properties::run_cases(options);
  REQUIRE(tally.first_failing_case == -1);
  const int made_by_cases = made;
  const properties::CheckResult result =
      properties::finish_check(options, properties::merge_tallies({tally}));
  CHECK(made == made_by_cases);
  CHECK_FALSE(result.found_failure);
  CHECK(result.cases == 20);
}
