// The production decode kernels' shared parts (see ring_fast_attend.cuh for
// the design): sizes, the block-tile kernel's shared-memory geometry, swizzled
// shared addresses, cp.async, ldmatrix/mma.sync with the hi/lo split, fp8
// widening, the split's index preload, and the in-launch combine of splits.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "impl/cuda/attend_dispatch.hpp"
#include "impl/element_format.hpp"
#include "impl/kv_cache.hpp"

namespace kvcheck::impl::cuda {

// kFastHeadDim, kFastHeads and kFastMaxSplitColumns: impl/cuda/attend_dispatch.hpp
// (the host dispatch sizes splits by them).

/// Shared-memory geometry of the fast kernel for format F with Warps warps
/// (16 rows of a tile each) and Stages tiles in the pipeline.
template <ElementFormat F, int Warps, int Stages>
struct FastGeometry {
  static constexpr bool kWarpPipe = false;  // the block-tile kernel (ring_fast_attend_kernel)
  static constexpr bool kSlotMajor = false;
  static constexpr bool kFp8 = F == ElementFormat::kFp8;
  static constexpr int kWarps = Warps;
  static constexpr int kStages = Stages;
  static constexpr int kThreads = 32 * Warps;
  static constexpr int kTileRows = 16 * Warps;
  /// Bytes of one head row as stored (codes only for fp8).
  static constexpr int kRawRowBytes = kFp8 ? kFastHeadDim : 2 * kFastHeadDim;
  /// Bytes of one head row widened to 16 bits (what ldmatrix reads).
  static constexpr int kWideRowBytes = 2 * kFastHeadDim;
  /// One stage: K rows, V rows, then (fp8) the head's K and V scale words.
  static constexpr int kStageBytes = 2 * kTileRows * kRawRowBytes + (kFp8 ? 2 * kTileRows * 4 : 0);
  /// fp8: the widened f16 K and V tile the tensor cores read.
  static constexpr int kWideBytes = kFp8 ? 2 * kTileRows * kWideRowBytes : 0;
  static constexpr int kIndexBytes = static_cast<int>(kFastMaxSplitColumns) * 4;
  static constexpr int kSharedBytes = kStages * kStageBytes + kWideBytes + kIndexBytes;
  /// Most splits the combine holds weights for (8 per split in the stages).
  static constexpr int kMostSplits = (kSharedBytes - kIndexBytes) / (4 * kFastHeads) - 1;
  static_assert(kFastMaxSplitColumns % kTileRows == 0, "a split holds whole tiles");
  static_assert(kStages * kStageBytes >= kWarps * kFastHeads * (kFastHeadDim + 2) * 4,
                "the stages hold the warps' states for the merge");
};

/// Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled 256-byte
/// row tile: chunk ^ (row & 7), so any 8 consecutive rows of one logical
/// chunk sit in 8 distinct bank groups (ldmatrix reads 8 rows of one chunk).
__device__ inline std::uint32_t fast_swizzle(int row, int chunk) {
  return static_cast<std::uint32_t>(row * (2 * kFastHeadDim) + ((chunk ^ (row & 7)) << 4));
}

__device__ inline std::uint32_t fast_shared_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// ---- cp.async -------------------------------------------------------------------

/// cp.async of `Bytes` (4 or 16) from global `src` to shared `dst`; with
/// `fill` false nothing is read and the destination is zero-filled.
template <int Bytes>
__device__ inline void fast_copy_async(std::uint32_t dst, const void* src, bool fill) {
  const int src_size = fill ? Bytes : 0;
  if constexpr (Bytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_size)
                 : "memory");
  }
}
__device__ inline void fast_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ inline void fast_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- tensor cores --------------------------------------------------------------

