// No vacuous verdict (issue 18 item 4): a check counts the cases that ran,
// were refused and were skipped, fails below its run share, and every run
// counts its queries whose output was not judged.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "engines/cache_under_test.hpp"
#include "properties/check.hpp"
#include "properties/runner.hpp"
#include "properties/verdict.hpp"
#include "support/prng.hpp"

namespace {

using namespace kvcheck;
using namespace kvcheck::properties;

/// The CPU cache, refusing the opens a hash of the spec picks (share
/// `refuse_share`, deterministic), or every open whose head_dim is not a
/// multiple of `head_dim_multiple`.
class RefusingProvider : public engines::CacheProvider {
 public:
  RefusingProvider(double refuse_share, std::int64_t head_dim_multiple)
      : inner_(make_provider(RunOptions{})), share_(refuse_share), multiple_(head_dim_multiple) {}
  const engines::Capabilities& capabilities() override { return inner_->capabilities(); }
  std::unique_ptr<engines::CacheUnderTest> open(const engines::CacheSpec& spec,
                                                engines::Refusal* refused) override {
    const auto& c = spec.cache;
    std::uint64_t h =
        mix_seed(static_cast<std::uint64_t>(c.head_dim), static_cast<std::uint64_t>(c.ring_rows));
    h = mix_seed(h,
                 static_cast<std::uint64_t>(spec.window_keys) * 131 + static_cast<std::uint64_t>(c.states));
    h = mix_seed(h, static_cast<std::uint64_t>(c.q_heads) * 17 + static_cast<std::uint64_t>(c.layers));
    const bool by_share = static_cast<double>(h >> 11) * 0x1.0p-53 < share_;
    if (by_share || c.head_dim % multiple_ != 0) {
      refused->code = "unsupported";
      refused->detail = "refused by the test provider";
      return nullptr;
    }
    return inner_->open(spec, refused);
  }
  std::string name() const override { return "refusing-cpu"; }

 private:
  std::unique_ptr<engines::CacheProvider> inner_;
  double share_;
  std::int64_t multiple_;
};

CheckOptions refusing_check(double refuse_share, std::int64_t multiple, double min_run_share) {
  CheckOptions o;
  o.cases = 120;
  o.seed = 5;
  o.threads = 2;
  o.min_run_share = min_run_share;
  o.provider_factory = [refuse_share, multiple]() -> std::unique_ptr<engines::CacheProvider> {
    return std::make_unique<RefusingProvider>(refuse_share, multiple);
  };
  return o;
}

}  // namespace

TEST_CASE("Counts: a check over a cache that refuses most cases fails on its run share") {
  const CheckResult r = run_check(refusing_check(0.0, 8, 0.8));
  INFO("ran " << r.ran() << ", refused " << r.refused << ", skipped " << r.skipped << " of " << r.cases);
  REQUIRE(r.cases == 120);
  REQUIRE(r.failures == 0);  // nothing that ran failed: the refusals alone fail it
  REQUIRE(r.refused > 24);   // head_dim a multiple of 8 is rare in the default profile
  REQUIRE(r.ran() + r.refused + r.skipped == r.cases);
  REQUIRE_FALSE(r.run_share_ok);
}

TEST_CASE("Counts: refusals below the gate pass and are still counted, the gate is the flag's") {
  const CheckResult low = run_check(refusing_check(0.25, 1, 0.5));
  INFO("ran " << low.ran() << ", refused " << low.refused);
  REQUIRE(low.refused > 10);
  REQUIRE(low.refused < 60);
  REQUIRE(low.run_share_ok);
  REQUIRE(low.failures == 0);
  REQUIRE(low.queries > 0);
  // The same cases under a gate above their run share fail.
  const double share = static_cast<double>(low.ran()) / static_cast<double>(low.cases);
  const CheckResult high = run_check(refusing_check(0.25, 1, share + 0.01));
  REQUIRE(high.refused == low.refused);
  REQUIRE_FALSE(high.run_share_ok);
  const CheckResult exact = run_check(refusing_check(0.25, 1, share));
  REQUIRE(exact.run_share_ok);
}

