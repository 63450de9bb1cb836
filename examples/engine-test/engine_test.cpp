// An engine's test suite checking its cache with kvcheck, in process.
#include <catch2/catch.hpp>

#include <filesystem>
#include <memory>

#include "api/kvcheck.hpp"
#include "toy_ring_cache.hpp"

namespace {

std::filesystem::path scratch_dir() {
  const auto dir = std::filesystem::temp_directory_path() / "kvcheck-engine-test";
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace

TEST_CASE("the toy ring cache passes 300 generated schedules") {
  kvcheck::api::CheckOptions options;
  options.cases = 300;
  options.seed = 7;
  // One provider (and so one set of caches) per worker thread.
  const auto result = kvcheck::api::check([] { return std::make_unique<toy::ToyRingProvider>(); }, options);
  INFO(kvcheck::api::summary(result));
  CHECK(result.cache == "toy-ring");
  CHECK(result.cases == 300);
  CHECK(result.skipped == 0);
  CHECK(result.coverage_ok);
  REQUIRE(result.passed);
  CHECK(result.failures == 0);
}

TEST_CASE("a ring sized to the window is caught and shrunk to a small counterexample") {
  const auto file = scratch_dir() / "ring-sized-window.json";
  std::filesystem::remove(file);
  kvcheck::api::CheckOptions options;
  options.cases = 300;
  options.counterexample_path = file;
  toy::ToyRingProvider buggy(toy::Bug::kRingSizedWindow);
  // A provider the caller owns: the cases run on one thread.
  const auto result = kvcheck::api::check(buggy, options);
  INFO(kvcheck::api::summary(result));
  REQUIRE_FALSE(result.passed);
  REQUIRE(result.found_failure);
  CHECK(result.failures > 0);
  CHECK(result.counterexample.requests.size() == 1);
  CHECK(result.counterexample.steps.size() <= 4);
  CHECK(result.counterexample.steps.size() <= result.original.steps.size());
  CHECK_FALSE(result.counterexample_run.passed);
  CHECK(result.counterexample_run.lost_rows > 0);
  CHECK(result.counterexample_file == file);
  REQUIRE(std::filesystem::exists(file));

  // The file replays: it fails on the buggy cache and passes on the fixed one.
  const auto again = kvcheck::api::replay(buggy, {file});
  REQUIRE(again.size() == 1);
  CHECK_FALSE(again[0].passed);
  toy::ToyRingProvider fixed;
  const auto fixed_runs = kvcheck::api::replay(fixed, {file});
  INFO(kvcheck::api::summary(fixed_runs));
  CHECK(kvcheck::api::all_passed(fixed_runs));
}

TEST_CASE("a bundled scenario replays on the toy ring cache") {
  toy::ToyRingProvider provider;
  const auto runs = kvcheck::api::replay(provider, {ENGINE_TEST_SCENARIO});
  INFO(kvcheck::api::summary(runs));
  REQUIRE(runs.size() == 1);
  CHECK_FALSE(runs[0].skipped);
  CHECK(runs[0].passed);
  CHECK(runs[0].queries > 0);
  CHECK(kvcheck::api::all_passed(runs));
}
