// Decode attention of the CPU backend over index rows (W = 4096 rows per
// request, head_dim 128, 8 KV heads, 32 query heads) for f32, bf16 and fp8
// pools, and in the same run a plain streaming read of the same pool bytes.
// After the runs, main prints for each format the ratio
// streaming time / attention time (1.0 = attention runs at memory speed).
// One thread, tags off (the production configuration).
//
// Methodology. One request's window is 32 MiB (f32), 16 MiB (bf16) or
// ~8.3 MiB (fp8): it fits, or nearly fits, in the last-level cache, so timing
// one request over and over measures a cache-resident kernel that no real
// decode step runs. A real decode step reads the windows of a whole batch of
// requests from memory. The headline ("batch") measurement is therefore one
// decode step over B requests (B state ids, each with its full W-row window,
// one query position each, 32 query heads each) with B chosen so the batch's
// pool is at least 4x the last-level cache: both the attention and the
// streaming read of exactly the same bytes then come from DRAM. The
// single-request, cache-resident numbers are kept as a second, labelled line
// ("single") so nothing is hidden.
//
// The last-level cache size is read at run time: first from
// /sys/devices/system/cpu/cpu0/cache/index3/size (the L3 that this core can
// allocate into; on AMD parts one CCX's L3), else sysconf(_SC_LEVEL3_CACHE_SIZE)
// (which on some virtual machines reports the whole socket's L3), else 32 MiB.
// --kv_llc_mib=N overrides it.
//
//   build-cpuperf/bench/decode_attention_bench --benchmark_min_time=0.3
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
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
/// The batch's pool is at least this many times the last-level cache.
constexpr std::int64_t kLlcMultiple = 4;

/// Where the last-level cache size came from, for the printed methodology.
struct LlcInfo {
  std::int64_t bytes = 0;
  std::string source;
};

/// Parses a sysfs cache size ("32768K", "32M", "1048576").
std::int64_t parse_cache_size(const std::string& text) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (v <= 0 || end == text.c_str()) return 0;
  if (*end == 'K' || *end == 'k') return v * 1024;
  if (*end == 'M' || *end == 'm') return v * 1024 * 1024;
  if (*end == 'G' || *end == 'g') return v * 1024 * 1024 * 1024;
  return v;
}

LlcInfo query_llc(std::int64_t override_mib) {
  if (override_mib > 0) return {override_mib * 1024 * 1024, "--kv_llc_mib"};
  {
    std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index3/size");
    std::string text;
    if (f >> text) {
      if (const std::int64_t b = parse_cache_size(text); b > 0) {
        return {b, "/sys/devices/system/cpu/cpu0/cache/index3/size"};
      }
    }
  }
#ifdef _SC_LEVEL3_CACHE_SIZE
  if (const long b = sysconf(_SC_LEVEL3_CACHE_SIZE); b > 0) return {b, "sysconf(_SC_LEVEL3_CACHE_SIZE)"};
#endif
  return {std::int64_t{32} * 1024 * 1024, "fallback"};
}

LlcInfo& llc() {
  static LlcInfo info;
  return info;
}

/// Bytes of one request's window (W slots, key row + value row each).
std::int64_t request_bytes(ElementFormat f) {
  return kWindow * 2 * kvcheck::format_row_bytes(f, std::int64_t{kKvHeads} * kHeadDim);
}

/// Requests in the DRAM-resident batch: pool >= kLlcMultiple x LLC, at least 2.
std::int64_t batch_requests(ElementFormat f) {
  const std::int64_t want = kLlcMultiple * llc().bytes;
  return std::max<std::int64_t>(2, (want + request_bytes(f) - 1) / request_bytes(f));
}

/// A filled pool of `requests` state ids (each a full W-row window), the
/// index rows of one decode query per state, and the queries.
struct Fixture {
  CpuBackend backend;
  std::int64_t requests = 0;
  std::vector<std::int64_t> index;          // [requests, W]
  std::vector<double> q;                    // [requests, q_heads, head_dim]
  std::vector<double> out;                  // [requests, q_heads, head_dim]
  std::vector<std::int64_t> rope_position;  // [requests]
};

