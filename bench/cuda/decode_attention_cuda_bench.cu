// Decode attention over index rows on the GPU, through ring_attend_launch of
// impl/cuda/ring_kernels.cuh (the backend's own launcher), for bf16 and fp8
// rows, head_dim 128, 8 KV heads, 32 query heads (GQA 4), on two shapes:
//   decode: batch 64 queries x W = 4096 keys each (the engine's decode step);
//   long:   batch 1 x 32768 keys (the split-K case: 8 blocks' worth of work
//           without splitting).
// Each shape runs three measurements in the same process, one after another:
//   fast     the production path (ring_fast_attend.cuh: cp.async gather +
//            tensor cores, splits combined in the same launch);
//   general  the general split + combine kernel (what ran before), for the
//            record of what the fast kernel changed;
//   copy     cudaMemcpyAsync device-to-device of the same number of bytes.
// Bytes are those the kernel must read: every index column's key and value
// head rows, fp8 scale bytes included. Before every timed launch a 256 MiB
// buffer is read so no row is served from the 50 MiB L2 (read, not written:
// dirty lines would be written back inside the next timed launch); only the
// launch is inside the CUDA events.
// After the runs main prints, per shape and format: GB/s, the ratio to the
// device's peak memory bandwidth (memoryClockRate x 2 x busWidth / 8, queried
// at run time), the ratio to the same-run copy rate, and the target
// (>= 0.85 of peak for bf16, >= 0.8 for fp8) with met / NOT met. It also
// prints the largest difference between the fast and the general kernel's
// outputs on the same inputs, relative to the largest output.
// Without a device it prints one line and exits 0.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "impl/cuda/ring_kernels.cuh"
#include "impl/element_format.hpp"
#include "impl/ring_index.hpp"

namespace {

using kvcheck::impl::ElementFormat;
namespace kc = kvcheck::impl::cuda;

constexpr std::int32_t kHeadDim = 128;
constexpr std::int64_t kFlushBytes = std::int64_t{256} << 20;

struct Shape {
  const char* name;
  std::int64_t batch;
  std::int64_t window;
  std::int64_t position;  // past the wrap: index rows start mid-ring
  std::int32_t kv_heads;
  std::int32_t q_heads;
};
constexpr Shape kShapes[] = {{"decode b64 w4096", 64, 4096, 10000, 8, 32},
                             {"long b1 w32768", 1, 32768, 100000, 8, 32}};
constexpr int kShapeCount = sizeof(kShapes) / sizeof(kShapes[0]);

// kFast is the backend's configuration (FastDefault: slot-major for the
// decode shape, warp-pipelined for split-K); kBlock is the block-tile kernel
// (ring_fast_attend_kernel, 4 warps, 3 stages bf16 / 4 fp8: the first
// default), the kW* kinds are other configurations of the warp-pipelined
// kernel (warps, stages per warp) and the kS* kinds of the slot-major one,
// measured beside it so the choice of FastDefault stays a measurement.
// kS8S2K8 is the slot-major kernel in clusters of 8 splits (DSMEM merge);
// kW8S2B and kSlotB are kFast's two configurations with the batched index
// preload (fast_load_slots), to be measured against kFast in one run.
enum class Kind {
  kFast,
  kGeneral,
  kCopy,
  kBlock,
  kW4S3,
  kW8S2,
  kS8S2C,
  kS8S3,
  kS8S3H2,
  kS8S2H2,
  kS4S3H2,
  kS8S2M2,
  kS8S3M2,
  kS4S3M3,
  kS8S2K8,
  kW8S2B,
  kSlotB
};
constexpr Kind kAllKinds[] = {Kind::kFast,   Kind::kGeneral, Kind::kCopy,   Kind::kBlock,  Kind::kW4S3,
                              Kind::kW8S2,   Kind::kS8S2C,   Kind::kS8S3,   Kind::kS8S3H2, Kind::kS8S2H2,
                              Kind::kS4S3H2, Kind::kS8S2M2,  Kind::kS8S3M2, Kind::kS4S3M3, Kind::kS8S2K8,
                              Kind::kW8S2B,  Kind::kSlotB};

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::kFast: return "fast";
    case Kind::kGeneral: return "general";
    case Kind::kCopy: return "copy";
    case Kind::kBlock: return "block-tile";
    case Kind::kW4S3: return "warp w4s3";
    case Kind::kW8S2: return "warp w8s2";
    case Kind::kS8S2C: return "slot w8s2 c";
    case Kind::kS8S3: return "slot w8s3";
    case Kind::kS8S3H2: return "slot w8s3 h2";
    case Kind::kS8S2H2: return "slot w8s2 h2";
    case Kind::kS4S3H2: return "slot w4s3 h2";
    case Kind::kS8S2M2: return "slot w8s2 m2";
    case Kind::kS8S3M2: return "slot w8s3 m2";
    case Kind::kS4S3M3: return "slot w4s3 m3";
    case Kind::kS8S2K8: return "slot w8s2 k8";
    case Kind::kW8S2B: return "warp w8s2 bi";
    case Kind::kSlotB: return "slot bi";
  }
  return "?";
}

