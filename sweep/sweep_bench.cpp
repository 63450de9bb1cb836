// kvcheck_sweep_bench: the cost of one probe (Google Benchmark), then the
// whole default grid (W 64..4096 step 64, k 0..16, C 1/16/256, both orders)
// with the galloping search on two threads, and the ratio against the
// baseline that probes every ring size from W upwards. The baseline is timed
// on a sample (every 8th window, all drafts, chunks and orders: 1/8 of the
// grid, the same sample timed with the galloping search) and extrapolated to
// the full grid by the ratio measured on the sample.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>

#include "sweep/sweep.hpp"

namespace {

using namespace kvcheck::sweep;

void bm_probe(benchmark::State& state) {
  const SweepConfig c{state.range(0), state.range(1), state.range(2), SweepOrder::kStoreThenLoad};
  const std::int64_t s = spec_bound(c);
  ProbeOptions options;
  for (auto _ : state) benchmark::DoNotOptimize(probe_ring(c, s, options).safe);
}
BENCHMARK(bm_probe)
    ->Args({128, 5, 1})
    ->Args({4096, 16, 256})
    ->Args({4096, 0, 1})
    ->Unit(benchmark::kMicrosecond);

double seconds_of(const SweepGrid& grid, bool linear, std::int64_t* probes) {
  SweepOptions o;
  o.threads = 2;
  o.linear_search = linear;
  o.counterexamples = CounterexampleMode::kNone;
  const auto t0 = std::chrono::steady_clock::now();
  const SweepResult r = run_sweep(grid, o);
  const auto t1 = std::chrono::steady_clock::now();
  *probes = r.probes;
  return std::chrono::duration<double>(t1 - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();

  const SweepGrid grid = default_grid();
  std::int64_t probes = 0;
  const double full = seconds_of(grid, false, &probes);
  std::printf("default grid: %lld configurations, %lld probes, %.3f s (galloping search, 2 threads)\n",
              static_cast<long long>(grid.size()), static_cast<long long>(probes), full);

  SweepGrid sample = grid;
  sample.windows.clear();
  for (std::size_t i = 0; i < grid.windows.size(); i += 8) sample.windows.push_back(grid.windows[i]);
  std::int64_t sp = 0, lp = 0;
  const double smart = seconds_of(sample, false, &sp);
  const double linear = seconds_of(sample, true, &lp);
  std::printf(
      "sample (every 8th window, %lld configurations): galloping %.3f s (%lld probes), "
      "linear from W %.3f s (%lld probes), ratio %.1fx\n",
      static_cast<long long>(sample.size()), smart, static_cast<long long>(sp), linear,
      static_cast<long long>(lp), linear / smart);
  std::printf("default grid, linear scan extrapolated: %.1f s; galloping search is %.1fx faster\n",
              full * linear / smart, linear / smart);
  return 0;
}