Fixture& fixture(ElementFormat f, bool batch) {
  static std::map<std::pair<ElementFormat, bool>, std::unique_ptr<Fixture>> cache;
  auto& slot = cache[{f, batch}];
  if (slot) return *slot;
  slot = std::make_unique<Fixture>();
  Fixture& fx = *slot;
  fx.requests = batch ? batch_requests(f) : 1;
  PoolSpec spec;
  spec.states = fx.requests;
  // ring_rows == W: the pool holds exactly the windows, so the streaming read
  // below covers the same bytes the attention reads, no more.
  spec.ring_rows = kWindow;
  spec.window_keys = kWindow;
  spec.q_heads = kQHeads;
  spec.kv_heads = kKvHeads;
  spec.head_dim = kHeadDim;
  spec.format = f;
  spec.rope_style = kvcheck::impl::RopeStyle::kNeox;
  spec.rope_dims = 64;
  spec.max_step_rows = std::max<std::int64_t>(256, fx.requests);
  spec.track_tags = false;
  KVCHECK_ASSERT(fx.backend.configure(spec).ok());
  kvcheck::Prng prng(42);
  const std::int64_t chunk = 256, row = std::int64_t{kKvHeads} * kHeadDim;
  std::vector<double> k(static_cast<std::size_t>(chunk * row)), v(k.size());
  std::vector<std::int64_t> slots(static_cast<std::size_t>(chunk)), pos(slots.size());
  for (std::int64_t b = 0; b < fx.requests; ++b) {
    for (std::int64_t first = 0; first < kWindow; first += chunk) {
      for (auto& x : k) x = prng.signed_unit();
      for (auto& x : v) x = prng.signed_unit();
      for (std::int64_t i = 0; i < chunk; ++i) {
        pos[static_cast<std::size_t>(i)] = first + i;
        slots[static_cast<std::size_t>(i)] = b * kWindow + first + i;
      }
      kvcheck::impl::StoreReport report;
      KVCHECK_ASSERT(fx.backend.store(slots, pos, k.data(), v.data(), {}, &report).ok());
    }
  }
  // Each request's query sits at position W - 1 and sees its whole block.
  fx.index.resize(static_cast<std::size_t>(fx.requests * kWindow));
  for (std::int64_t b = 0; b < fx.requests; ++b) {
    for (std::int64_t c = 0; c < kWindow; ++c)
      fx.index[static_cast<std::size_t>(b * kWindow + c)] = b * kWindow + c;
  }
  fx.rope_position.assign(static_cast<std::size_t>(fx.requests), kWindow - 1);
  fx.q.resize(static_cast<std::size_t>(fx.requests * kQHeads * kHeadDim));
  for (auto& x : fx.q) x = prng.signed_unit();
  fx.out.resize(fx.q.size());
  return fx;
}

/// Bytes of the pool's slots without inter-slot padding (what attention reads).
std::size_t logical_bytes(Fixture& fx) {
  const auto stride = static_cast<std::size_t>(fx.backend.slot_stride());
  return fx.backend.pool_bytes().size() / stride * static_cast<std::size_t>(fx.backend.slot_bytes());
}