/// Whether `kind` is measured on shape `s` (the long shape runs fewer).
bool measured(int s, Kind kind) {
  if (s == 0) return kind != Kind::kS8S2K8 && kind != Kind::kW8S2B;
  return kind == Kind::kFast || kind == Kind::kGeneral || kind == Kind::kCopy || kind == Kind::kBlock ||
         kind == Kind::kW4S3 || kind == Kind::kW8S2 || kind == Kind::kS8S3 || kind == Kind::kS8S3H2 ||
         kind == Kind::kS8S2K8 || kind == Kind::kW8S2B;
}

/// Whether `kind` is the slot-major kernel (measured on the long shape with
/// up to kBenchMaxSplits splits: its blocks are one per (query, split)).
bool slot_major(Kind kind) {
  return kind == Kind::kS8S2C || kind == Kind::kS8S3 || kind == Kind::kS8S3H2 || kind == Kind::kS8S2H2 ||
         kind == Kind::kS4S3H2 || kind == Kind::kS8S2M2 || kind == Kind::kS8S3M2 || kind == Kind::kS4S3M3 ||
         kind == Kind::kS8S2K8;
}

/// Splits and launch of one fast-kernel configuration G over `a`.
template <ElementFormat F, class G>
cudaError_t launch_variant(kc::AttendArgs<float>& a, int sm_count, std::int32_t max_splits, bool choose) {
  if (choose) {
    a.splits = kc::ring_fast_choose_splits<F, G>(a, sm_count, max_splits);
    return a.splits > 0 ? cudaSuccess : cudaErrorInvalidConfiguration;
  }
  return kc::ring_fast_attend_launch<F, G>(a, nullptr);
}

double g_peak_bytes_per_s = 0.0;
std::map<std::string, double> g_rates;        // "shape|format|kind" -> bytes/s
std::map<std::string, int> g_splits;          // "shape|format|kind" -> splits of the launch
std::map<std::string, double> g_differences;  // "shape|format" -> max |fast - general| / max |out|

/// Fills every slot with finite pseudo-random rows of format F (a hash of the
/// byte position; fp8 codes avoid NaN, scales near 1).
template <ElementFormat F>
__global__ void fill_pool_kernel(std::uint8_t* pool, std::int64_t slots, kc::SlotLayout layout) {
  const std::int64_t total = slots * layout.slot_bytes;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint64_t h = static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 32;
    const std::int64_t o = (i % layout.slot_bytes) % layout.row_bytes;
    if constexpr (F == ElementFormat::kBf16) {
      if (o % 2 == 0) {
        const float x = static_cast<float>(static_cast<std::int64_t>(h % 2001) - 1000) / 1000.0f;
        const std::uint16_t b = kvcheck::impl::bf16_from_float(x);
        pool[i] = static_cast<std::uint8_t>(b & 0xFF);
        pool[i + 1] = static_cast<std::uint8_t>(b >> 8);
      }
    } else {
      pool[i] = o < layout.row_elements ? static_cast<std::uint8_t>(h & 0xF7)
                                        : static_cast<std::uint8_t>(120 + (h & 7));
    }
  }
}

