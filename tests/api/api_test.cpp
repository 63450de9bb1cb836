// kvcheck::api (api/kvcheck.hpp) in the source tree, on our own caches: the
// installed package runs the same calls in examples/engine-test.
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

#include "api/kvcheck.hpp"
#include "engines/factory.hpp"
#include "impl/kv_cache.hpp"
#include "properties/check.hpp"
#include "properties/generator.hpp"
#include "scenarios/scenario_json.hpp"
#include "support/error.hpp"

using namespace kvcheck;

namespace {

std::unique_ptr<engines::CacheProvider> cpu(impl::Fault fault = impl::Fault::kNone) {
  return engines::make_provider("cpu", std::string(impl::fault_name(fault)));
}

}  // namespace

TEST_CASE("api::check runs the cases on providers from the factory, one per worker") {
  std::atomic<int> made{0};
  api::CheckOptions options;
  options.cases = 120;
  options.threads = 2;
  const api::CheckResult r = api::check(
      [&made] {
        ++made;
        return cpu();
      },
      options);
  INFO(api::summary(r));
  CHECK(r.passed);
  CHECK(r.cache == "cpu");
  CHECK(r.cases == 120);
  CHECK(r.failures == 0);
  CHECK_FALSE(r.found_failure);
  CHECK(r.coverage.size() == properties::coverage_names().size());
  // The coordinating thread's provider plus one per worker that ran a case.
  CHECK(made.load() >= 2);
  CHECK(made.load() <= 3);
  CHECK(r.counterexample_file.empty());
}