void bm_attend(benchmark::State& state, ElementFormat f, bool batch) {
  Fixture& fx = fixture(f, batch);
  for (auto _ : state) {
    const auto st = fx.backend.attend(KvSource::kPool, fx.rope_position, fx.q.data(), fx.index, kWindow,
                                      fx.out.data(), nullptr, nullptr);
    benchmark::DoNotOptimize(st.code);
    benchmark::DoNotOptimize(fx.out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(logical_bytes(fx)));
  state.counters["requests"] = static_cast<double>(fx.requests);
}

/// Sums n 64-bit words in eight independent lanes: the fastest plain read
/// this core does (multiversioned like the kernel, so the baseline gets the
/// same vector width the attention gets).
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) std::uint64_t stream_sum(
    const std::uint64_t* words, std::size_t n) {
  std::uint64_t s[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) s[l] += words[i + static_cast<std::size_t>(l)];
  }
  for (; i < n; ++i) s[0] += words[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// The streaming baseline: one pass over the same pool bytes (what a
// memory-bound kernel at best has to do). Slots may sit slot_stride() apart
// with a few padding bytes between them; the padding is skipped, so both
// sides touch exactly the slot bytes the attention reads.
void bm_stream(benchmark::State& state, ElementFormat f, bool batch) {
  Fixture& fx = fixture(f, batch);
  const auto bytes = fx.backend.pool_bytes();
  const auto stride = static_cast<std::size_t>(fx.backend.slot_stride());
  const auto slot_words = static_cast<std::size_t>(fx.backend.slot_bytes()) / sizeof(std::uint64_t);
  const std::size_t slots = bytes.size() / stride;
  for (auto _ : state) {
    std::uint64_t sum = 0;
    for (std::size_t s = 0; s < slots; ++s) {
      sum += stream_sum(reinterpret_cast<const std::uint64_t*>(bytes.data() + s * stride), slot_words);
    }
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(logical_bytes(fx)));
  state.counters["requests"] = static_cast<double>(fx.requests);
}

/// Console output plus a record of each run's real and CPU time per iteration.
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
  // Our own flag, taken out before Google Benchmark sees the arguments.
  std::int64_t llc_override_mib = 0;
  int kept = 1;
  for (int a = 1; a < argc; ++a) {
    constexpr const char* kFlag = "--kv_llc_mib=";
    if (std::strncmp(argv[a], kFlag, std::strlen(kFlag)) == 0) {
      llc_override_mib = std::strtoll(argv[a] + std::strlen(kFlag), nullptr, 10);
      if (llc_override_mib <= 0) {
        std::fprintf(stderr, "decode_attention_bench: %s: expected a positive number of MiB\n", argv[a]);
        return 2;
      }
    } else {
      argv[kept++] = argv[a];
    }
  }
  argc = kept;
  llc() = query_llc(llc_override_mib);

  struct Format {
    const char* name;
    ElementFormat format;
    double target;
  };
  // Targets of issue 13 (item 3) for the DRAM-resident batch.
  const Format formats[] = {{"f32", ElementFormat::kF32, 0.75},
                            {"bf16", ElementFormat::kBf16, 0.75},
                            {"fp8", ElementFormat::kFp8, 0.6}};
  const std::pair<const char*, bool> modes[] = {{"batch", true}, {"single", false}};
  for (const auto& fm : formats) {
    for (const auto& [mode, batch] : modes) {
      const std::string suffix = std::string(fm.name) + "/" + mode;
      benchmark::RegisterBenchmark(("decode_attend/" + suffix).c_str(), bm_attend, fm.format, batch)
          ->Unit(benchmark::kMicrosecond);
      benchmark::RegisterBenchmark(("stream_read/" + suffix).c_str(), bm_stream, fm.format, batch)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  std::printf("last-level cache: %lld KiB (from %s); batch = requests whose pool is >= %lldx that\n",
              static_cast<long long>(llc().bytes / 1024), llc().source.c_str(),
              static_cast<long long>(kLlcMultiple));
  for (const auto& fm : formats) {
    std::printf(
        "  %-5s one request %.1f MiB, batch %lld requests = %.1f MiB\n", fm.name,
        static_cast<double>(request_bytes(fm.format)) / (1024.0 * 1024.0),
        static_cast<long long>(batch_requests(fm.format)),
        static_cast<double>(batch_requests(fm.format) * request_bytes(fm.format)) / (1024.0 * 1024.0));
  }
  std::fflush(stdout);
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);

  // Real time is the target's measure; CPU time is printed beside it because
  // on a shared machine real time includes waiting for a core.
  std::printf("\nratio = streaming-read time / attention time over the same bytes, one core, tags off\n");
  std::printf("  batch : one decode step over a batch >= %lldx LLC (DRAM-resident; the target)\n",
              static_cast<long long>(kLlcMultiple));
  std::printf("  single: one request, cache-resident (for reference; no real decode step sees this)\n");
  for (const auto& [mode, batch] : modes) {
    for (const auto& fm : formats) {
      const std::string suffix = std::string(fm.name) + "/" + mode;
      const std::string an = "decode_attend/" + suffix, sn = "stream_read/" + suffix;
      if (reporter.seconds_.count(an) == 0 || reporter.seconds_.count(sn) == 0) continue;
      const double real = reporter.seconds_[sn] / reporter.seconds_[an];
      const double cpu = reporter.cpu_seconds_[sn] / reporter.cpu_seconds_[an];
      if (batch) {
        std::printf("ratio %-5s %-6s %.2f (target %.2f) %s   [cpu-time ratio %.2f]\n", fm.name, mode, real,
                    fm.target, real >= fm.target ? "met" : "NOT met", cpu);
      } else {
        std::printf("ratio %-5s %-6s %.2f (cache-resident, no target)   [cpu-time ratio %.2f]\n", fm.name,
                    mode, real, cpu);
      }
    }
  }
  return 0;
}