__device__ inline void fast_ldmatrix_x4(std::uint32_t addr, std::uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ inline void fast_ldmatrix_x4_trans(std::uint32_t addr, std::uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

/// d += A(16x16, row) * B(16x8, col), f32 accumulate; bf16 or f16 operands.
template <bool Half>
__device__ inline void fast_mma(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                std::uint32_t b1) {
  if constexpr (Half) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

/// x as a 16-bit high part (bf16 or f16, nearest even) and the residual
/// x - hi (exact in f32) rounded the same way, packed for two values:
/// hi_pair = (hi(a), hi(b)), lo_pair = (lo(a), lo(b)), a in the low half.
template <bool Half>
__device__ inline void fast_split_pack(float a, float b, std::uint32_t& hi_pair, std::uint32_t& lo_pair) {
  if constexpr (Half) {
    const __half2 hi = __floats2half2_rn(a, b);
    const float2 hf = __half22float2(hi);
    const __half2 lo = __floats2half2_rn(a - hf.x, b - hf.y);
    hi_pair = *reinterpret_cast<const std::uint32_t*>(&hi);
    lo_pair = *reinterpret_cast<const std::uint32_t*>(&lo);
  } else {
    const __nv_bfloat162 hi = __floats2bfloat162_rn(a, b);
    const float2 hf = __bfloat1622float2(hi);
    const __nv_bfloat162 lo = __floats2bfloat162_rn(a - hf.x, b - hf.y);
    hi_pair = *reinterpret_cast<const std::uint32_t*>(&hi);
    lo_pair = *reinterpret_cast<const std::uint32_t*>(&lo);
  }
}

/// 2^k as an f32 for any k in [-149, 127] (exact; 0 below).
__device__ inline float fast_pow2(int k) {
  if (k >= -126) return format_bits_float(static_cast<std::uint32_t>(k + 127) << 23);
  if (k >= -149) return format_bits_float(1u << (k + 149));
  return 0.0f;
}

/// 2^k as a pair of f16 for k <= 0, flushed to 0 below 2^-24 (k > 0 is
/// clamped to 1; the tile maximum makes it unreachable).
__device__ inline std::uint32_t fast_half_pow2_pair(int k) {
  if (k > 0) k = 0;
  std::uint32_t h = 0;
  if (k >= -14) {
    h = static_cast<std::uint32_t>(k + 15) << 10;
  } else if (k >= -24) {
    h = 1u << (k + 24);
  }
  return h | (h << 16);
}

/// Widens 16 fp8 codes (one uint4) to 16 f16, each times the f16 pair
/// `factor` (a power of two): exact e4m3 -> f16 conversion in hardware, one
/// f16x2 multiply per two values.
__device__ inline void fast_widen_fp8(const uint4 codes, std::uint32_t factor, uint4& out0, uint4& out1) {
  const std::uint32_t w[4] = {codes.x, codes.y, codes.z, codes.w};
  const __half2 f = *reinterpret_cast<const __half2*>(&factor);
  std::uint32_t o[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const __half2_raw pair = __nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>((w[i] >> (16 * h)) & 0xFFFFu), __NV_E4M3);
      const __half2 v = __hmul2(__half2(pair), f);
      o[2 * i + h] = *reinterpret_cast<const std::uint32_t*>(&v);
    }
  }
  out0 = make_uint4(o[0], o[1], o[2], o[3]);
  out1 = make_uint4(o[4], o[5], o[6], o[7]);
}

/// Index columns one thread of a kThreads-thread block preloads (a split holds
/// at most kFastMaxSplitColumns).
template <int kThreads>
inline constexpr int kFastPreloadPer = static_cast<int>((kFastMaxSplitColumns + kThreads - 1) / kThreads);

/// Loads this thread's index columns tid, tid + kThreads, ... (< columns; -1
/// past them) into registers. Every load is issued before any is used, so
/// the preload costs one memory round trip; the loop it replaced (load,
/// store to shared memory, next column) made the compiler wait for each
/// load: 8 round trips (~5 us) before a 2048-column split read its first
/// row. The stores (fast_store_slots) come after the query's loads, which
/// then share the same round trip.
template <int kThreads>
__device__ inline void fast_load_slots(const std::int64_t* index_row, int columns, int tid,
                                       long long (&v)[kFastPreloadPer<kThreads>]) {
  const long long* row = reinterpret_cast<const long long*>(index_row);
#pragma unroll
  for (int i = 0; i < kFastPreloadPer<kThreads>; ++i) {
    const int c = tid + i * kThreads;
    v[i] = c < columns ? __ldg(row + c) : -1ll;
  }
}

/// Stores the preloaded columns below `padded` into `slots` as int32 slots
/// (-1: skipped, or past the pool's row_count).
template <int kThreads>
__device__ inline void fast_store_slots(const long long (&v)[kFastPreloadPer<kThreads>], int padded,
                                        std::int64_t row_count, int tid, int* slots) {
#pragma unroll
  for (int i = 0; i < kFastPreloadPer<kThreads>; ++i) {
    const int c = tid + i * kThreads;
    if (c < padded) {
      const long long s = v[i];
      slots[c] = s < 0 || s >= row_count ? -1 : static_cast<int>(s);
    }
  }
}

/// The fast kernel's argument beyond AttendArgs (whose `counters` hold a
/// zeroed word per (query, KV head, head tile), reset by the kernel after use).
struct FastExtra {
  std::int32_t head_tiles = 1;
};

/// Folds state (m2, l2) into (m, l): sets the weights of the two sides so
/// the caller folds its accumulators the same way.
__device__ inline void fast_merge_weights(float& m, float& l, float m2, float l2, float& wa, float& wb) {
  const float neg_inf = format_bits_float(0xFF800000u);
  if (m2 == neg_inf) {
    wa = 1.0f;
    wb = 0.0f;
    return;
  }
  if (m == neg_inf) {
    m = m2;
    l = l2;
    wa = 0.0f;
    wb = 1.0f;
    return;
  }
  const float top = m > m2 ? m : m2;
  wa = expf(m - top);
  wb = expf(m2 - top);
  l = l * wa + l2 * wb;
  m = top;
}

/// The end of a split block, shared by both kernels: `smem` holds each
/// warp's state, sh_o [warps][8][128] (f32, dims in natural order, already in
/// value units) then sh_ml [warps][8][2] (max, sum), written and synchronized
/// by the caller. The warps are merged into the split's partial state; the
/// last split block of a (query, KV head, head tile) to finish combines every
/// split with the sink and writes the output, then resets its counter.
/// The combine computes each split's weight once per head (a warp per head,
/// splits across lanes, into shared memory), then every output element sums
/// its splits with independent loads: with 32+ splits (the split-K shape) a
/// loop of dependent loads per element was the block's longest phase.
template <int kWarps, int kThreads, class Args>
__device__ inline void fast_splits_combine(const Args& a, unsigned char* smem, int heads_here,
                                           std::int64_t qi, std::int32_t h0, std::int32_t splits,
                                           unsigned int* counter, int tid, int* last_block);

template <int kWarps, int kThreads, class Args>
__device__ inline void fast_block_finish(const Args& a, unsigned char* smem, int heads_here, std::int64_t qi,
                                         std::int32_t h0, std::int32_t split, int tid, int* last_block) {
  const float neg_inf = format_bits_float(0xFF800000u);
  const float* sh_o = reinterpret_cast<const float*>(smem);        // [warps][8][128]
  const float* sh_ml = sh_o + kWarps * kFastHeads * kFastHeadDim;  // [warps][8][2]
  for (int e = tid; e < heads_here * kFastHeadDim; e += kThreads) {
    const int h = e / kFastHeadDim;
    const int d = e % kFastHeadDim;
    float mm = neg_inf, ll = 0.0f, acc = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      float wa, wb;
      fast_merge_weights(mm, ll, sh_ml[(w * kFastHeads + h) * 2], sh_ml[(w * kFastHeads + h) * 2 + 1], wa,
                         wb);
      acc = acc * wa + sh_o[(w * kFastHeads + h) * kFastHeadDim + d] * wb;
    }
    const std::int64_t part = (qi * a.q_heads + h0 + h) * a.splits + split;
    a.part_acc[part * kFastHeadDim + d] = acc;
    if (d == 0) {
      a.part_ml[part * 2] = mm;
      a.part_ml[part * 2 + 1] = ll;
    }
  }

  fast_splits_combine<kWarps, kThreads>(a, smem, heads_here, qi, h0, a.splits, a.counters + blockIdx.x, tid,
                                        last_block);
}

