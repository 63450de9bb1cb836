// Decode attention of the CPU backend over one query's index row
// (W = 4096 rows, head_dim 128, 8 KV heads, 32 query heads) for f32, bf16 and
// fp8 pools, and in the same run a plain streaming read of the same pool
// bytes. After the runs, main prints for each format the ratio
// streaming time / attention time (1.0 = attention runs at memory speed).
// One thread, tags off (the production configuration).
//
//   build-cpu/bench/decode_attention_bench [--benchmark_min_time=0.5]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "impl/cpu/cpu_backend.hpp"
#include "impl/kv_cache.hpp"
#include "support/assert.hpp"
#include "support/prng.hpp"

namespace {

using kvcheck::impl::ElementFormat;
using kvcheck::impl::KvSource;
using kvcheck::impl::PoolSpec;
using kvcheck::impl::cpu::CpuBackend;

constexpr std::int64_t kWindow = 4096;
constexpr std::int32_t kHeadDim = 128;
constexpr std::int32_t kKvHeads = 8;
constexpr std::int32_t kQHeads = 32;

/// A filled pool, its index row and one query, per format.
struct Fixture {
  CpuBackend backend;
  std::vector<std::int64_t> index;  // [1, W]
  std::vector<double> q;            // [1, q_heads, head_dim]
  std::vector<double> out;          // [1, q_heads, head_dim]
  std::vector<std::int64_t> rope_position{kWindow - 1};
};

Fixture& fixture(ElementFormat f) {
  static std::map<ElementFormat, std::unique_ptr<Fixture>> cache;
  auto& slot = cache[f];
  if (slot) return *slot;
  slot = std::make_unique<Fixture>();
  Fixture& fx = *slot;
  PoolSpec spec;
  spec.states = 1;
  spec.ring_rows = kWindow;
  spec.window_rows = kWindow;
  spec.q_heads = kQHeads;
  spec.kv_heads = kKvHeads;
  spec.head_dim = kHeadDim;
  spec.format = f;
  spec.rope_style = kvcheck::impl::RopeStyle::kNeox;
  spec.rope_dims = 64;
  spec.max_step_rows = 256;
  spec.track_tags = false;
  KVCHECK_ASSERT(fx.backend.configure(spec).ok());
  kvcheck::Prng prng(42);
  const std::int64_t chunk = 256, row = std::int64_t{kKvHeads} * kHeadDim;
  std::vector<double> k(static_cast<std::size_t>(chunk * row)), v(k.size());
  std::vector<std::int64_t> slots(static_cast<std::size_t>(chunk)), pos(slots.size());
  for (std::int64_t first = 0; first < kWindow; first += chunk) {
    for (auto& x : k) x = prng.signed_unit();
    for (auto& x : v) x = prng.signed_unit();
    for (std::int64_t i = 0; i < chunk; ++i) slots[static_cast<std::size_t>(i)] = pos[static_cast<std::size_t>(i)] = first + i;
    kvcheck::impl::StoreReport report;
    KVCHECK_ASSERT(fx.backend.store(slots, pos, k.data(), v.data(), {}, &report).ok());
  }
  fx.index.resize(kWindow);
  std::iota(fx.index.begin(), fx.index.end(), 0);
  fx.q.resize(static_cast<std::size_t>(kQHeads * kHeadDim));
  for (auto& x : fx.q) x = prng.signed_unit();
  fx.out.resize(fx.q.size());
  return fx;
}

void bm_attend(benchmark::State& state, ElementFormat f) {
  Fixture& fx = fixture(f);
  for (auto _ : state) {
    const auto st = fx.backend.attend(KvSource::kPool, fx.rope_position, fx.q.data(), fx.index,
                                      kWindow, fx.out.data(), nullptr, nullptr);
    benchmark::DoNotOptimize(st.code);
    benchmark::DoNotOptimize(fx.out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(fx.backend.pool_bytes().size()));
}

// The streaming baseline: one pass over the same pool bytes, summed as
// 64-bit words (what a memory-bound kernel at best has to do).
void bm_stream(benchmark::State& state, ElementFormat f) {
  Fixture& fx = fixture(f);
  const auto bytes = fx.backend.pool_bytes();
  const auto* words = reinterpret_cast<const std::uint64_t*>(bytes.data());
  const std::size_t n = bytes.size() / sizeof(std::uint64_t);
  for (auto _ : state) {
    std::uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (std::size_t i = 0; i + 4 <= n; i += 4) {
      s0 += words[i];
      s1 += words[i + 1];
      s2 += words[i + 2];
      s3 += words[i + 3];
    }
    benchmark::DoNotOptimize(s0 + s1 + s2 + s3);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes.size()));
}

/// Console output plus a record of each run's real time per iteration.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs) {
      if (r.run_type == Run::RT_Iteration) {
        seconds_[r.benchmark_name()] = r.GetAdjustedRealTime();
        cpu_seconds_[r.benchmark_name()] = r.GetAdjustedCPUTime();
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, double> seconds_;
  std::map<std::string, double> cpu_seconds_;
};

}  // namespace

int main(int argc, char** argv) {
  const std::pair<const char*, ElementFormat> formats[] = {
      {"f32", ElementFormat::kF32}, {"bf16", ElementFormat::kBf16}, {"fp8", ElementFormat::kFp8E4m3}};
  for (const auto& [name, f] : formats) {
    benchmark::RegisterBenchmark((std::string("decode_attend/") + name).c_str(), bm_attend, f)
        ->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark((std::string("stream_read/") + name).c_str(), bm_stream, f)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  const double targets[] = {0.7, 0.7, 0.5};
  int i = 0;
  for (const auto& [name, f] : formats) {
    const std::string an = std::string("decode_attend/") + name;
    const std::string sn = std::string("stream_read/") + name;
    if (reporter.seconds_.count(an) != 0 && reporter.seconds_.count(sn) != 0) {
      // Real time is the target's measure; CPU time is printed beside it
      // because on a shared machine real time includes waiting for a core.
      const double real = reporter.seconds_[sn] / reporter.seconds_[an];
      const double cpu = reporter.cpu_seconds_[sn] / reporter.cpu_seconds_[an];
      std::printf("ratio %-5s streaming/attention = %.3f real, %.3f cpu (target >= %.1f) %s\n", name,
                  real, cpu, targets[i], real >= targets[i] ? "ok" : "BELOW");
    }
    ++i;
  }
  return 0;
}