TEST_CASE("api::check on a borrowed provider finds, shrinks and writes the counterexample") {
  const auto dir =
      std::filesystem::temp_directory_path() /
      ("kvcheck-api-test-" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::filesystem::remove_all(dir);
  const auto file = dir / "sub" / "ce.json";
  const auto buggy = cpu(impl::Fault::kRingSizedWindow);
  api::CheckOptions options;
  options.cases = 200;
  options.counterexample_path = file;
  const api::CheckResult r = api::check(*buggy, options);
  INFO(api::summary(r));
  REQUIRE(r.found_failure);
  CHECK_FALSE(r.passed);
  CHECK(r.failures > 0);
  CHECK(r.counterexample.steps.size() <= r.original.steps.size());
  CHECK_FALSE(r.counterexample_run.passed);
  CHECK(r.counterexample_run.scenario_name == r.counterexample.name);
  REQUIRE(r.counterexample_file == file);
  CHECK(scenarios::load_scenario_file(file) == r.counterexample);
  CHECK(api::summary(r).find("check: FAIL") != std::string::npos);
  // Without a file to write, the summary still names the failing case's seed.
  api::CheckOptions no_file = options;
  no_file.counterexample_path.clear();
  const api::CheckResult unwritten = api::check(*buggy, no_file);
  REQUIRE(unwritten.found_failure);
  CHECK(api::summary(unwritten).find("failing case seed: " + std::to_string(unwritten.failing_case_seed)) !=
        std::string::npos);

  const auto again = api::replay(*buggy, {file});
  REQUIRE(again.size() == 1);
  CHECK_FALSE(again[0].passed);
  CHECK_FALSE(api::all_passed(again));
  const auto fixed = cpu();
  CHECK(api::all_passed(api::replay(*fixed, {dir})));
  std::filesystem::remove_all(dir);
}

namespace {

/// A C++ engine whose caches throw at every verify.
class VerifyThrowingProvider : public engines::CacheProvider {
 public:
  const engines::Capabilities& capabilities() override { return inner_->capabilities(); }
  std::unique_ptr<engines::CacheUnderTest> open(const engines::CacheSpec& spec,
                                                engines::Refusal* refused) override {
    auto cache = inner_->open(spec, refused);
    return cache ? std::make_unique<Cache>(std::move(cache)) : nullptr;
  }
  std::string name() const override { return "verify-throwing"; }

 private:
  class Cache : public engines::CacheUnderTest {
   public:
    explicit Cache(std::unique_ptr<engines::CacheUnderTest> inner) : inner_(std::move(inner)) {}
    engines::StepStatus call(const engines::StepCall& c, engines::StepAnswer* answer) override {
      if (c.op == engines::StepCall::Op::kStep && c.step.kind == scenarios::StepKind::kVerify)
        throw std::out_of_range("draft index past the block table");
      return inner_->call(c, answer);
    }

   private:
    std::unique_ptr<engines::CacheUnderTest> inner_;
  };
  std::unique_ptr<engines::CacheProvider> inner_ = cpu();
};

}  // namespace

TEST_CASE("api::check: an exception from the cache is a failing case, shrunk, never an escape") {
  VerifyThrowingProvider provider;
  api::CheckOptions options;
  options.cases = 20;
  api::CheckResult r;
  REQUIRE_NOTHROW(r = api::check(provider, options));
  INFO(api::summary(r));
  REQUIRE(r.found_failure);
  CHECK_FALSE(r.passed);
  CHECK(r.counterexample_run.crashed);
  CHECK(r.counterexample_run.first_failure.find("the cache threw: draft index past the block table") !=
        std::string::npos);
  CHECK(r.counterexample.steps.size() == 1);  // one verify of a new request
  CHECK(api::summary(r).find("draft index past the block table") != std::string::npos);
  // Replayed, it fails the same way: a run, not an exception.
  const auto dir = std::filesystem::temp_directory_path() / ("kvcheck-api-throw-" + std::to_string(::getpid()));
  const auto file = dir / "ce.json";
  std::filesystem::create_directories(dir);
  scenarios::write_scenario_file(file, r.counterexample);
  const auto again = api::replay(provider, {file});
  REQUIRE(again.size() == 1);
  CHECK(again[0].first_failure == r.counterexample_run.first_failure);
  std::filesystem::remove_all(dir);
}

TEST_CASE("api::replay runs every bundled scenario, named after its file") {
  const auto provider = cpu();
  const auto runs =
      api::replay(*provider, {std::filesystem::path(KVCHECK_SOURCE_DIR) / "scenarios" / "fast"});
  INFO(api::summary(runs));
  CHECK(runs.size() == scenarios::collect_scenario_files({KVCHECK_SOURCE_DIR "/scenarios/fast"}).size());
  CHECK(api::all_passed(runs));
  for (const auto& r : runs) CHECK(r.backend == "cpu");
  CHECK_THROWS_AS(api::replay(*provider, {"/nonexistent/kvcheck.json"}), Error);
}

TEST_CASE("run_check: a provider factory that returns nothing is an error") {
  properties::CheckOptions options;
  options.cases = 4;
  options.provider_factory = [] { return std::unique_ptr<engines::CacheProvider>(); };
  CHECK_THROWS_AS(properties::run_check(options), Error);
  CHECK_THROWS_AS(api::check(api::ProviderFactory([] { return std::unique_ptr<engines::CacheProvider>(); })),
                  Error);
}

TEST_CASE("api::check against a second provider: agreement, a shrunk difference, repeat_bitwise") {
  api::CheckOptions options;
  options.cases = 100;
  options.against = [] { return engines::make_provider("layer", "none"); };
  const api::CheckResult same = api::check([] { return cpu(); }, options);
  INFO(api::summary(same));
  CHECK(same.passed);
  CHECK(same.against == "layer");
  CHECK(same.differences.empty());
  CHECK(same.compared.cases > 0);
  CHECK(same.compared.steps > 0);
  CHECK(api::summary(same).find("agreement of cpu (A) and layer (B)") != std::string::npos);

  // The second cache planted with a fault: the first differing case, shrunk.
  options.against = [] { return cpu(impl::Fault::kRingSizedWindow); };
  const api::CheckResult differ = api::check([] { return cpu(); }, options);
  INFO(api::summary(differ));
  REQUIRE(differ.found_failure);
  CHECK_FALSE(differ.passed);
  CHECK(differ.failures > 0);
  REQUIRE_FALSE(differ.differences.empty());
  CHECK(differ.counterexample.requests.size() <= 3);
  CHECK(differ.counterexample.steps.size() <= 8);
  CHECK(differ.counterexample_run.passed);  // A against the reference
  CHECK(differ.counterexample_run_against.steps.size() == differ.counterexample_run.steps.size());
  const auto first = properties::difference_text(differ.differences.front());
  CHECK(api::summary(differ).find(first) != std::string::npos);

  // bitwise needs a second cache; repeat_bitwise is two runs of one.
  api::CheckOptions bad;
  bad.bitwise = true;
  CHECK_THROWS_AS(api::check([] { return cpu(); }, bad), Error);
  api::CheckOptions twice;
  twice.cases = 50;
  twice.repeat_bitwise = true;
  const api::CheckResult repeat = api::check([] { return cpu(); }, twice);
  INFO(api::summary(repeat));
  CHECK(repeat.passed);
  CHECK(repeat.against == "cpu");
  CHECK(repeat.compared.queries > 0);
  CHECK(api::summary(repeat).find("repeat-bitwise") != std::string::npos);
}
