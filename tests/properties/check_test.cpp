// A check split into shards (run_cases per shard, merge_tallies,
// finish_check) gives exactly run_check's result: the same counts, coverage,
// lowest failing case and shrunk counterexample, whatever the shard count.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "engines/cache_under_test.hpp"
#include "engines/ring_pool_cache.hpp"
#include "impl/kv_cache.hpp"
#include "model/encoding.hpp"
#include "properties/check.hpp"
#include "properties/runner.hpp"
#include "scenarios/scenario_json.hpp"
#include "support/error.hpp"

using namespace kvcheck;

namespace {

properties::CheckOptions faulted_options() {
  properties::CheckOptions options;
  options.cases = 120;
  options.seed = 5;
  options.threads = 2;
  options.run.fault = impl::fault_name(impl::Fault::kAcceptNoRollback);
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
#if defined(KVCHECK_SANITIZED_TREE)
  const std::int64_t shard_counts[] = {3, 121};  // a third of the runs: the Release tree runs all five
#else
  const std::int64_t shard_counts[] = {1, 2, 3, 7, 121};
#endif
  for (const std::int64_t shards : shard_counts) {
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

/// A tally without what depends on which worker ran which case (the cases
/// before the failing one in its worker's cache).
properties::CaseTally counted_part(properties::CaseTally t) {
  t.earlier_cases.clear();
  t.earlier_cases_run = 0;
  return t;
}

TEST_CASE("Check: --max-failures counts the cases up to the N-th failing one, the same on 1 and 4 threads") {
  properties::CheckOptions options = faulted_options();
  const properties::CaseTally all = properties::run_cases(options);
  REQUIRE(all.failures >= 4);
  CHECK(all.cases_not_run == 0);
  // The whole run's fourth lowest failing case is where a stop at 3 would
  // have to count up to at least: the stop falls after the third.
  const std::int64_t third = all.failing_cases[2];
  properties::CaseTally first;
  for (const int threads : {1, 4}) {
    INFO("threads " << threads);
    options.threads = threads;
    options.max_failures = 3;
    const properties::CaseTally t = properties::run_cases(options);
    CHECK(t.failures == 3);
    CHECK(t.cases == third + 1);
    CHECK(t.cases_not_run == options.cases - (third + 1));
    CHECK(t.failing_cases ==
          std::vector<std::int64_t>(all.failing_cases.begin(), all.failing_cases.begin() + 3));
    CHECK(t.first_failing_case == all.first_failing_case);
    CHECK(t.lowest_failing_cases == t.failing_cases);
    if (threads == 1) {
      first = t;
    } else {
      CHECK(counted_part(t) == counted_part(first));
    }
  }
  // The result has failed; the cases that did not run are said, not gated.
  const properties::CheckResult result = properties::finish_check(options, first);
  CHECK(result.found_failure);
  CHECK(result.cases_not_run == first.cases_not_run);
  for (const std::int64_t minimum : result.coverage_minimums) CHECK(minimum == 0);
  // A limit the run never reaches changes nothing.
  options.max_failures = all.failures + 1;
  options.threads = 2;
  CHECK(counted_part(properties::run_cases(options)) == counted_part(all));
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

namespace {

/// An in-process engine that keeps state across close/open: its first cache
/// is the correct CPU pool, every later one has the accept-no-rollback bug.
class SecondOpenFaulty : public engines::CacheProvider {
 public:
  SecondOpenFaulty() {
    properties::RunOptions clean;
    clean_ = properties::make_provider(clean);
    properties::RunOptions faulty;
    faulty.fault = impl::fault_name(impl::Fault::kAcceptNoRollback);
    faulty_ = properties::make_provider(faulty);
  }
  const engines::Capabilities& capabilities() override { return clean_->capabilities(); }
  std::unique_ptr<engines::CacheUnderTest> open(const engines::CacheSpec& spec,
                                                engines::Refusal* refused) override {
    return (opened_++ == 0 ? clean_ : faulty_)->open(spec, refused);
  }
  std::string name() const override { return "second-open-faulty"; }

 private:
  std::unique_ptr<engines::CacheProvider> clean_, faulty_;
  int opened_ = 0;
};

}  // namespace

TEST_CASE("Check: a reproducible failure is replayed alone in a fresh cache and reported shrunk") {
  const properties::CheckOptions options = faulted_options();
  const properties::CheckResult result = properties::run_check(options);
  REQUIRE(result.found_failure);
  CHECK(result.reproduces_alone);
  CHECK(result.earlier_case_seeds.empty());
  CHECK(result.earlier_cases.empty());
  CHECK_FALSE(result.shrunk_run.passed);
  CHECK(result.shrunk.steps.size() <= result.original.steps.size());
  properties::CheckOptions whole = options;
  const properties::CaseTally tally = properties::run_cases(whole);
  CHECK(properties::case_fails_alone(options, tally.first_failing_case));
  // Every case below the lowest failing one passed in the run, and passes alone.
  REQUIRE(tally.first_failing_case > 0);
  CHECK_FALSE(properties::case_fails_alone(options, tally.first_failing_case - 1));
}

TEST_CASE("Check: a failure that passes alone in a fresh cache is labelled with the cases before it") {
  properties::CheckOptions options = faulted_options();
  options.run.fault = "none";
  options.threads = 1;  // one worker: the cases before the failure are fixed
  options.provider_factory = [] { return std::make_unique<SecondOpenFaulty>(); };
  const properties::CheckResult result = properties::run_check(options);
  REQUIRE(result.found_failure);
  CHECK_FALSE(result.reproduces_alone);
  CHECK(result.reproduces_after_earlier);
  // Any one earlier case makes the next cache the faulty one: the shortest tail is 1.
  REQUIRE(result.earlier_case_seeds.size() == 1);
  REQUIRE(result.earlier_cases.size() == 1);
  const properties::CaseTally tally = properties::run_cases(options);
  CHECK(result.earlier_cases_run == tally.first_failing_case);  // one worker ran 0 .. k-1 before case k
  CHECK(tally.earlier_cases.size() == static_cast<std::size_t>(tally.first_failing_case));
  CHECK(result.earlier_case_seeds[0] == properties::case_seed(options.seed, tally.first_failing_case - 1));
  CHECK_FALSE(result.shrunk_run.passed);  // the run reported is the one after the earlier case
  CHECK_FALSE(result.first_failure_there.empty());
  // Not shrunk: the case is reported as drawn.
  CHECK(result.shrunk.steps.size() == result.original.steps.size());
  CHECK(result.shrink_runs == 0);
  CHECK_FALSE(properties::case_fails_alone(options, tally.first_failing_case));
}

namespace {

/// A C++ engine whose caches throw at decode: always, or only the first
/// time any of them decodes (`once`, shared by every provider of a run).
class DecodeThrowingProvider : public engines::CacheProvider {
 public:
  explicit DecodeThrowingProvider(std::shared_ptr<std::atomic<bool>> once)
      : inner_(properties::make_provider(properties::RunOptions{})), once_(std::move(once)) {}
  const engines::Capabilities& capabilities() override { return inner_->capabilities(); }
  std::unique_ptr<engines::CacheUnderTest> open(const engines::CacheSpec& spec,
                                                engines::Refusal* refused) override {
    auto cache = inner_->open(spec, refused);
    return cache ? std::make_unique<Cache>(std::move(cache), once_) : nullptr;
  }
  std::string name() const override { return "decode-throwing"; }

 private:
  class Cache : public engines::CacheUnderTest {
   public:
    Cache(std::unique_ptr<engines::CacheUnderTest> inner, std::shared_ptr<std::atomic<bool>> once)
        : inner_(std::move(inner)), once_(std::move(once)) {}
    engines::StepStatus call(const engines::StepCall& c, engines::StepAnswer* answer) override {
      const bool decode = c.op == engines::StepCall::Op::kStep && c.step.kind == scenarios::StepKind::kDecode;
      if (decode && (!once_ || !once_->exchange(true))) throw std::runtime_error("decode kernel exploded");
      return inner_->call(c, answer);
    }
    engines::StepStatus probe(const std::string& name, const engines::StepCall& context) override {
      return inner_->probe(name, context);
    }
    std::optional<std::uint64_t> fingerprint(std::int32_t layer) const override {
      return inner_->fingerprint(layer);
    }

   private:
    std::unique_ptr<engines::CacheUnderTest> inner_;
    std::shared_ptr<std::atomic<bool>> once_;
  };
  std::unique_ptr<engines::CacheProvider> inner_;
  std::shared_ptr<std::atomic<bool>> once_;
};

}  // namespace

TEST_CASE("Check: a cache that throws is a failing case, shrunk, with what it threw as its first failure") {
  properties::CheckOptions options;
  options.cases = 30;
  options.provider_factory = [] { return std::make_unique<DecodeThrowingProvider>(nullptr); };
  const properties::CheckResult result = properties::run_check(options);
  REQUIRE(result.found_failure);
  CHECK(result.reproduces_alone);
  CHECK(result.shrunk_run.crashed);
  CHECK_FALSE(result.shrunk_run.passed);
  CHECK(result.shrunk_run.first_failure.find("(decode) layer 0: the cache crashed: the cache threw: decode "
                                             "kernel exploded") != std::string::npos);
  CHECK(result.shrunk.steps.size() < result.original.steps.size());
  CHECK(result.shrunk.steps.back().kind == scenarios::StepKind::kDecode);
  CHECK(result.crashes_not_reproduced == 0);

  // --case-seed: the failing case alone, drawn from its case seed; it fails
  // the same way first and shrinks to the same counterexample.
  properties::CheckOptions one = options;
  one.only_case_seed = result.failing_case_seed;
  one.cases = 1;
  const properties::CheckResult again = properties::run_check(one);
  REQUIRE(again.found_failure);
  CHECK(again.failing_case_seed == result.failing_case_seed);
  CHECK(again.original == result.original);
  CHECK(again.shrunk.steps == result.shrunk.steps);
  CHECK(again.shrunk_run.first_failure == result.shrunk_run.first_failure);
}

TEST_CASE("Check: a crash that does not happen again when its case runs alone is no failure, and is counted") {
  properties::CheckOptions options;
  options.cases = 30;
  options.threads = 1;
  const auto once = std::make_shared<std::atomic<bool>>(false);
  options.provider_factory = [once] { return std::make_unique<DecodeThrowingProvider>(once); };
  const properties::CheckResult result = properties::run_check(options);
  CHECK(once->load());  // it did throw, once
  CHECK_FALSE(result.found_failure);
  CHECK(result.failures == 0);
  CHECK(result.crashes_not_reproduced == 1);
}

TEST_CASE("Check: a fault travels by name, resolved by the provider that makes the cache") {
  properties::RunOptions run;
  run.fault = "no-such-fault";
  try {
    properties::make_provider(run);
    FAIL("an unknown fault name made a provider");
  } catch (const Error& e) {
    CHECK(e.id() == ErrorId::kUsage);
    CHECK(e.where() == "--fault");
  }
  run.backend = "layer";  // named faults belong to the ring pool
  run.fault = impl::fault_name(impl::Fault::kWindowTooNarrow);
  CHECK_THROWS_AS(properties::make_provider(run), Error);
  run.fault = "none";
  CHECK(properties::make_provider(run) != nullptr);
  // The name goes into the run as given, and the named fault is the one that runs.
  properties::CheckOptions options = faulted_options();
  options.cases = 40;
  const properties::CheckResult result = properties::run_check(options);
  REQUIRE(result.found_failure);
  CHECK(result.shrunk_run.fault == "accept-no-rollback");
  CHECK(result.shrunk.name.find("accept-no-rollback") != std::string::npos);
}

// ---- two caches side by side (--against, --repeat-bitwise) -------------------

namespace {

properties::CheckOptions side_by_side_options(const std::string& first, const std::string& second) {
  properties::CheckOptions options;
  options.cases = 40;
  options.seed = 3;
  options.threads = 2;
  options.run.backend = first;
  options.run.against = second;
  return options;
}

}  // namespace

TEST_CASE("Side by side: the CPU ring pool and the layer-bound cache agree, and a pass says how much was compared") {
  const properties::CheckOptions options = side_by_side_options("cpu", "layer");
  const properties::CheckResult result = properties::run_check(options);
  CHECK(result.failures == 0);
  CHECK_FALSE(result.found_failure);
  // A pass compared something: every case that ran, on every step and query.
  CHECK(result.ran() > 0);
  CHECK(result.compared.cases == result.ran());
  CHECK(result.compared.steps >= result.compared.cases);
  CHECK(result.compared.queries > 0);
  CHECK(result.compared.reads == result.compared.queries);
  CHECK(result.compared.outputs == result.compared.queries);
  // The layer-bound cache runs full-window cases only: no row is overwritten, the resident sets compare.
  CHECK(result.compared.resident == result.compared.steps);
}

TEST_CASE("Side by side: a cache against the same cache with a planted fault differs, shrunk small") {
  properties::CheckOptions options = side_by_side_options("cpu", "cpu");
  options.cases = 60;
  // The second cache's provider plants the fault (--against runs without --fault).
  options.against_provider_factory = [] {
    properties::RunOptions faulty;
    faulty.fault = impl::fault_name(impl::Fault::kAcceptNoRollback);
    return properties::make_provider(faulty);
  };
  const properties::CheckResult result = properties::run_check(options);
  REQUIRE(result.found_failure);
  CHECK(result.failures > 0);
  CHECK(result.failures < result.cases);
  CHECK(result.reproduces_alone);
  CHECK(result.shrunk.requests.size() <= 3);
  CHECK(result.shrunk.steps.size() <= 8);
  CHECK(result.shrunk.name.find("agreement") != std::string::npos);
  // The shrunk case's comparison lists its differing steps; both runs are kept.
  REQUIRE(result.difference.differ());
  CHECK(result.difference.counts.cases == 1);
  const properties::StepDifference& first = result.difference.differences.front();
  CHECK(first.step >= 0);
  CHECK(first.step < static_cast<std::int64_t>(result.shrunk.steps.size()));
  CHECK((first.what == "resident" || first.what == "reads" || first.what == "outputs"));
  CHECK(result.shrunk_run.backend == "cpu");
  CHECK(result.shrunk_run.fault == "none");
  CHECK(result.shrunk_run_b.steps.size() > 0);
  // The same comparison made again from the two kept runs.
  const properties::PairComparison again =
      properties::compare_runs(result.shrunk_run, result.shrunk_run_b, false);
  CHECK(again.differences.size() == result.difference.differences.size());
}

TEST_CASE("Side by side: two runs of a deterministic cache are bitwise equal, of a drifting one not") {
  properties::CheckOptions options = side_by_side_options("cpu", "");
  options.run.repeat_bitwise = true;
  options.cases = 30;
  const properties::CheckResult same = properties::run_check(options);
  CHECK(same.failures == 0);
  CHECK(same.compared.cases == same.ran());
  CHECK(same.compared.outputs > 0);

  // Outputs that move by one unit in the last place on every other open.
  struct Drifting final : engines::CacheUnderTest {
    std::unique_ptr<engines::CacheUnderTest> inner;
    bool drift = false;
    engines::StepStatus call(const engines::StepCall& c, engines::StepAnswer* answer) override {
      const engines::StepStatus st = inner->call(c, answer);
      if (!st && answer && drift) {
        for (double& x : answer->out) x = std::nextafter(x, 2.0);
      }
      return st;
    }
  };
  struct DriftingProvider final : engines::CacheProvider {
    std::unique_ptr<engines::CacheProvider> inner = properties::make_provider(properties::RunOptions{});
    int opened = 0;
    const engines::Capabilities& capabilities() override { return inner->capabilities(); }
    std::unique_ptr<engines::CacheUnderTest> open(const engines::CacheSpec& spec, engines::Refusal* refused) override {
      auto cache = inner->open(spec, refused);
      if (!cache) return nullptr;
      auto drifting = std::make_unique<Drifting>();
      drifting->inner = std::move(cache);
      drifting->drift = (opened++ % 2) == 1;
      return drifting;
    }
    std::string name() const override { return "drifting"; }
  };
  options.run.probes = false;  // the wrapper takes no probes
  options.provider_factory = [] { return std::make_unique<DriftingProvider>(); };
  const properties::CheckResult drifting = properties::run_check(options);
  REQUIRE(drifting.found_failure);
  REQUIRE(drifting.difference.differ());
  CHECK(drifting.difference.differences.front().what == "outputs");
  CHECK(drifting.difference.differences.front().detail.find("not bitwise equal") != std::string::npos);
  CHECK(drifting.shrunk.requests.size() == 1);
}

TEST_CASE("Side by side: a case is drawn inside what both caches can run") {
  engines::Capabilities a, b;
  a.name = "a";
  b.name = "b";
  a.formats = {scenarios::Format::kF64, scenarios::Format::kF32};
  b.formats = {scenarios::Format::kF32};
  a.verify = false;
  b.max_positions = 64;
  a.max_positions = 128;
  a.head_dims.values = {4, 8, 16};
  b.head_dims.multiple_of = 8;
  b.full_window_only = true;
  const engines::Capabilities both = properties::intersect_capabilities(a, b);
  CHECK(both.formats == std::vector<scenarios::Format>{scenarios::Format::kF32});
  CHECK_FALSE(both.verify);
  CHECK(both.decode);
  CHECK(both.max_positions == 64);
  CHECK(both.full_window_only);
  CHECK(both.head_dims.contains(8));
  CHECK(both.head_dims.contains(16));
  CHECK_FALSE(both.head_dims.contains(4));
  CHECK_FALSE(both.head_dims.contains(24));
  // Cached rows (and the pool pressure drawn for them) only when both report them.
  a.reports_cached = true;
  CHECK_FALSE(properties::intersect_capabilities(a, b).reports_cached);
  b.reports_cached = true;
  CHECK(properties::intersect_capabilities(a, b).reports_cached);
  // Resident sets compare when both caches report frees, or neither does and they address alike.
  engines::Capabilities ring, paged, freeing;
  ring.ring_addressing = true;
  paged.block_size = 16;
  freeing.block_size = 16;
  freeing.reports_frees = true;
  CHECK(properties::resident_sets_comparable(ring, ring));
  CHECK(properties::resident_sets_comparable(paged, paged));
  CHECK_FALSE(properties::resident_sets_comparable(ring, paged));
  CHECK_FALSE(properties::resident_sets_comparable(paged, freeing));
  CHECK(properties::resident_sets_comparable(freeing, freeing));
  paged.full_window_only = true;  // its cases never write a slot twice
  CHECK(properties::resident_sets_comparable(ring, paged));
  b.head_dims = engines::SizeSet{};
  b.head_dims.values = {32};
  CHECK_FALSE(properties::intersect_capabilities(a, b).head_dims.contains(32));
  CHECK_FALSE(properties::intersect_capabilities(a, b).head_dims.contains(8));
}

TEST_CASE("Side by side: a refusal on one side only is a difference, never agreement") {
  properties::RunObservation a, b;
  b.skipped = true;
  b.refused = true;
  b.skip_reason = "b refused the configuration: full";
  const properties::PairComparison one_sided = properties::compare_runs(a, b, false);
  CHECK(one_sided.counts.cases == 0);
  REQUIRE(one_sided.differ());
  CHECK(one_sided.differences.front().what == "refusal");
  CHECK(one_sided.differences.front().detail.find("full") != std::string::npos);
  // A case outside one cache's capabilities is compared by neither (nothing was sent).
  a.skipped = true;
  a.skip_reason = "a does not support verify";
  const properties::PairComparison excluded = properties::compare_runs(a, b, false);
  CHECK(excluded.skipped);
  CHECK_FALSE(excluded.refused);
  CHECK_FALSE(excluded.differ());
  CHECK(excluded.skip_reason == "A: a does not support verify");
  a.refused = true;
  const properties::PairComparison neither = properties::compare_runs(a, b, false);
  CHECK(neither.skipped);
  CHECK(neither.refused);
  CHECK_FALSE(neither.differ());
  CHECK(neither.counts == properties::ComparedCounts{});
  // A step one side refused and the other ran, and resident sets that differ.
  properties::RunObservation c, d;
  c.steps.resize(2);
  d.steps.resize(2);
  c.steps[0].resident = {{0, 0}, {0, 1}, {0, 2}};
  d.steps[0].resident = {{0, 1}, {0, 2}, {0, 3}};
  d.steps[1].error = "full: no free block";
  const properties::PairComparison steps = properties::compare_runs(c, d, false);
  REQUIRE(steps.differences.size() == 2);
  CHECK(steps.differences[0].what == "resident");
  CHECK(steps.differences[0].detail ==
        "by lineage, A holds r0 p0 that B does not; B holds r0 p3 that A does not");
  CHECK(steps.differences[1].what == "refusal");
  CHECK(steps.counts.steps == 1);
  CHECK(steps.counts.resident == 1);
}

TEST_CASE("Side by side: both caches crashing or refusing at a step is not agreement, and is counted") {
  // The same crash on both sides at step 1 (after an agreeing step 0).
  properties::RunObservation a, b;
  a.steps.resize(2);
  b.steps.resize(2);
  a.steps[1].step = b.steps[1].step = 1;
  a.steps[1].kind = b.steps[1].kind = "decode";
  a.steps[1].error = b.steps[1].error = "the cache crashed: the adapter closed its stdout";
  a.crashed = b.crashed = true;
  const properties::PairComparison crashed = properties::compare_runs(a, b, false);
  REQUIRE(crashed.differ());
  CHECK(crashed.differences.front().what == "both-stopped");
  CHECK(crashed.differences.front().step == 1);
  CHECK(crashed.differences.front().detail ==
        "A: the cache crashed: the adapter closed its stdout; B: the cache crashed: the adapter closed its stdout");
  CHECK(crashed.counts.cases == 1);
  CHECK(crashed.counts.steps == 1);
  CHECK(crashed.counts.both_stopped == 1);
  // Both refusing the step alike: the same.
  a.crashed = b.crashed = false;
  a.steps[1].error = b.steps[1].error = "full: no free block";
  CHECK(properties::compare_runs(a, b, false).counts.both_stopped == 1);
  // Both crashing at open (no step ran): a difference, counted as well.
  properties::RunObservation c, d;
  c.crashed = d.crashed = true;
  c.first_failure = d.first_failure = "open: the cache crashed: boom";
  const properties::PairComparison at_open = properties::compare_runs(c, d, false);
  REQUIRE(at_open.differ());
  CHECK(at_open.counts.both_stopped == 1);
  // Summed over cases as the other counts are.
  properties::ComparedCounts total;
  total += crashed.counts;
  total += at_open.counts;
  CHECK(total.both_stopped == 2);
  // Agreeing runs count none.
  properties::RunObservation e, f;
  e.steps.resize(1);
  f.steps.resize(1);
  const properties::PairComparison agree = properties::compare_runs(e, f, false);
  CHECK_FALSE(agree.differ());
  CHECK(agree.counts.both_stopped == 0);
}

TEST_CASE(
    "Side by side: --bitwise compares in the narrower declared output format, and one bf16 ULP still "
    "differs") {
  // One query, four output elements; A declares bf16 outputs, B none (its
  // outputs as accumulated, here doubles).
  const auto one_query = [](std::vector<double> out, std::string output_format) {
    properties::RunObservation run;
    run.output_format = std::move(output_format);
    run.steps.resize(1);
    run.steps[0].kind = "decode";
    run.steps[0].queries.resize(1);
    run.steps[0].queries[0].out = std::move(out);
    run.steps[0].queries[0].tolerance = 0x1.0p-8;  // what a bf16 kernel's tolerance allows, about
    return run;
  };
  const std::vector<double> exact = {0.3, -0.90515, 1.0 + 0x1.0p-8, 7.0};
  std::vector<double> bf16;
  for (const double x : exact) bf16.push_back(model::round_output(OutputFormat::kBf16, x));
  const properties::RunObservation wide = one_query(exact, "");
  // A correct bf16 cache against a wider one: B's outputs rounded once (to
  // nearest even: 1 + 2^-8 is a tie, down to 1) equal A's bit for bit.
  const properties::PairComparison agree = properties::compare_runs(one_query(bf16, "bf16"), wide, true);
  CHECK_FALSE(agree.differ());
  CHECK(agree.counts.outputs == 1);
  CHECK(agree.counts.bitwise_format == "bf16");
  // Unrounded, they differ: the format is what makes the comparison possible.
  CHECK(properties::compare_runs(one_query(bf16, ""), wide, true).differ());
  // A block-reuse path that moves one element by one bf16 ULP (2^-8 at
  // -0.905, inside the tolerance):
  std::vector<double> moved = bf16;
  moved[1] += 0x1.0p-8;
  REQUIRE(model::round_output(OutputFormat::kBf16, moved[1]) == moved[1]);  // still a bf16 value
  // within the larger tolerance it agrees, bit for bit in bf16 it does not,
  // against the wider cache and against a correct bf16 one.
  CHECK_FALSE(properties::compare_runs(one_query(moved, "bf16"), wide, false).differ());
  const properties::PairComparison seen = properties::compare_runs(one_query(moved, "bf16"), wide, true);
  REQUIRE(seen.differ());
  CHECK(seen.differences.front().what == "outputs");
  CHECK(seen.differences.front().detail.find("not bitwise equal in bf16 (B rounded once into it: A ") !=
        std::string::npos);
  CHECK(seen.differences.front().detail.find("1 of 4 elements differ, the first at 1") != std::string::npos);
  CHECK(properties::compare_runs(one_query(moved, "bf16"), one_query(bf16, "bf16"), true).differ());
  // Either side may be the narrower one: B declaring fp16 rounds A into fp16.
  std::vector<double> fp16;
  for (const double x : exact) fp16.push_back(model::round_output(OutputFormat::kFp16, x));
  const properties::PairComparison fp = properties::compare_runs(wide, one_query(fp16, "fp16"), true);
  CHECK_FALSE(fp.differ());
  CHECK(fp.counts.bitwise_format == "fp16");
  // Two caches that declare one format, or none, compare as answered.
  CHECK(properties::compare_runs(one_query(bf16, "bf16"), one_query(bf16, "bf16"), true)
            .counts.bitwise_format.empty());
}

// ---- paged pools (--impl paged, --profile paged) ------------------------------

TEST_CASE("Paged: --impl paged passes the paged and default profiles, counts blocks, and a faulted pool fails") {
  properties::CheckOptions options;
  options.cases = 60;
  options.seed = 7;
  options.threads = 2;
  options.run.backend = "paged";
  options.profile = properties::Profile::kPaged;
  const properties::CheckResult paged = properties::run_check(options);
  INFO(paged.shrunk_run.first_failure);
  CHECK(paged.failures == 0);
  CHECK(paged.ran() == paged.cases);
  CHECK(paged.coverage_ok);
  CHECK(paged.block_size == engines::kPagedPoolBlockRows);
  // The paged profile's own classes are gated and reached.
  const auto& names = properties::coverage_names();
  for (const char* name : {"block_free", "block_reuse_after_free", "verify_straddles_block"}) {
    const auto at = std::find(names.begin(), names.end(), name);
    REQUIRE(at != names.end());
    const auto k = static_cast<std::size_t>(at - names.begin());
    CHECK(paged.reachable[k]);
    CHECK(paged.coverage_counts[k] > 0);
  }
  // The default profile, on the same cache, passes; it draws long runs in
  // some cases, the paged profile in every one.
  options.profile = properties::Profile::kDefault;
  const properties::CheckResult plain = properties::run_check(options);
  CHECK(plain.failures == 0);
  CHECK(plain.block_window_frees > 0);
  const std::size_t long_runs = properties::feature_class(properties::Feature::kLongRuns);
  CHECK(plain.coverage_counts[long_runs] > 0);
  CHECK(plain.coverage_counts[long_runs] < paged.coverage_counts[long_runs]);
  // A ring cache has no block size: the paged classes are not reachable, nothing is counted.
  options.run.backend = "cpu";
  options.profile = properties::Profile::kPaged;
  options.cases = 10;
  const properties::CheckResult ring = properties::run_check(options);
  CHECK(ring.failures == 0);
  CHECK(ring.block_size == 0);
  CHECK(ring.block_window_frees + ring.block_end_frees + ring.block_reuses == 0);
  CHECK_FALSE(ring.reachable[13]);  // block_free
  CHECK(names[13] == "block_free");
  // A named fault in the paged pool fails, shrunk small.
  options.run.backend = "paged";
  options.run.fault = impl::fault_name(impl::Fault::kAcceptNoRollback);
  options.cases = 40;
  const properties::CheckResult faulted = properties::run_check(options);
  REQUIRE(faulted.found_failure);
  CHECK(faulted.shrunk.requests.size() <= 3);
  CHECK(faulted.shrunk.steps.size() <= 8);
}

namespace {

/// The CPU ring pool declaring two kernel paths of its own: "one_query" for a
/// step that attends one query, "many_queries" for one that attends 9 or
/// more, and (when asked) "never", which no run takes. The checker sees
/// only the declaration.
class DeclaredPathsProvider : public engines::CacheProvider {
 public:
  explicit DeclaredPathsProvider(bool with_never) {
    properties::RunOptions cpu;
    inner_ = properties::make_provider(cpu);
    caps_ = inner_->capabilities();
    caps_.kernel_paths = {"one_query", "many_queries"};
    if (with_never) caps_.kernel_paths.push_back("never");
    caps_.kernel_paths_run = [with_never](const engines::CacheSpec&, std::span<const std::int64_t> queries) {
      std::vector<bool> reached(with_never ? 3 : 2, false);
      for (const std::int64_t n : queries) {
        if (n == 1) reached[0] = true;
        if (n >= 9) reached[1] = true;
      }
      return reached;
    };
  }
  const engines::Capabilities& capabilities() override { return caps_; }
  std::unique_ptr<engines::CacheUnderTest> open(const engines::CacheSpec& spec,
                                                engines::Refusal* refused) override {
    return inner_->open(spec, refused);
  }
  std::string name() const override { return "cpu"; }

 private:
  std::unique_ptr<engines::CacheProvider> inner_;
  engines::Capabilities caps_;
};

}  // namespace

TEST_CASE(
    "Check: a cache's declared kernel paths are counted after the profile's classes, gated in production") {
  properties::CheckOptions options;
  options.cases = 6;  // production cases cost about 0.2 s of CPU each
  options.seed = 5;
  options.profile = properties::Profile::kProduction;
  options.provider_factory = [] { return std::make_unique<DeclaredPathsProvider>(false); };
  const properties::CheckResult result = properties::run_check(options);
  const std::size_t own = properties::coverage_names().size();
  REQUIRE(result.coverage_counts.size() == own + 2);
  CHECK(result.kernel_paths == std::vector<std::string>{"one_query", "many_queries"});
  CHECK(result.coverage_counts[own] > 0);
  CHECK(result.coverage_counts[own + 1] > 0);
  CHECK(result.coverage_counts[own + 1] < result.cases);
  CHECK(result.reachable[own]);
  CHECK(result.reachable[own + 1]);
  // A declared path no case takes fails the production profile's gate...
  options.provider_factory = [] { return std::make_unique<DeclaredPathsProvider>(true); };
  const properties::CheckResult never = properties::run_check(options);
  REQUIRE(never.coverage_counts.size() == own + 3);
  CHECK(never.coverage_counts[own + 2] == 0);
  CHECK(never.reachable[own + 2]);
  CHECK_FALSE(never.coverage_ok);
  // ...and is shown, ungated, in the default profile.
  options.profile = properties::Profile::kDefault;
  const properties::CheckResult fallback = properties::run_check(options);
  REQUIRE(fallback.coverage_counts.size() == properties::coverage_names().size() + 3);
  CHECK(fallback.coverage_counts.back() == 0);
  CHECK_FALSE(fallback.reachable.back());
}

namespace {

/// The CPU ring pool with one layer's outputs off by 0.5 (its first element
/// of every writing step): a case fails on that layer only.
class LayerOffProvider : public engines::CacheProvider {
 public:
  explicit LayerOffProvider(std::int32_t layer)
      : inner_(properties::make_provider(properties::RunOptions{})), layer_(layer) {}
  const engines::Capabilities& capabilities() override { return inner_->capabilities(); }
  std::unique_ptr<engines::CacheUnderTest> open(const engines::CacheSpec& spec,
                                                engines::Refusal* refused) override {
    auto cache = inner_->open(spec, refused);
    return cache ? std::make_unique<Cache>(std::move(cache), layer_) : nullptr;
  }
  std::string name() const override { return "layer-off"; }

 private:
  class Cache : public engines::CacheUnderTest {
   public:
    Cache(std::unique_ptr<engines::CacheUnderTest> inner, std::int32_t layer)
        : inner_(std::move(inner)), layer_(layer) {}
    engines::StepStatus call(const engines::StepCall& c, engines::StepAnswer* answer) override {
      const engines::StepStatus st = inner_->call(c, answer);
      if (!st && answer != nullptr && c.layer == layer_ && !answer->out.empty()) answer->out[0] += 0.5;
      return st;
    }

   private:
    std::unique_ptr<engines::CacheUnderTest> inner_;
    std::int32_t layer_;
  };
  std::unique_ptr<engines::CacheProvider> inner_;
  std::int32_t layer_;
};

/// One request on `layers` layers (window 3): a prefill of 3 rows, 2 decodes.
scenarios::Scenario layered_case(std::int32_t layers) {
  scenarios::Scenario sc;
  sc.name = "layers";
  sc.cache.window = 3;
  sc.cache.ring_rows = 8;
  sc.cache.layers = layers;
  sc.requests = {{0, 0}};
  scenarios::Step prefill;
  prefill.kind = scenarios::StepKind::kPrefill;
  prefill.rows = 3;
  scenarios::Step decode;
  decode.kind = scenarios::StepKind::kDecode;
  sc.steps = {prefill, decode, decode};
  return sc;
}

/// `sc` shrunk against `provider` (probes off): whether the case fails.
scenarios::Scenario shrunk_on(engines::CacheProvider& provider, const scenarios::Scenario& sc) {
  properties::RunOptions run;
  run.provider = &provider;
  run.probes = false;
  run.precision_bits = 53;
  const auto fails = [&](const scenarios::Scenario& s) { return !properties::run_scenario(s, run).passed; };
  REQUIRE(fails(sc));
  std::int64_t runs = 0;
  scenarios::Scenario shrunk = properties::shrink_scenario(sc, fails, &runs);
  CHECK(fails(shrunk));
  return shrunk;
}

}  // namespace

TEST_CASE("Shrink: a case failing only on layer 0 shrinks to one layer, its windows and rows with it") {
  LayerOffProvider off(0);
  const scenarios::Scenario plain = shrunk_on(off, layered_case(4));
  CHECK(plain.cache.layers == 1);
  CHECK(plain.steps.size() == 1);
  // Windows per layer (layer 0 sliding, 1 global, ...) and an explicit row
  // on each layer: one layer is left, with its window and its row.
  scenarios::Scenario windowed = layered_case(4);
  windowed.cache.layer_windows = {{2, scenarios::Convention::kKeys},
                                  {std::nullopt, scenarios::Convention::kKeys},
                                  {3, scenarios::Convention::kKeys},
                                  {2, scenarios::Convention::kKeys}};
  for (std::int32_t l = 0; l < 4; ++l) {
    scenarios::ExplicitRow row;
    row.layer = l;
    row.position = 0;
    row.k = {0.25 * (l + 1), 0.5};
    row.v = {0.5, -0.25 * (l + 1)};
    row.q = {1.0, 0.5};
    windowed.data.rows.push_back(row);
  }
  const scenarios::Scenario shrunk = shrunk_on(off, windowed);
  CHECK(shrunk.cache.layers == 1);
  CHECK(shrunk.cache.layer_windows.size() <= 1);
  REQUIRE(shrunk.data.rows.size() == 1);
  CHECK(shrunk.data.rows[0].layer == 0);
  CHECK(shrunk.data.rows[0].k == std::vector<double>{0.25, 0.5});
}

TEST_CASE("Shrink: a case failing only on layer 1 keeps two layers of four or six") {
  // A failure between layers (a block handed to two layers of one pool) needs
  // two: one layer does not fail, and the shrinker used to keep all of them.
  LayerOffProvider off(1);
  for (const std::int32_t layers : {4, 6}) {
    INFO(layers << " layers");
    const scenarios::Scenario shrunk = shrunk_on(off, layered_case(layers));
    CHECK(shrunk.cache.layers == 2);
    CHECK(shrunk.steps.size() == 1);
  }
  // With windows per layer: the failing layer keeps its own window.
  scenarios::Scenario windowed = layered_case(4);
  windowed.cache.layer_windows = {{2, scenarios::Convention::kKeys},
                                  {3, scenarios::Convention::kKeys},
                                  {std::nullopt, scenarios::Convention::kKeys},
                                  {2, scenarios::Convention::kKeys}};
  const scenarios::Scenario shrunk = shrunk_on(off, windowed);
  CHECK(shrunk.cache.layers == 2);
}
