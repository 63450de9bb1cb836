// CPU time of one set of generated cases checked three ways, side by side in
// one run: the plain double reference (--precision 53), the certified
// reference at 113 bits (default) and the all-MPFR reference at 113 bits
// (--reference mpfr). Counters: seconds of each, the ratios to the double
// run (goal: certified <= 1.5x), and the share of queries the certified
// reference had to recompute in MPFR.
#include <benchmark/benchmark.h>

#include <ctime>
#include <vector>

#include "properties/generator.hpp"
#include "properties/runner.hpp"

namespace {

using kvcheck::properties::Reference;
using kvcheck::properties::RunObservation;
using kvcheck::properties::RunOptions;

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Timed {
  double seconds = 0;
  std::int64_t queries = 0;
  std::int64_t mpfr_queries = 0;
};

Timed run_all(const std::vector<kvcheck::scenarios::Scenario>& cases, int bits, Reference reference) {
  RunOptions options;
  options.precision_bits = bits;
  options.reference = reference;
  Timed t;
  const double start = cpu_seconds();
  for (const auto& sc : cases) {
    const RunObservation run = kvcheck::properties::run_scenario(sc, options);
    t.queries += run.queries;
    t.mpfr_queries += run.mpfr_queries;
  }
  t.seconds = cpu_seconds() - start;
  return t;
}

void BM_CertifiedReference(benchmark::State& state) {
  const auto profile = static_cast<kvcheck::properties::Profile>(state.range(0));
  const auto count = static_cast<std::uint64_t>(state.range(1));
  std::vector<kvcheck::scenarios::Scenario> cases;
  for (std::uint64_t i = 0; i < count; ++i)
    cases.push_back(kvcheck::properties::generate_scenario(1 + i, {}, profile));
  Timed plain, certified, mpfr;
  for (auto _ : state) {
    const Timed a = run_all(cases, 53, Reference::kCertified);
    const Timed b = run_all(cases, 113, Reference::kCertified);
    const Timed c = run_all(cases, 113, Reference::kMpfr);
    plain.seconds += a.seconds;
    certified.seconds += b.seconds;
    certified.queries += b.queries;
    certified.mpfr_queries += b.mpfr_queries;
    mpfr.seconds += c.seconds;
  }
  state.counters["double_s"] = plain.seconds;
  state.counters["certified_s"] = certified.seconds;
  state.counters["mpfr_s"] = mpfr.seconds;
  state.counters["certified_x_double"] = certified.seconds / plain.seconds;
  state.counters["mpfr_x_double"] = mpfr.seconds / plain.seconds;
  state.counters["mpfr_query_share"] = certified.queries > 0 ? static_cast<double>(certified.mpfr_queries) /
                                                                   static_cast<double>(certified.queries)
                                                             : 0;
}

// (profile, cases): the default profile's small caches; production shapes.
BENCHMARK(BM_CertifiedReference)->Args({0, 2000})->Args({1, 20})->Unit(benchmark::kSecond)->Iterations(1);

}  // namespace

BENCHMARK_MAIN();
