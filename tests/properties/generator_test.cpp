// The swarm generator: deterministic, valid, reaching every coverage class,
// and passing on the production CPU backend.
#include <catch2/catch.hpp>
#include <rapidcheck.h>

#include "properties/check.hpp"
#include "properties/generator.hpp"
#include "scenarios/scenario_json.hpp"

using namespace kvcheck;
using namespace kvcheck::properties;

TEST_CASE("Generator: the same seed gives the same scenario, byte for byte") {
  for (std::uint64_t seed : {1ULL, 2ULL, 99ULL, 123456789ULL}) {
    CHECK(scenarios::save_scenario(generate_scenario(seed)) ==
          scenarios::save_scenario(generate_scenario(seed)));
  }
  CHECK(scenarios::save_scenario(generate_scenario(1)) != scenarios::save_scenario(generate_scenario(2)));
}

TEST_CASE("Generator: random cases pass on the CPU backend (RapidCheck)") {
  rc::check([](std::uint64_t seed) {
    const auto sc = generate_scenario(seed);
    const auto cov = classify(sc);
    RC_CLASSIFY(cov.ring_wrap, "ring wrap");
    RC_CLASSIFY(cov.verify_rejection, "verify rejection");
    RC_CLASSIFY(cov.chunk_longer_than_window, "chunk > window");
    RC_CLASSIFY(cov.state_reuse, "state reuse");
    const auto run = run_scenario(sc, RunOptions{});
    RC_ASSERT(run.passed);
  });
}

TEST_CASE("Check: 300 cases reach every coverage class and pass; identical on 1 and 2 threads") {
  CheckOptions options;
  options.cases = 300;
  options.seed = 7;
  const CheckResult two = run_check(options);
  CHECK_FALSE(two.found_failure);
  CHECK(two.coverage_ok);
  options.threads = 1;
  const CheckResult one = run_check(options);
  CHECK(one.coverage_counts == two.coverage_counts);
}

TEST_CASE("Check: a named fault is found and shrunk to a small failing schedule") {
  CheckOptions options;
  options.cases = 300;
  options.seed = 1;
  options.run.fault = impl::Fault::kWindowTooNarrow;
  const CheckResult r = run_check(options);
  REQUIRE(r.found_failure);
  CHECK(r.shrunk.requests.size() <= 3);
  CHECK(r.shrunk.steps.size() <= 8);
  CHECK(r.shrunk.steps.size() <= r.original.steps.size());
  CHECK_FALSE(r.shrunk_run.passed);
  // The shrunk schedule passes on the correct implementation.
  CHECK(run_scenario(r.shrunk, RunOptions{}).passed);
}
