// Decode attention over index rows on the GPU: batch 64 queries, window
// W = 4096, head_dim 128, 8 KV heads, 32 query heads (GQA 4), bf16 and fp8
// rows, through ring_attend_launch (split + combine) of
// impl/cuda/ring_kernels.cuh. Reports the key/value bytes the kernel must
// read per launch as bytes/s, and their ratio to the device's peak memory
// bandwidth, queried at run time as memoryClockRate (kHz) x 1000 x 2 (DDR)
// x busWidth / 8. Target for bf16: >= 0.8 of peak. Without a device it
// prints one line and exits 0.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "impl/cuda/ring_kernels.cuh"
#include "impl/element_format.hpp"
#include "impl/ring_index.hpp"

namespace {

using kvcheck::impl::ElementFormat;
namespace kc = kvcheck::impl::cuda;

constexpr std::int64_t kBatch = 64;
constexpr std::int64_t kWindow = 4096;
constexpr std::int64_t kRing = kWindow;  // decode only: no verify slack needed
constexpr std::int32_t kHeadDim = 128;
constexpr std::int32_t kKvHeads = 8;
constexpr std::int32_t kQHeads = 32;
constexpr std::int64_t kPosition = 10000;  // past the wrap: index rows start mid-ring

double g_peak_bytes_per_s = 0.0;

struct Result {
  std::string name;
  double bytes_per_s = 0.0;
};
std::vector<Result> g_results;

/// Fills every slot with finite random rows of format F (a hash of the byte
/// position; fp8 codes avoid NaN, scales near 1).
template <ElementFormat F>
__global__ void fill_pool_kernel(std::uint8_t* pool, std::int64_t slots, kc::SlotLayout layout) {
  const std::int64_t total = slots * layout.slot_bytes;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
       i < total; i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
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

bool check(cudaError_t err, const char* what, benchmark::State& state) {
  if (err == cudaSuccess) return true;
  state.SkipWithError((std::string(what) + ": " + cudaGetErrorString(err)).c_str());
  return false;
}

template <ElementFormat F>
void BM_decode_attention(benchmark::State& state) {
  kc::SlotLayout layout;
  layout.kv_heads = kKvHeads;
  layout.head_dim = kHeadDim;
  layout.row_elements = static_cast<std::int64_t>(kKvHeads) * kHeadDim;
  layout.row_bytes = kc::ring_row_bytes(F, layout.row_elements);
  layout.slot_bytes = 2 * layout.row_bytes;
  const std::int64_t slots = kBatch * kRing;
  const std::int64_t q_elements = kBatch * kQHeads * kHeadDim;

  // Index rows from the shared host/device math: query b decodes state b.
  std::vector<std::int64_t> index(static_cast<std::size_t>(kBatch * kWindow));
  for (std::int64_t b = 0; b < kBatch; ++b) {
    const auto m = kvcheck::impl::ring_metadata(b, kPosition, kWindow, kRing, kBatch,
                                                kvcheck::impl::Fault::kNone);
    for (std::int64_t c = 0; c < kWindow; ++c) {
      index[static_cast<std::size_t>(b * kWindow + c)] =
          kvcheck::impl::ring_index_column(m, c, kRing, kvcheck::impl::Fault::kNone);
    }
  }
  int sm_count = 1;
  cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0);
  const std::int32_t head_tiles = kc::ring_attend_head_tiles(kQHeads, kKvHeads);
  const std::int32_t splits =
      kc::ring_attend_splits(kBatch, kKvHeads, head_tiles, kWindow, sm_count, 64);

  std::uint8_t* pool = nullptr;
  std::int64_t* d_index = nullptr;
  float* q = nullptr;
  float* part_acc = nullptr;
  float* part_ml = nullptr;
  double* out = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  bool ok = check(cudaMalloc(&pool, static_cast<std::size_t>(slots * layout.slot_bytes)), "cudaMalloc(pool)", state) &&
            check(cudaMalloc(&d_index, index.size() * sizeof(std::int64_t)), "cudaMalloc(index)", state) &&
            check(cudaMalloc(&q, static_cast<std::size_t>(q_elements) * sizeof(float)), "cudaMalloc(q)", state) &&
            check(cudaMalloc(&part_acc, static_cast<std::size_t>(q_elements) * splits * sizeof(float)), "cudaMalloc(part)", state) &&
            check(cudaMalloc(&part_ml, static_cast<std::size_t>(kBatch * kQHeads) * splits * 2 * sizeof(float)), "cudaMalloc(ml)", state) &&
            check(cudaMalloc(&out, static_cast<std::size_t>(q_elements) * sizeof(double)), "cudaMalloc(out)", state) &&
            check(cudaMemcpy(d_index, index.data(), index.size() * sizeof(std::int64_t), cudaMemcpyHostToDevice), "cudaMemcpy(index)", state) &&
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
  a.n = kBatch;
  a.width = kWindow;
  a.q_heads = kQHeads;
  a.layout = layout;
  a.scale = 1.0f;  // q is pre-scaled, as the backend does for float pools
  a.splits = splits;
  a.part_acc = part_acc;
  a.part_ml = part_ml;
  a.out = out;
  // Bytes the kernel must read per launch: every index row's key and value
  // head rows (fp8: codes plus their head's scale bytes).
  const std::int64_t head_row_bytes =
      F == ElementFormat::kFp8E4m3 ? kHeadDim + (kHeadDim + 31) / 32 : 2 * kHeadDim;
  const double bytes = static_cast<double>(kBatch) * kWindow * kKvHeads * 2.0 * head_row_bytes;
  double seconds = 0.0;
  std::int64_t launches = 0;
  if (ok) ok = check(kc::ring_attend_launch<F>(a, nullptr), "warm-up launch", state) &&
               check(cudaDeviceSynchronize(), "warm-up sync", state);
  for (auto _ : state) {
    if (!ok) break;
    cudaEventRecord(start);
    const cudaError_t err = kc::ring_attend_launch<F>(a, nullptr);
    cudaEventRecord(stop);
    if (!check(err, "ring_attend_launch", state) || !check(cudaEventSynchronize(stop), "sync", state)) {
      ok = false;
      break;
    }
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1000.0);
    seconds += ms / 1000.0;
    ++launches;
  }
  if (ok && launches > 0) {
    const double rate = bytes * static_cast<double>(launches) / seconds;
    state.counters["bytes_per_s"] = rate;
    state.counters["peak_ratio"] = g_peak_bytes_per_s > 0 ? rate / g_peak_bytes_per_s : 0.0;
    state.counters["splits"] = splits;
    g_results.push_back({F == ElementFormat::kBf16 ? "decode_attention_cuda/bf16" : "decode_attention_cuda/fp8", rate});
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(pool);
  cudaFree(d_index);
  cudaFree(q);
  cudaFree(part_acc);
  cudaFree(part_ml);
  cudaFree(out);
}

BENCHMARK(BM_decode_attention<ElementFormat::kBf16>)->Name("decode_attention_cuda/bf16")->UseManualTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_attention<ElementFormat::kFp8E4m3>)->Name("decode_attention_cuda/fp8")->UseManualTime()->Unit(benchmark::kMicrosecond);

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
  std::printf("device: %s, memory clock %d kHz, bus %d bits, peak %.1f GB/s\n", prop.name,
              clock_khz, bus_bits, g_peak_bytes_per_s / 1e9);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  for (const Result& r : g_results) {
    std::printf("%s: %.1f GB/s = %.3f of peak %.1f GB/s%s\n", r.name.c_str(), r.bytes_per_s / 1e9,
                g_peak_bytes_per_s > 0 ? r.bytes_per_s / g_peak_bytes_per_s : 0.0,
                g_peak_bytes_per_s / 1e9,
                r.name.find("bf16") != std::string::npos
                    ? (g_peak_bytes_per_s > 0 && r.bytes_per_s >= 0.8 * g_peak_bytes_per_s
                           ? " (target >= 0.8: met)"
                           : " (target >= 0.8: NOT met)")
                    : "");
  }
  return 0;
}