__global__ void fill_query_kernel(float* q, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    q[i] = static_cast<float>((i * 7919) % 2001 - 1000) / 8000.0f;
  }
}

/// Reads n bytes and keeps a sum nobody uses: evicts L2 without leaving
/// dirty lines (a memset would, and their write-back would land in the
/// next timed launch).
__global__ void flush_l2_kernel(const uint4* p, std::int64_t n, unsigned int* sink) {
  unsigned int acc = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;  // practically never: keeps the loads
}

/// Device memory of one shape and format, freed on scope exit.
struct Buffers {
  std::vector<void*> owned;
  ~Buffers() {
    for (void* p : owned) cudaFree(p);
  }
  template <class T>
  cudaError_t get(T** p, std::int64_t count) {
    void* raw = nullptr;
    const cudaError_t err = cudaMalloc(&raw, static_cast<std::size_t>(count) * sizeof(T));
    if (err == cudaSuccess) owned.push_back(raw);
    *p = static_cast<T*>(raw);
    return err;
  }
};

bool check(cudaError_t err, const char* what, benchmark::State& state) {
  if (err == cudaSuccess) return true;
  state.SkipWithError((std::string(what) + ": " + cudaGetErrorString(err)).c_str());
  return false;
}

std::string key(const Shape& shape, ElementFormat format, Kind kind) {
  return std::string(shape.name) + "|" + (format == ElementFormat::kBf16 ? "bf16" : "fp8") + "|" +
         kind_name(kind);
}

