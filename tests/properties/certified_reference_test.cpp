// The certified reference (model/certified.hpp) against the all-MPFR one:
// on random generated cases, with and without faults, at 113 and 169 bits,
// report.json and report.txt are byte-identical except the field counting
// the queries MPFR computed. KVCHECK_CERTIFIED_CASES sets the case count
// (default 600 per precision, 60 under AddressSanitizer; README gives the
// 10^4 run); KVCHECK_CERTIFIED_PRODUCTION_CASES the production-shape count.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "impl/kv_cache.hpp"
#include "properties/generator.hpp"
#include "properties/runner.hpp"
#include "reports/report.hpp"
#include "reports/report_json.hpp"
#include "reports/report_text.hpp"

namespace kvcheck::properties {
namespace {

std::int64_t case_count(Profile profile) {
  if (profile == Profile::kProduction) {
    const char* env = std::getenv("KVCHECK_CERTIFIED_PRODUCTION_CASES");
#if defined(KVCHECK_SANITIZED_TREE)
    constexpr std::int64_t kProductionDefault = 2;
#else
    constexpr std::int64_t kProductionDefault = 8;
#endif
    return env != nullptr ? std::atoll(env) : kProductionDefault;
  }
  const char* env = std::getenv("KVCHECK_CERTIFIED_CASES");
#if defined(KVCHECK_SANITIZED_TREE)
  constexpr std::int64_t kDefault =
      60;  // the sanitizer build checks the code paths, the Release run the count
#else
  constexpr std::int64_t kDefault = 600;
#endif
  return env != nullptr ? std::atoll(env) : kDefault;
}

/// The run as both reports render it, with the MPFR count set aside.
std::string rendered(RunObservation run) {
  run.mpfr_queries = 0;
  reports::Report report;
  report.context.backend = run.backend;
  report.context.fault = run.fault;
  report.context.precision_bits = run.precision_bits;
  report.runs.push_back(std::move(run));
  return reports::report_json_text(report) + reports::report_text(report);
}

void compare_on_random_cases(int precision_bits, std::uint64_t seed0, Profile profile = Profile::kDefault) {
  const std::int64_t cases = case_count(profile);
  std::int64_t queries = 0, mpfr_queries = 0, failed_runs = 0;
  for (std::int64_t i = 0; i < cases; ++i) {
    const std::uint64_t seed = seed0 + static_cast<std::uint64_t>(i);
    const scenarios::Scenario sc = generate_scenario(seed, {}, profile);
    // A long-context case costs minutes in all-MPFR; README gives the local run that had one.
    if (classify(sc).position_100k && std::getenv("KVCHECK_CERTIFIED_LONG") == nullptr) continue;
    RunOptions options;
    options.precision_bits = precision_bits;
    // Every third case runs a fault, so failing queries and steps are compared too.
    if (i % 3 == 2)
      options.fault = impl::fault_name(static_cast<impl::Fault>(1 + (i / 3) % (impl::kFaultCount - 1)));
    options.reference = Reference::kCertified;
    const RunObservation certified = run_scenario(sc, options);
    options.reference = Reference::kMpfr;
    const RunObservation mpfr = run_scenario(sc, options);
    INFO("seed " << seed << " fault " << options.fault << " precision " << precision_bits);
    REQUIRE(rendered(certified) == rendered(mpfr));
    REQUIRE(certified.mpfr_queries <= mpfr.mpfr_queries);
    queries += mpfr.mpfr_queries;  // every query whose outputs were checked
    mpfr_queries += certified.mpfr_queries;
    failed_runs += mpfr.passed ? 0 : 1;
  }
  std::printf("certified reference, %d bits: %lld cases (%lld failing), %lld of %lld queries needed MPFR\n",
              precision_bits, static_cast<long long>(cases), static_cast<long long>(failed_runs),
              static_cast<long long>(mpfr_queries), static_cast<long long>(queries));
  CHECK(queries > 0);
  // The faults were seen, so failing figures were compared.
  if (profile == Profile::kDefault) CHECK(failed_runs > 0);
  // The bound is useful: nearly every query is decided without MPFR.
  CHECK(mpfr_queries * 100 <= queries);
}

TEST_CASE("Certified reference: reports equal the all-MPFR run's at 113 bits") {
  compare_on_random_cases(113, 1000);
}

TEST_CASE("Certified reference: reports equal the all-MPFR run's at 169 bits") {
  compare_on_random_cases(169, 900000);
}

// Production shapes (heads of 64..256, windows to 8192, GQA, fp8 and bf16;
// KVCHECK_CERTIFIED_PRODUCTION_CASES, default 8, long-context cases skipped
// unless KVCHECK_CERTIFIED_LONG is set: the all-MPFR side costs about a
// quarter second a case, minutes for a long-context one).
TEST_CASE("Certified reference: reports equal the all-MPFR run's on production shapes") {
  compare_on_random_cases(113, 77, Profile::kProduction);
}

}  // namespace
}  // namespace kvcheck::properties