/// The end of a split block whose partial state is written (every thread's
/// stores issued): counts the block on `counter`, and the last of `splits`
/// blocks to arrive combines the splits' partials of heads h0 .. h0 +
/// heads_here - 1 of query qi with the sink, writes the output and resets
/// the counter. The combine computes each split's weight once per head (a
/// warp per head, splits across lanes, into shared memory), then every
/// output element sums its splits with independent loads: with 32+ splits
/// (the split-K shape) a loop of dependent loads per element was the
/// block's longest phase. `smem` holds at least 8 * (splits + 1) floats.
template <int kWarps, int kThreads, class Args>
__device__ inline void fast_splits_combine(const Args& a, unsigned char* smem, int heads_here,
                                           std::int64_t qi, std::int32_t h0, std::int32_t splits,
                                           unsigned int* counter, int tid, int* last_block) {
  const float neg_inf = format_bits_float(0xFF800000u);
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    const unsigned int done = atomicAdd(counter, 1u);
    *last_block = done == static_cast<unsigned int>(splits - 1) ? 1 : 0;
  }
  __syncthreads();
  if (!*last_block) return;
  __threadfence();
  const int warp = tid >> 5;
  const int lane = tid & 31;
  float* sh_w = reinterpret_cast<float*>(smem);  // [8][splits]: exp(m_s - top), 0 if empty
  float* sh_total = sh_w + kFastHeads * splits;  // [8]: sum of l_s weights + sink
  for (int h = warp; h < heads_here; h += kWarps) {
    const std::int64_t qh = qi * a.q_heads + h0 + h;
    const float* ml = a.part_ml + qh * splits * 2;
    float top = a.has_sink ? a.sink : neg_inf;
    for (std::int32_t s = lane; s < splits; s += 32) top = fmaxf(top, __ldcg(ml + 2 * s));
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, x));
    float total = 0.0f;
    for (std::int32_t s = lane; s < splits; s += 32) {
      const float ms = __ldcg(ml + 2 * s);
      const float w = top == neg_inf || ms == neg_inf ? 0.0f : expf(ms - top);
      sh_w[h * splits + s] = w;
      total += w == 0.0f ? 0.0f : __ldcg(ml + 2 * s + 1) * w;
    }
#pragma unroll
    for (int x = 16; x > 0; x >>= 1) total += __shfl_xor_sync(0xffffffffu, total, x);
    if (lane == 0) {
      if (a.has_sink && top != neg_inf) total += expf(a.sink - top);
      sh_total[h] = total;
    }
  }
  __syncthreads();
  for (int e = tid; e < heads_here * kFastHeadDim; e += kThreads) {
    const int h = e / kFastHeadDim;
    const int d = e % kFastHeadDim;
    const std::int64_t qh = qi * a.q_heads + h0 + h;
    const float* acc = a.part_acc + qh * splits * kFastHeadDim + d;
    const float* w = sh_w + h * splits;
    float sum = 0.0f;
#pragma unroll 8
    for (std::int32_t s = 0; s < splits; ++s) {
      const float ws = w[s];
      const float v = __ldcg(acc + static_cast<std::int64_t>(s) * kFastHeadDim);
      sum += ws == 0.0f ? 0.0f : v * ws;
    }
    const float total = sh_total[h];
    a.out[qh * kFastHeadDim + d] = total > 0.0f ? static_cast<double>(sum / total) : 0.0;
  }
  if (tid == 0) *counter = 0u;
}

}  // namespace kvcheck::impl::cuda
