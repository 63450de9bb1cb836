// exec_protocol_bench: cases per second of `kvcheck check` over the exec
// protocol (the bundled Python ring adapter, one child per worker) against
// the in-process ring pool on the same seeds and the same generator sizes,
// measured side by side in one run and printed as a ratio (goal >= 0.3).
// Both sides run the same reference (113-bit MPFR) and the same observation
// code; the difference is the protocol round trip and the adapter's Python.
//
//   build/bench/exec_protocol_bench [--cases N] [--threads T]
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "properties/check.hpp"

#ifndef KVCHECK_SOURCE_DIR
#define KVCHECK_SOURCE_DIR "."
#endif

namespace {

double cases_per_second(const std::string& impl, std::int64_t cases, int threads) {
  kvcheck::properties::CheckOptions o;
  o.cases = cases;
  o.seed = 1;
  o.threads = threads;
  o.run.backend = impl;
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = kvcheck::properties::run_check(o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (r.failures != 0)
    std::fprintf(stderr, "warning: %s had %lld failing cases\n", impl.c_str(),
                 static_cast<long long>(r.failures));
  return static_cast<double>(cases) / s;
}

const std::string kRing = std::string("exec:python3 ") + KVCHECK_SOURCE_DIR + "/adapters/ring_cache.py";

void bm_check_in_process(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(cases_per_second("cpu", state.range(0), 1));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(bm_check_in_process)->Arg(200)->Unit(benchmark::kMillisecond);

void bm_check_exec_ring(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(cases_per_second(kRing, state.range(0), 1));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(bm_check_exec_ring)->Arg(200)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  std::int64_t cases = 2000;
  int threads = 2;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--cases") == 0) cases = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--threads") == 0) threads = std::atoi(argv[i + 1]);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  // Interleaved, three rounds each, so drift on a shared machine hits both.
  double in_best = 0, ex_best = 0;
  for (int round = 0; round < 3; ++round) {
    in_best = std::max(in_best, cases_per_second("cpu", cases, threads));
    ex_best = std::max(ex_best, cases_per_second(kRing, cases, threads));
  }
  std::printf(
      "check, %lld cases, seed 1, %d threads (best of 3): in-process %.0f cases/s, exec ring adapter %.0f "
      "cases/s\n",
      static_cast<long long>(cases), threads, in_best, ex_best);
  std::printf("exec / in-process = %.2f (goal >= 0.30)\n", ex_best / in_best);
  return 0;
}