TEST_CASE("Counts: a sharded tally adds refused cases and queries like one process") {
  CheckOptions o = refusing_check(0.25, 1, 0.8);
  const CaseTally whole = run_cases(o);
  std::vector<CaseTally> parts;
  for (std::int64_t i = 0; i < 3; ++i) {
    o.shard = {i, 3};
    parts.push_back(run_cases(o));
  }
  const CaseTally merged = merge_tallies(parts);
  REQUIRE(merged.refused == whole.refused);
  REQUIRE(merged.refused > 0);
  REQUIRE(merged.queries == whole.queries);
  REQUIRE(merged.queries_not_output_checked == whole.queries_not_output_checked);
}

TEST_CASE("Counts: a tally lists every failing case, the lowest kListedFailingCases of them, across shards") {
  // Two shards of 4000 cases (even and odd indices) with 1500 failures each.
  std::vector<CaseTally> parts(2);
  for (std::int64_t s = 0; s < 2; ++s) {
    CaseTally& t = parts[static_cast<std::size_t>(s)];
    t.cases = 2000;
    t.failures = 1500;
    for (std::int64_t k = 0; k < 1500 && t.failing_cases.size() < kListedFailingCases; ++k)
      t.failing_cases.push_back(s + 2 * (k + 100));  // from case 200 + s on
    t.first_failing_case = t.failing_cases.front();
    t.observed = "slots";
  }
  const CaseTally merged = merge_tallies(parts);
  CHECK(merged.failures == 3000);
  REQUIRE(merged.failing_cases.size() == kListedFailingCases);
  CHECK(merged.failing_cases.front() == 200);
  CHECK(merged.failing_cases.back() == 200 + kListedFailingCases - 1);  // both shards' lowest, interleaved
  CHECK(std::is_sorted(merged.failing_cases.begin(), merged.failing_cases.end()));
  CHECK(merged.first_failing_case == 200);
  CHECK(merged.observed == "slots");
}

TEST_CASE("Counts: a check lists the seed of every failing case, and what the cache makes available") {
  CheckOptions o;
  o.cases = 40;
  o.seed = 1;
  o.threads = 2;
  o.run.backend = "cpu";
  o.run.fault = "window-too-narrow";
  const CaseTally tally = run_cases(o);
  REQUIRE(tally.failures > 1);
  REQUIRE(tally.failing_cases.size() == static_cast<std::size_t>(tally.failures));
  CHECK(tally.failing_cases.front() == tally.first_failing_case);
  CHECK(std::is_sorted(tally.failing_cases.begin(), tally.failing_cases.end()));
  CHECK(tally.observed == "slots+outputs");
  const CheckResult result = finish_check(o, tally);
  REQUIRE(result.failing_case_seeds.size() == tally.failing_cases.size());
  CHECK(result.failing_case_seeds.front() == result.failing_case_seed);
  CHECK(result.failing_case_seeds.back() == check_case_seed(o, tally.failing_cases.back()));
  CHECK(result.observed == "slots+outputs");
}

TEST_CASE("Counts: judge_run counts the queries whose output was not checked, from the queries") {
  RunObservation run;
  for (int s = 0; s < 3; ++s) {
    StepObservation step;
    step.step = s;
    for (int q = 0; q < 4; ++q) {
      QueryObservation query;
      query.position = q;
      query.output_checked = (s + q) % 3 != 0;  // 4 of the 12 not checked
      step.queries.push_back(query);
    }
    run.steps.push_back(step);
  }
  run.queries_not_output_checked = 99;  // whatever was there: judge_run's count is the one kept
  judge_run(scenarios::Scenario{}, &run);
  REQUIRE(run.queries == 12);
  REQUIRE(run.queries_not_output_checked == 4);
  REQUIRE(run.passed);  // not output-checked is counted, not failed
}