template <ElementFormat F>
void BM_decode_attention(benchmark::State& state, int shape_index, Kind kind) {
  const Shape& shape = kShapes[shape_index];
  kc::SlotLayout layout;
  layout.kv_heads = shape.kv_heads;
  layout.head_dim = kHeadDim;
  layout.row_elements = static_cast<std::int64_t>(shape.kv_heads) * kHeadDim;
  layout.row_bytes = kvcheck::format_row_bytes(F, layout.row_elements);
  layout.slot_bytes = 2 * layout.row_bytes;
  const std::int64_t ring = shape.window;  // decode only: no verify slack needed
  const std::int64_t slots = shape.batch * ring;
  const std::int64_t q_elements = shape.batch * shape.q_heads * kHeadDim;
  const std::int64_t head_row_bytes =
      F == ElementFormat::kFp8 ? kHeadDim + (kHeadDim + 31) / 32 : 2 * kHeadDim;
  const std::int64_t bytes = shape.batch * shape.window * shape.kv_heads * 2 * head_row_bytes;

  // Index rows from the shared host/device math: query b decodes state b.
  std::vector<std::int64_t> index(static_cast<std::size_t>(shape.batch * shape.window));
  for (std::int64_t b = 0; b < shape.batch; ++b) {
    const auto m = kvcheck::impl::ring_metadata(b, shape.position, shape.window, ring, shape.batch,
                                                kvcheck::impl::Fault::kNone);
    for (std::int64_t c = 0; c < shape.window; ++c) {
      index[static_cast<std::size_t>(b * shape.window + c)] =
          kvcheck::impl::ring_index_column(m, c, ring, kvcheck::impl::Fault::kNone);
    }
  }
  int sm_count = 1;
  cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0);
  constexpr std::int32_t kMaxSplits = kc::kAttendMaxSplits;  // the backend's cap
  constexpr std::int32_t kBenchMaxSplits = 256;  // the slot-major variants' cap here

  Buffers buf;
  std::uint8_t* pool = nullptr;
  std::uint8_t* copy_dst = nullptr;
  std::uint8_t* flush = nullptr;
  std::int64_t* d_index = nullptr;
  float* q = nullptr;
  float* part_acc = nullptr;
  float* part_ml = nullptr;
  double* out = nullptr;
  unsigned int* counters = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  bool ok =
      check(buf.get(&pool, slots * layout.slot_bytes), "cudaMalloc(pool)", state) &&
      check(buf.get(&flush, kFlushBytes), "cudaMalloc(flush)", state) &&
      check(buf.get(&d_index, static_cast<std::int64_t>(index.size())), "cudaMalloc(index)", state) &&
      check(buf.get(&q, q_elements), "cudaMalloc(q)", state) &&
      check(buf.get(&part_acc, q_elements * kBenchMaxSplits), "cudaMalloc(part)", state) &&
      check(buf.get(&part_ml, shape.batch * shape.q_heads * kBenchMaxSplits * 2), "cudaMalloc(ml)", state) &&
      check(buf.get(&out, q_elements), "cudaMalloc(out)", state) &&
      check(buf.get(&counters, shape.batch * shape.q_heads), "cudaMalloc(counters)", state) &&
      (kind != Kind::kCopy || check(buf.get(&copy_dst, bytes), "cudaMalloc(copy)", state)) &&
      check(cudaMemset(flush, 1, static_cast<std::size_t>(kFlushBytes)), "cudaMemset(flush)", state) &&
      check(cudaMemset(counters, 0, static_cast<std::size_t>(shape.batch * shape.q_heads) * 4),
            "cudaMemset(counters)", state) &&
      check(cudaMemcpy(d_index, index.data(), index.size() * sizeof(std::int64_t), cudaMemcpyHostToDevice),
            "cudaMemcpy(index)", state) &&
      check(cudaEventCreate(&start), "cudaEventCreate", state) &&
      check(cudaEventCreate(&stop), "cudaEventCreate", state);
  if (ok) {
    fill_pool_kernel<F><<<4096, 256>>>(pool, slots, layout);
    fill_query_kernel<<<1024, 256>>>(q, q_elements);
    ok = check(cudaGetLastError(), "fill kernels", state) &&
         check(cudaDeviceSynchronize(), "fill sync", state);
  }
  kc::AttendArgs<float> a;
  a.q = q;
  a.index = d_index;
  a.rows = pool;
  a.row_count = slots;
  a.n = shape.batch;
  a.width = shape.window;
  a.q_heads = shape.q_heads;
  a.layout = layout;
  a.scale = 1.0f;  // q is pre-scaled, as the backend does for float pools
  a.part_acc = part_acc;
  a.part_ml = part_ml;
  a.out = out;
  a.counters = kind == Kind::kGeneral || kind == Kind::kCopy ? nullptr : counters;
  // The backend's decision (impl/cuda/attend_dispatch.hpp) for kFast and kGeneral.
  const kc::AttendDevice device = kc::ring_attend_device(sm_count);
  const kc::AttendDispatch dispatch = kc::ring_attend_dispatch_of<F>(a, device, kMaxSplits);
  a.splits = dispatch.splits;
  auto variant = [&](bool choose) -> cudaError_t {
    const std::int32_t cap = slot_major(kind) ? kBenchMaxSplits : kMaxSplits;
    switch (kind) {
      case Kind::kBlock:
        return launch_variant<F, kc::FastGeometry<F, 4, F == ElementFormat::kFp8 ? 4 : 3>>(a, sm_count, cap,
                                                                                           choose);
      case Kind::kW4S3: return launch_variant<F, kc::FastWarpGeometry<F, 4, 3>>(a, sm_count, cap, choose);
      case Kind::kW8S2: return launch_variant<F, kc::FastWarpGeometry<F, 8, 2>>(a, sm_count, cap, choose);
      case Kind::kW8S2B:
        return launch_variant<F, kc::FastWarpGeometry<F, 8, 2, true>>(a, sm_count, cap, choose);
      case Kind::kSlotB:  // FastAuto's slot-major configuration with the batched index preload
        return launch_variant<
            F, kc::FastSlotGeometry<F, 8, F == ElementFormat::kFp8 ? 3 : 2, F != ElementFormat::kFp8, 1,
                                    F == ElementFormat::kFp8 ? 2 : 1, 1, true>>(a, sm_count, cap, choose);
      case Kind::kS8S2C:
        return launch_variant<F, kc::FastSlotGeometry<F, 8, 2, true>>(a, sm_count, cap, choose);
      case Kind::kS8S3:
        return launch_variant<F, kc::FastSlotGeometry<F, 8, 3, false>>(a, sm_count, cap, choose);
      case Kind::kS8S3H2:
        return launch_variant<F, kc::FastSlotGeometry<F, 8, 3, false, 1, 2>>(a, sm_count, cap, choose);
      case Kind::kS8S2H2:
        return launch_variant<F, kc::FastSlotGeometry<F, 8, 2, false, 1, 2>>(a, sm_count, cap, choose);
      case Kind::kS4S3H2:
        return launch_variant<F, kc::FastSlotGeometry<F, 4, 3, false, 1, 2>>(a, sm_count, cap, choose);
      case Kind::kS8S2M2:
        return launch_variant<F, kc::FastSlotGeometry<F, 8, 2, false, 2, 1>>(a, sm_count, cap, choose);
      case Kind::kS8S3M2:
        return launch_variant<F, kc::FastSlotGeometry<F, 8, 3, false, 2, 1>>(a, sm_count, cap, choose);
      case Kind::kS4S3M3:
        return launch_variant<F, kc::FastSlotGeometry<F, 4, 3, false, 3, 1>>(a, sm_count, cap, choose);
      case Kind::kS8S2K8:
        return launch_variant<F, kc::FastSlotGeometry<F, 8, 2, false, 1, 1, 8>>(a, sm_count, cap, choose);
      default: return cudaSuccess;
    }
  };
  if (ok) ok = check(variant(true), "configuration splits", state);

  auto launch = [&]() -> cudaError_t {
    if (kind == Kind::kCopy) {
      return cudaMemcpyAsync(copy_dst, pool, static_cast<std::size_t>(bytes), cudaMemcpyDeviceToDevice,
                             nullptr);
    }
    if (kind == Kind::kFast || kind == Kind::kGeneral)
      return kc::ring_attend_launch<F>(a, dispatch.kernel, nullptr);
    return variant(false);
  };
  if (ok)
    ok = check(launch(), "warm-up launch", state) && check(cudaDeviceSynchronize(), "warm-up sync", state);
  // The fast kernel's output against the general kernel's on the same inputs.
  if (ok && kind != Kind::kGeneral && kind != Kind::kCopy) {
    std::vector<double> fast(static_cast<std::size_t>(q_elements)), general(fast.size());
    kc::AttendArgs<float> g = a;
    g.counters = nullptr;
    const kc::AttendDispatch general_dispatch = kc::ring_attend_dispatch_of<F>(g, device, kMaxSplits);
    g.splits = general_dispatch.splits;
    ok =
        check(cudaMemcpy(fast.data(), out, fast.size() * 8, cudaMemcpyDeviceToHost), "copy out", state) &&
        check(kc::ring_attend_launch<F>(g, general_dispatch.kernel, nullptr), "general launch", state) &&
        check(cudaMemcpy(general.data(), out, general.size() * 8, cudaMemcpyDeviceToHost), "copy out", state);
    double diff = 0.0, top = 0.0;
    for (std::size_t i = 0; i < fast.size(); ++i) {
      diff = std::max(diff, std::fabs(fast[i] - general[i]));
      top = std::max(top, std::fabs(general[i]));
    }
    if (!(diff == diff)) diff = INFINITY;
    g_differences[key(shape, F, kind)] = top > 0 ? diff / top : diff;
  }
  double seconds = 0.0;
  std::int64_t launches = 0;
  for (auto _ : state) {
    if (!ok) break;
    // Evict the rows from L2 (untimed), then time the launch alone.
    flush_l2_kernel<<<1024, 256>>>(reinterpret_cast<const uint4*>(flush), kFlushBytes / 16,
                                   counters + shape.batch * shape.q_heads - 1);
    if (!check(cudaGetLastError(), "flush", state)) break;
    cudaEventRecord(start);
    const cudaError_t err = launch();
    cudaEventRecord(stop);
    if (!check(err, "launch", state) || !check(cudaEventSynchronize(stop), "sync", state)) {
      ok = false;
      break;
    }
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1000.0);
    seconds += ms / 1000.0;
    ++launches;
  }
  if (ok && launches > 0 && seconds > 0) {
    const double rate = static_cast<double>(bytes) * static_cast<double>(launches) / seconds;
    state.counters["GBps"] = rate / 1e9;
    state.counters["peak_ratio"] = g_peak_bytes_per_s > 0 ? rate / g_peak_bytes_per_s : 0.0;
    state.counters["splits"] = kind == Kind::kCopy ? 0 : a.splits;
    g_rates[key(shape, F, kind)] = rate;
    g_splits[key(shape, F, kind)] = kind == Kind::kCopy ? 0 : a.splits;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

void register_all() {
  for (int s = 0; s < kShapeCount; ++s) {
    for (Kind k : kAllKinds) {
      if (!measured(s, k)) continue;
      for (ElementFormat f : {ElementFormat::kBf16, ElementFormat::kFp8}) {
        const std::string name = "decode_attention_cuda/" + key(kShapes[s], f, k);
        auto* b = f == ElementFormat::kBf16
                      ? benchmark::RegisterBenchmark(name.c_str(),
                                                     [s, k](benchmark::State& st) {
                                                       BM_decode_attention<ElementFormat::kBf16>(st, s, k);
                                                     })
                      : benchmark::RegisterBenchmark(name.c_str(), [s, k](benchmark::State& st) {
                          BM_decode_attention<ElementFormat::kFp8>(st, s, k);
                        });
        b->UseManualTime()->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("decode_attention_cuda_bench: no CUDA device (%s); nothing to measure\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 0;
  }
  int clock_khz = 0, bus_bits = 0;
  // cudaDevAttrMemoryClockRate is still in CUDA 13's driver_types.h (peak
  // memory clock in kHz); if a driver answers 0 the ratio is reported as 0.
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, 0) != cudaSuccess) clock_khz = 0;
  if (cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0) != cudaSuccess) bus_bits = 0;
  g_peak_bytes_per_s = static_cast<double>(clock_khz) * 1000.0 * 2.0 * bus_bits / 8.0;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device: %s, %d SMs, memory clock %d kHz, bus %d bits, peak %.1f GB/s\n", prop.name,
              prop.multiProcessorCount, clock_khz, bus_bits, g_peak_bytes_per_s / 1e9);
  // The flush kernel asks for the attention kernels' shared-memory carveout,
  // so the SMs are not reconfigured between it and the timed launch.
  cudaFuncSetAttribute(flush_l2_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();

  std::printf("\n%-18s %-5s %-12s %9s %8s %8s %6s  %s\n", "shape", "fmt", "kernel", "GB/s", "/peak", "/copy",
              "splits", "target");
  int missed = 0;
  for (const Shape& shape : kShapes) {
    for (ElementFormat f : {ElementFormat::kBf16, ElementFormat::kFp8}) {
      const auto copy = g_rates.find(key(shape, f, Kind::kCopy));
      for (Kind k : kAllKinds) {
        const auto it = g_rates.find(key(shape, f, k));
        if (it == g_rates.end()) continue;
        const double peak = g_peak_bytes_per_s > 0 ? it->second / g_peak_bytes_per_s : 0.0;
        const double vs_copy = copy != g_rates.end() ? it->second / copy->second : 0.0;
        const double target = f == ElementFormat::kBf16 ? 0.85 : 0.8;
        std::string verdict;
        if (k == Kind::kFast) {
          const bool met = peak >= target;
          missed += met ? 0 : 1;
          char buf[64];
          std::snprintf(buf, sizeof buf, ">= %.2f of peak: %s", target, met ? "met" : "NOT met");
          verdict = buf;
        }
        std::printf("%-18s %-5s %-12s %9.1f %8.3f %8.3f %6d  %s\n", shape.name,
                    f == ElementFormat::kBf16 ? "bf16" : "fp8", kind_name(k), it->second / 1e9, peak, vs_copy,
                    g_splits[key(shape, f, k)], verdict.c_str());
      }
    }
  }
  for (const auto& [name, diff] : g_differences) {
    std::printf("%s vs general output: max |difference| / max |output| = %.3g\n", name.c_str(), diff);
  }
  std::printf("targets missed: %d\n", missed);
  return 0;
}
