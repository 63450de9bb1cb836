// exec_protocol_bench: cases per second of `kvcheck check` over the exec
// protocol against the in-process ring pool, at the production profile, on
// the same seed, measured side by side in one run: in-process, exec with
// JSON text (the default encoding), and exec with binary frames
// (--exec-encoding binary), each as a ratio to in-process (goal >= 0.5 for
// binary frames with an adapter that computes in numpy). All three run the
// same reference and the same observation code; the difference is the
// protocol round trip, its encoding, and the adapter's own arithmetic.
//
//   build/bench/exec_protocol_bench [--cases N] [--threads T] [--seed X]
//       [--profile default|production] [--adapter 'COMMAND ARGS'] [--own-cases]
//
// --adapter defaults to the bundled ring adapter (adapters/ring_cache.py,
// pure Python); `--adapter 'python3 python/examples/torch_paged_cache.py'`
// measures the package's numpy rows and tensor answers. The Google
// Benchmark cases (bm_*, 200 default-profile cases each) run only when asked
// for with --benchmark_filter.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "engines/exec_hello.hpp"
#include "properties/agreement.hpp"
#include "properties/check.hpp"
#include "properties/generator.hpp"

#ifndef KVCHECK_SOURCE_DIR
#define KVCHECK_SOURCE_DIR "."
#endif

namespace {

namespace en = kvcheck::engines;
namespace pr = kvcheck::properties;

std::string g_adapter = std::string("python3 ") + KVCHECK_SOURCE_DIR + "/adapters/ring_cache.py";

/// An adapter that imports PyTorch on a loaded machine takes more than the
/// default 10 s to say hello.
constexpr double kStepTimeout = 120;

/// The CPU pool, declaring what both it and the adapter can run.
class DrawsLike final : public en::CacheProvider {
 public:
  DrawsLike(std::unique_ptr<en::CacheProvider> inner, const en::Capabilities& other)
      : inner_(std::move(inner)), caps_(pr::intersect_capabilities(inner_->capabilities(), other)) {}
  const en::Capabilities& capabilities() override { return caps_; }
  std::unique_ptr<en::CacheUnderTest> open(const en::CacheSpec& spec, en::Refusal* refused) override {
    return inner_->open(spec, refused);
  }
  std::string name() const override { return inner_->name(); }

 private:
  std::unique_ptr<en::CacheProvider> inner_;
  en::Capabilities caps_;
};

/// The adapter's capabilities, from its hello; nullopt with --own-cases.
std::optional<en::Capabilities> g_draw_like;

double cases_per_second(const std::string& impl, en::ExecEncoding encoding, std::int64_t cases, int threads,
                        std::uint64_t seed, pr::Profile profile) {
  pr::CheckOptions o;
  if (impl == "cpu" && g_draw_like) {
    o.provider_factory = [] {
      pr::RunOptions cpu;
      cpu.backend = "cpu";
      return std::unique_ptr<en::CacheProvider>(new DrawsLike(pr::make_provider(cpu), *g_draw_like));
    };
  }
  o.cases = cases;
  o.seed = seed;
  o.threads = threads;
  o.profile = profile;
  o.run.backend = impl;
  o.run.exec_encoding = encoding;
  o.run.step_timeout_seconds = kStepTimeout;
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = pr::run_check(o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (r.failures != 0)
    std::fprintf(stderr, "warning: %s had %lld failing cases\n", impl.c_str(), static_cast<long long>(r.failures));
  return static_cast<double>(cases) / s;
}

void bm_check_in_process(benchmark::State& state) {
  for (auto _ : state)
    benchmark::DoNotOptimize(
        cases_per_second("cpu", en::ExecEncoding::kJson, state.range(0), 1, 1, pr::Profile::kDefault));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(bm_check_in_process)->Arg(200)->Unit(benchmark::kMillisecond);

void bm_check_exec_json(benchmark::State& state) {
  for (auto _ : state)
    benchmark::DoNotOptimize(
        cases_per_second("exec:" + g_adapter, en::ExecEncoding::kJson, state.range(0), 1, 1, pr::Profile::kDefault));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(bm_check_exec_json)->Arg(200)->Unit(benchmark::kMillisecond);

void bm_check_exec_binary(benchmark::State& state) {
  for (auto _ : state)
    benchmark::DoNotOptimize(cases_per_second("exec:" + g_adapter, en::ExecEncoding::kBinary, state.range(0), 1, 1,
                                              pr::Profile::kDefault));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(bm_check_exec_binary)->Arg(200)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  std::int64_t cases = 6;
  int threads = 2;
  std::uint64_t seed = 1;
  pr::Profile profile = pr::Profile::kProduction;
  bool google_benchmarks = false;
  bool own_cases = false;
  for (int i = 1; i < argc; ++i) {
    const bool has_value = i + 1 < argc;
    if (has_value && std::strcmp(argv[i], "--cases") == 0) cases = std::atoll(argv[i + 1]);
    if (has_value && std::strcmp(argv[i], "--threads") == 0) threads = std::atoi(argv[i + 1]);
    if (has_value && std::strcmp(argv[i], "--seed") == 0) seed = std::strtoull(argv[i + 1], nullptr, 10);
    if (has_value && std::strcmp(argv[i], "--adapter") == 0) g_adapter = argv[i + 1];
    if (has_value && std::strcmp(argv[i], "--profile") == 0)
      profile = std::strcmp(argv[i + 1], "default") == 0 ? pr::Profile::kDefault : pr::Profile::kProduction;
    if (std::strcmp(argv[i], "--own-cases") == 0) own_cases = true;
    if (std::strncmp(argv[i], "--benchmark_filter", 18) == 0) google_benchmarks = true;
  }
  benchmark::Initialize(&argc, argv);
  if (google_benchmarks) benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (!own_cases) {
    pr::RunOptions adapter;
    adapter.backend = "exec:" + g_adapter;
    adapter.step_timeout_seconds = kStepTimeout;
    g_draw_like = pr::make_provider(adapter)->capabilities();
  }
  // Interleaved, best of two rounds each, so drift on a shared machine hits all three.
  const std::string exec = "exec:" + g_adapter;
  double in_best = 0, json_best = 0, binary_best = 0;
  for (int round = 0; round < 2; ++round) {
    in_best = std::max(in_best, cases_per_second("cpu", en::ExecEncoding::kJson, cases, threads, seed, profile));
    json_best = std::max(json_best, cases_per_second(exec, en::ExecEncoding::kJson, cases, threads, seed, profile));
    binary_best =
        std::max(binary_best, cases_per_second(exec, en::ExecEncoding::kBinary, cases, threads, seed, profile));
  }
  std::printf("check --profile %s, %lld cases, seed %llu, %d threads (best of 2), adapter %s\n",
              pr::profile_name(profile).c_str(), static_cast<long long>(cases),
              static_cast<unsigned long long>(seed), threads, g_adapter.c_str());
  std::printf("  in-process            %8.3f cases/s   %s\n", in_best,
              own_cases ? "(its own cases: --own-cases)" : "(the adapter's cases: capabilities intersected)");
  std::printf("  exec, JSON text       %8.3f cases/s   exec / in-process = %.2f\n", json_best, json_best / in_best);
  std::printf("  exec, binary frames   %8.3f cases/s   exec / in-process = %.2f (goal >= 0.50)\n", binary_best,
              binary_best / in_best);
  return 0;
}
