// The production decode/verify attention kernel of the CUDA ring pool for
// bf16 and fp8 rows with head_dim 128: a gather over index rows at the memory
// roofline. impl/cuda/ring_kernels.cuh dispatches here when the pool fits
// (ring_fast_attend_fits) and keeps its general kernel for every other shape.
//
// Three kernels share the parts below; FastAuto (the backend's choice,
// measured on an H200, README "GPU") picks per launch:
// * ring_fast_slot_attend_kernel (batch decode: the blocks fill the device):
//   one block = (query, up to 8 (KV head, head tile) pairs) x one split, one
//   warp per pair, each warp streaming its pair's head rows of every column
//   of the split through its own ring of stages. The block's warps read the
//   heads of the same slots at about the same time, so HBM sees whole K and
//   V rows (1-4 KiB contiguous); with one block per KV head the same bytes
//   arrived as scattered 128/256-byte pieces from blocks that had drifted
//   apart, and the kernel topped out at ~1.1 G slots/s in both formats.
//   fp8 takes 32 rows per step (two 16-row halves, one softmax step) for
//   more independent work per warp: it is bound by issue latency, not bytes.
// * ring_fast_warp_attend_kernel (split-K: few queries, many splits): one
//   block = (query, KV head, head tile) x split, warp w streams tiles w,
//   w + warps, ... through its own ring (no block barrier in the loop).
// * ring_fast_attend_kernel (the first design, kept for the benchmark's
//   comparison): block-wide 64-row tiles, fp8 widened in shared memory.
//
// Design (why each part is there):
// * The query heads of a block (or warp) share every key/value row, so each
//   row crosses HBM once per (query, KV head).
// * Rows move HBM -> shared memory with cp.async (16-byte, L1-bypassing),
//   several stages in flight: data in flight occupies no registers. The
//   column's slot comes from the block's copy of its index range in shared
//   memory (int32); a skipped column (-1, or a slot past the pool) is a
//   zero-filled row that is masked. (Bulk copies through the Tensor Memory
//   Accelerator, one per 256-byte row, measured half as fast on an H200:
//   the TMA's rate of small copies, not bandwidth, bound them.)
// * Scores and the weighted sum run on tensor cores (mma.sync m16n8k16, f32
//   accumulate) fed by ldmatrix from XOR-swizzled rows, conflict-free for
//   both the plain and the transposed load. The 16 rows of the A operand
//   hold, for each query head g < 8, its 16-bit high part in row g and its
//   residual (x - hi(x)) in row g + 8, for the query in QK^T and for the
//   probabilities in PV. Row g and row g + 8 of the result land in the same
//   thread, so hi + lo is one add and no shuffle: the query and the
//   probabilities keep 16 (bf16) or 22 (f16) significant bits while every
//   multiply-add runs on tensor cores. Stored rows are exact operands.
// * fp8 (slot-major and warp kernels): the raw e4m3 codes are read with
//   ldmatrix as b16 pairs and converted in registers (hardware e4m3x2 ->
//   f16x2, exact). Q.K: the 4 codes a thread gets (dims 4t..4t+3 of a
//   k-step) are the B fragment's k = 2t, 2t+1 | 2t+8, 2t+9, and the query's
//   A fragment is built with the same permutation. P.V: the transposed
//   ldmatrix gives keys 2t, 2t+1 of dims 2g, 2g+1 in 4 bytes; two byte
//   permutes pair them per dim, so n-tile (chunk c, parity p) holds dims
//   16c + 2n + p. The ue8m0 scales (one per 32 dims) never touch the codes:
//   a key's scale multiplies its 32-dim partial score by 2^(e - R) (R the
//   step's largest key scale, returned in the score factor), a value's scale
//   multiplies the probability in that 32-dim block's A operand by
//   2^(e - V) (V the warp's running largest value scale; o is kept in units
//   of 2^(V - 127) and rescaled when V grows, like the softmax maximum).
//   2^(e - 127) is the scale byte shifted into an f32 exponent field. The
//   query is carried as f16 hi + lo after scaling it by a power of two to
//   put its largest element in [256, 512).
// * The online softmax runs per step of 16 (or 32) rows per warp: one max,
//   one rescale per step (skipped when no maximum moved).
// * Splits are combined in the same launch: the last block (slot-major: the
//   last warp of a pair) to finish a (query, head tile) (a counter,
//   threadfence pattern) merges every split's partial state with the sink
//   and writes the output, then resets the counter to 0 for the next
//   launch. The combine computes each split's weight once per head, then
//   sums the splits with independent loads.
// * Measured and not chosen (kept for the benchmark's comparison): the
//   slot-major kernel with many splits in thread block clusters of 8
//   (FastSlotGeometry's Cluster): the cluster's blocks merge their states
//   through distributed shared memory, so the combine reads one partial per
//   cluster. On the split-K shape it fixed the slot-major kernel's combine
//   (0.36 -> 0.59 of peak in bf16) but stayed below the warp-pipelined
//   kernel (0.67; fp8 0.33 against 0.34).
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "impl/element_format.hpp"
#include "impl/kv_cache.hpp"

namespace kvcheck::impl::cuda {

/// head_dim the fast kernel takes (every other width runs the general kernel).
inline constexpr std::int32_t kFastHeadDim = 128;
/// Query heads per block (the 8 upper rows of the mma A operand hold their residuals).
inline constexpr int kFastHeads = 8;
/// Most index columns one split reads (its index range is held in shared memory).
inline constexpr std::int64_t kFastMaxSplitColumns = 2048;

/// Shared-memory geometry of the fast kernel for format F with Warps warps
/// (16 rows of a tile each) and Stages tiles in the pipeline.
template <ElementFormat F, int Warps, int Stages>
struct FastGeometry {
  static constexpr bool kWarpPipe = false;  // the block-tile kernel (ring_fast_attend_kernel)
  static constexpr bool kSlotMajor = false;
  static constexpr bool kFp8 = F == ElementFormat::kFp8E4m3;
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

template <ElementFormat F, class G, class Args>
__global__ void __launch_bounds__(G::kThreads, G::kWarps <= 4 ? 2 : 1)
    ring_fast_attend_kernel(Args a, FastExtra extra) {
  constexpr bool kFp8 = G::kFp8;
  constexpr int kStages = G::kStages;
  constexpr int kThreads = G::kThreads;
  constexpr int kTileRows = G::kTileRows;
  constexpr int kWarps = G::kWarps;
  constexpr int kKSteps = kFastHeadDim / 16;  // 8 k-steps of QK^T
  constexpr int kNTiles = kFastHeadDim / 8;   // 16 n-tiles of PV
  const float neg_inf = format_bits_float(0xFF800000u);

  extern __shared__ __align__(128) unsigned char fast_smem[];
  unsigned char* stages = fast_smem;
  unsigned char* wide = fast_smem + kStages * G::kStageBytes;
  int* slots = reinterpret_cast<int*>(wide + G::kWideBytes);
  __shared__ int tile_exponent[2][kWarps / 2];  // fp8: largest K / V scale byte per warp's rows
  __shared__ int last_block;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;   // mma groupID: query head g of the tile
  const int tig = lane & 3;  // mma thread-in-group

  const std::int32_t kv_heads = a.layout.kv_heads;
  const std::int32_t group = a.q_heads / kv_heads;
  std::int64_t blk = blockIdx.x;
  const std::int32_t tile = static_cast<std::int32_t>(blk % extra.head_tiles);
  blk /= extra.head_tiles;
  const std::int32_t kvh = static_cast<std::int32_t>(blk % kv_heads);
  const std::int64_t qi = blk / kv_heads;
  const std::int32_t split = static_cast<std::int32_t>(blockIdx.y);
  if (qi >= a.n || split >= a.splits) return;  // whole block: no barrier skipped
  const std::int32_t h0 = kvh * group + tile * kFastHeads;
  const int heads_here = group - tile * kFastHeads < kFastHeads ? group - tile * kFastHeads : kFastHeads;

  const std::int64_t chunk = (a.width + a.splits - 1) / a.splits;
  const std::int64_t c_begin = split * chunk;
  const std::int64_t c_end = c_begin + chunk < a.width ? c_begin + chunk : a.width;
  const int columns = c_end > c_begin ? static_cast<int>(c_end - c_begin) : 0;
  const int tiles = (columns + kTileRows - 1) / kTileRows;

  // The split's slots, -1 where nothing is read (skipped, out of range, or
  // past the split's end within the last tile).
  const std::int64_t* index_row = a.index + qi * a.width + c_begin;
  for (int c = tid; c < tiles * kTileRows; c += kThreads) {
    long long s = c < columns ? static_cast<long long>(index_row[c]) : -1ll;
    if (s < 0 || s >= a.row_count) s = -1;
    slots[c] = static_cast<int>(s);
  }
  __syncthreads();

  const std::int64_t head_offset = static_cast<std::int64_t>(kvh) * kFastHeadDim;
  const std::uint8_t* key_base = a.rows + head_offset * (kFp8 ? 1 : 2);
  const std::uint8_t* value_base = key_base + (a.layout.shared_row ? 0 : a.layout.row_bytes);
  // fp8: this head's 4 scale bytes (one per 32 elements, after the row's codes).
  const std::uint8_t* key_scale_base = a.rows + a.layout.row_elements + kvh * (kFastHeadDim / 32);
  const std::uint8_t* value_scale_base = key_scale_base + (a.layout.shared_row ? 0 : a.layout.row_bytes);

  // Issues the copies of tile u into its stage. Chunks are spread so that a
  // warp's 32 lanes cover whole rows: every 32-byte sector a request touches
  // is used in full. bf16 rows are swizzled for ldmatrix; fp8 rows are read
  // once, linearly, by the widening pass.
  auto issue = [&](int u) {
    unsigned char* st = stages + (u % kStages) * G::kStageBytes;
    const std::uint32_t k_dst = fast_shared_address(st);
    const std::uint32_t v_dst = k_dst + kTileRows * G::kRawRowBytes;
    constexpr int kRowChunks = G::kRawRowBytes / 16;
    constexpr int kPerThread = kTileRows * kRowChunks / kThreads;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int q = i * kThreads + tid;
      const int r = q / kRowChunks;
      const int c = q % kRowChunks;
      const int s = slots[u * kTileRows + r];
      const bool live = s >= 0;
      const std::int64_t at = (live ? static_cast<std::int64_t>(s) : 0) * a.layout.slot_bytes + c * 16;
      const std::uint32_t off =
          kFp8 ? static_cast<std::uint32_t>(r * G::kRawRowBytes + c * 16) : fast_swizzle(r, c);
      fast_copy_async<16>(k_dst + off, key_base + at, live);
      fast_copy_async<16>(v_dst + off, value_base + at, live);
    }
    if constexpr (kFp8) {
      const std::uint32_t scale_dst = v_dst + kTileRows * G::kRawRowBytes;
      const int r = tid % kTileRows;
      const int s = slots[u * kTileRows + r];
      const bool live = s >= 0;
      const std::int64_t at = (live ? static_cast<std::int64_t>(s) : 0) * a.layout.slot_bytes;
      const std::uint8_t* src = tid < kTileRows ? key_scale_base + at : value_scale_base + at;
      fast_copy_async<4>(scale_dst + static_cast<std::uint32_t>(tid * 4), src, live);
    }
  };

  // The query heads as mma A fragments, for each of the 8 k-steps: row g =
  // hi(q), row g + 8 = lo(q). fp8 scales q by 2^-q_exp first (f16's range).
  std::uint32_t qa[kKSteps][4];
  int q_exp = 0;
  {
    const bool head_live = g < heads_here;
    const float* qrow = a.q + (qi * a.q_heads + h0 + (head_live ? g : 0)) * kFastHeadDim;
    float qv[kKSteps][4];
    float qmax = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int d = ks * 16 + half * 8 + 2 * tig;
        qv[ks][2 * half] = head_live ? qrow[d] : 0.0f;
        qv[ks][2 * half + 1] = head_live ? qrow[d + 1] : 0.0f;
        qmax = fmaxf(qmax, fmaxf(fabsf(qv[ks][2 * half]), fabsf(qv[ks][2 * half + 1])));
      }
    }
    if constexpr (kFp8) {
      qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, 1));
      qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, 2));
      // Largest element into [256, 512): q_exp = exponent(qmax) - 8.
      q_exp = qmax > 0.0f ? static_cast<int>((format_float_bits(qmax) >> 23) & 0xFF) - 127 - 8 : 0;
      if (qmax > 0.0f && qmax < 1.17549435e-38f) q_exp = -127;  // subnormal: 2^127 is f32's largest power
    }
    const float q_scale = kFp8 ? fast_pow2(-q_exp) : 1.0f;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        fast_split_pack<kFp8>(qv[ks][2 * half] * q_scale, qv[ks][2 * half + 1] * q_scale, qa[ks][2 * half],
                              qa[ks][2 * half + 1]);
      }
    }
  }

  float o[kNTiles][4];
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m = neg_inf;  // running max of row g (same in the 4 lanes of a quad)
  float l = 0.0f;     // this lane's share of the running sum
  int v_exp = -1;     // fp8: running largest value scale byte of the tiles seen (o is in its units)

#pragma unroll
  for (int u = 0; u < kStages - 1; ++u) {
    if (u < tiles) issue(u);
    fast_commit();
  }

  for (int t = 0; t < tiles; ++t) {
    if (t + kStages - 1 < tiles) issue(t + kStages - 1);
    fast_commit();
    fast_wait<kStages - 1>();
    __syncthreads();

    const unsigned char* st = stages + (t % kStages) * G::kStageBytes;
    const int* tile_slots = slots + t * kTileRows;
    float score_factor = a.scale;
    float value_factor = 1.0f;   // fp8: 2^(tile's value exponent - v_exp)
    float value_rescale = 1.0f;  // fp8: o *= this when v_exp grows
    const unsigned char* k_tile = st;
    const unsigned char* v_tile = st + kTileRows * G::kRawRowBytes;
    if constexpr (kFp8) {
      // The tile's largest scale byte of keys and of values (skipped rows are
      // zero-filled: scale byte 0, the smallest).
      const std::uint32_t* scale_words =
          reinterpret_cast<const std::uint32_t*>(st + 2 * kTileRows * G::kRawRowBytes);
      {
        constexpr int kHalf = kWarps / 2;
        const int which = warp / kHalf;  // the first half of the warps: keys; the second: values
        const int r = (warp % kHalf) * 32 + lane;
        const std::uint32_t word = scale_words[which * kTileRows + r];
        const unsigned e = max(max(word & 0xFFu, (word >> 8) & 0xFFu), max((word >> 16) & 0xFFu, word >> 24));
        const unsigned top = __reduce_max_sync(0xffffffffu, e);
        if (lane == 0) tile_exponent[which][warp % kHalf] = static_cast<int>(top);
      }
      __syncthreads();
      int k_exp = 0, t_exp = 0;
#pragma unroll
      for (int w = 0; w < kWarps / 2; ++w) {
        k_exp = max(k_exp, tile_exponent[0][w]);
        t_exp = max(t_exp, tile_exponent[1][w]);
      }
      // Widen codes x 2^(e - tile max) into the swizzled f16 tile.
      constexpr int kRowChunks = G::kRawRowBytes / 16;  // 8 chunks of 16 codes
      constexpr int kPerThread = 2 * kTileRows * kRowChunks / kThreads;
#pragma unroll
      for (int i = 0; i < kPerThread; ++i) {
        const int q = i * kThreads + tid;
        const int which = q / (kTileRows * kRowChunks);  // 0 keys, 1 values
        const int r = (q / kRowChunks) % kTileRows;
        const int c = q % kRowChunks;
        const uint4 codes = *reinterpret_cast<const uint4*>(st + which * kTileRows * G::kRawRowBytes +
                                                            r * G::kRawRowBytes + c * 16);
        const std::uint32_t word = scale_words[which * kTileRows + r];
        const int e = static_cast<int>((word >> (8 * (c / 2))) & 0xFFu);
        uint4 w0, w1;
        fast_widen_fp8(codes, fast_half_pow2_pair(e - (which == 0 ? k_exp : t_exp)), w0, w1);
        unsigned char* dst = wide + which * kTileRows * G::kWideRowBytes;
        *reinterpret_cast<uint4*>(dst + fast_swizzle(r, 2 * c)) = w0;
        *reinterpret_cast<uint4*>(dst + fast_swizzle(r, 2 * c + 1)) = w1;
      }
      __syncthreads();
      k_tile = wide;
      v_tile = wide + kTileRows * G::kWideRowBytes;
      // Scores: q = 2^q_exp qn, k = 2^(k_exp - 127) kn.
      score_factor = a.scale * fast_pow2(q_exp) * fast_pow2(k_exp - 127);
      if (t_exp > v_exp) {
        value_rescale = v_exp < 0 ? 0.0f : fast_pow2(v_exp - t_exp);
        v_exp = t_exp;
      } else {
        value_factor = fast_pow2(t_exp - v_exp);
      }
    }
    auto row_address = [&](const unsigned char* base, int row, int chunk) -> std::uint32_t {
      return fast_shared_address(base) + fast_swizzle(row, chunk);
    };

    // This warp's 16 rows of the tile.
    const int row0 = warp * 16;
    const bool v00 = tile_slots[row0 + 2 * tig] >= 0, v01 = tile_slots[row0 + 2 * tig + 1] >= 0;
    const bool v10 = tile_slots[row0 + 8 + 2 * tig] >= 0, v11 = tile_slots[row0 + 8 + 2 * tig + 1] >= 0;
    if (__any_sync(0xffffffffu, v00 || v01 || v10 || v11)) {
      const int mi = lane >> 3;
      const int rr = lane & 7;
      // Scores: two n-tiles of 8 rows, rows g (query hi) and g + 8 (query lo).
      float s0[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      float s1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        std::uint32_t b[4];
        fast_ldmatrix_x4(row_address(k_tile, row0 + 8 * (mi >> 1) + rr, 2 * ks + (mi & 1)), b);
        fast_mma<kFp8>(s0, qa[ks], b[0], b[1]);
        fast_mma<kFp8>(s1, qa[ks], b[2], b[3]);
      }
      float sc[4] = {(s0[0] + s0[2]) * score_factor, (s0[1] + s0[3]) * score_factor,
                     (s1[0] + s1[2]) * score_factor, (s1[1] + s1[3]) * score_factor};
      const bool live[4] = {v00, v01, v10, v11};
      float top = neg_inf;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        sc[i] = live[i] ? sc[i] : neg_inf;
        top = sc[i] > top ? sc[i] : top;
      }
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
      const float m_new = m > top ? m : top;
      float corr = 1.0f;
      float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (m_new != neg_inf) {
        corr = m == neg_inf ? 0.0f : expf(m - m_new);
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = live[i] ? expf(sc[i] - m_new) : 0.0f;
        m = m_new;
      }
      l = l * corr + ((p[0] + p[1]) + (p[2] + p[3]));
      // Rescale only when some head's maximum (or the value exponent) moved:
      // after the first tiles it rarely does.
      const float o_scale = corr * value_rescale;
      if (__any_sync(0xffffffffu, o_scale != 1.0f)) {
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
          o[j][0] *= o_scale;
          o[j][1] *= o_scale;
          o[j][2] *= o_scale;
          o[j][3] *= o_scale;
        }
      }
      // Probabilities as the A operand: row g hi, row g + 8 residual.
      std::uint32_t pa[4];
      fast_split_pack<kFp8>(p[0] * value_factor, p[1] * value_factor, pa[0], pa[1]);
      fast_split_pack<kFp8>(p[2] * value_factor, p[3] * value_factor, pa[2], pa[3]);
#pragma unroll
      for (int j = 0; j < kNTiles; j += 2) {
        std::uint32_t b[4];
        fast_ldmatrix_x4_trans(row_address(v_tile, row0 + 8 * (mi & 1) + rr, j + (mi >> 1)), b);
        fast_mma<kFp8>(o[j], pa, b[0], b[1]);
        fast_mma<kFp8>(o[j + 1], pa, b[2], b[3]);
      }
    } else if (kFp8 && value_rescale != 1.0f) {
      // No live row here, but the block's value exponent moved: keep o in its units.
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        o[j][0] *= value_rescale;
        o[j][1] *= value_rescale;
        o[j][2] *= value_rescale;
        o[j][3] *= value_rescale;
      }
    }
    __syncthreads();
  }

  fast_wait<0>();
  __syncthreads();

  // Quad sum of l; then the warps merge through shared memory (the stages are free now).
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  const float o_unit = kFp8 ? (v_exp < 0 ? 0.0f : fast_pow2(v_exp - 127)) : 1.0f;
  float* sh_o = reinterpret_cast<float*>(stages);            // [warps][8][128]
  float* sh_ml = sh_o + kWarps * kFastHeads * kFastHeadDim;  // [warps][8][2]
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
    const int d = 8 * j + 2 * tig;
    float* dst = sh_o + (warp * kFastHeads + g) * kFastHeadDim + d;
    dst[0] = (o[j][0] + o[j][2]) * o_unit;
    dst[1] = (o[j][1] + o[j][3]) * o_unit;
  }
  if (tig == 0) {
    sh_ml[(warp * kFastHeads + g) * 2] = m;
    sh_ml[(warp * kFastHeads + g) * 2 + 1] = l;
  }
  __syncthreads();
  fast_block_finish<kWarps, kThreads>(a, stages, heads_here, qi, h0, split, tid, &last_block);
}

// ---- the warp-pipelined kernel ---------------------------------------------------

/// Geometry of the warp-pipelined kernel (ring_fast_warp_attend_kernel): each
/// of Warps warps streams its own 16-row tiles (tile u of the split goes to
/// warp u % Warps) through its own ring of Stages stages, so the main loop
/// has no block barrier: a warp waits only for its own copies.
template <ElementFormat F, int Warps, int Stages, bool BatchedIndex = false>
struct FastWarpGeometry {
  static constexpr bool kWarpPipe = true;
  static constexpr bool kSlotMajor = false;
  /// Index preload with every load issued first (fast_load_slots) instead
  /// of the load-then-store loop. Not measured on a device yet.
  static constexpr bool kBatchedIndex = BatchedIndex;
  static constexpr bool kFp8 = F == ElementFormat::kFp8E4m3;
  static constexpr int kWarps = Warps;
  static constexpr int kStages = Stages;
  static constexpr int kThreads = 32 * Warps;
  /// Rows one round of the warps reads (the split chooser's unit).
  static constexpr int kTileRows = 16 * Warps;
  /// Bytes of one head row as stored (codes only for fp8).
  static constexpr int kRawRowBytes = kFp8 ? kFastHeadDim : 2 * kFastHeadDim;
  /// One warp's stage: 16 K rows, 16 V rows (swizzled), then (fp8) the 16
  /// keys' and the 16 values' scale words.
  static constexpr int kWarpStageBytes = 2 * 16 * kRawRowBytes + (kFp8 ? 2 * 16 * 4 : 0);
  static constexpr int kStagesBytes = kWarps * kStages * kWarpStageBytes;
  static constexpr int kIndexBytes = static_cast<int>(kFastMaxSplitColumns) * 4;
  static constexpr int kSharedBytes = kStagesBytes + kIndexBytes;
  /// Most splits the combine holds weights for (8 per split in the stages).
  static constexpr int kMostSplits = kStagesBytes / (4 * kFastHeads) - 1;
  /// Blocks per SM the register budget is set for.
  static constexpr int kMinBlocks = kWarps <= 4 ? 2 : 1;
  static_assert(kFastMaxSplitColumns % kTileRows == 0, "a split holds whole tiles");
  static_assert(kStagesBytes >= kWarps * kFastHeads * (kFastHeadDim + 2) * 4,
                "the stages hold the warps' states for the merge");
};

/// Two e4m3 codes (the low 16 bits of `x`) as an f16 pair (hardware
/// conversion on sm_89+, exact): the low code in the low half.
__device__ inline std::uint32_t fast_e4m3x2_to_f16x2(std::uint32_t x) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(x & 0xFFFFu), __NV_E4M3);
  return static_cast<std::uint32_t>(h.x) | (static_cast<std::uint32_t>(h.y) << 16);
}

/// Largest of the 16 scale bytes of four words.
__device__ inline int fast_scale_max(const std::uint32_t (&w)[4]) {
  const unsigned m = __vmaxu4(__vmaxu4(w[0], w[1]), __vmaxu4(w[2], w[3]));
  return static_cast<int>(max(max(m & 0xFFu, (m >> 8) & 0xFFu), max((m >> 16) & 0xFFu, m >> 24)));
}

/// Four e4m3 codes (the bytes of `x`) as two f16 pairs, lo = codes 0 and 1,
/// hi = codes 2 and 3 (the low code in the low half): two hardware
/// conversions that read the 16-bit halves of x in place.
__device__ inline void fast_e4m3x4_to_f16(std::uint32_t x, std::uint32_t& lo, std::uint32_t& hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm("{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, a;\n\t"
      "cvt.rn.f16x2.e4m3x2 %1, b;\n\t}"
      : "=r"(lo), "=r"(hi)
      : "r"(x));
#else
  lo = fast_e4m3x2_to_f16x2(x);
  hi = fast_e4m3x2_to_f16x2(x >> 16);
#endif
}

/// 2^(e - 127) as an f32 for the scale byte e in byte b of `word` (b a constant once unrolled) (0 for
/// e = 0): the byte shifted into the exponent field, two instructions.
__device__ inline float fast_scale_abs(std::uint32_t word, int b) {
  const std::uint32_t bits = b == 3 ? (word >> 1) : (word << (23 - 8 * b));
  return format_bits_float(bits & 0x7F800000u);
}

/// The warp-pipelined fast kernel. Same block decomposition, splits and
/// finish as ring_fast_attend_kernel; what differs:
/// * each warp gathers and consumes its own 16-row tiles (its own cp.async
///   groups, __syncwarp only), so warps drift apart and hide each other's
///   latencies instead of meeting at four barriers per tile;
/// * fp8 rows are never widened in shared memory: ldmatrix reads the raw
///   codes as b16 pairs and the tensor-core operands are converted in
///   registers. For Q.K the 4 codes a thread gets (dims 4t..4t+3 of a
///   16-dim k-step) become the B fragment's k = 2t, 2t+1 | 2t+8, 2t+9, and
///   the query's A fragment is built with the same permutation. For P.V the
///   transposed ldmatrix gives keys 2t, 2t+1 of dims 2g, 2g+1 as 4 bytes; one
///   byte permute pairs them per dim, so n-tile (chunk c, parity p) holds
///   dims 16c + 2n + p. The ue8m0 scales (one per 32 dims) stay out of the
///   operands: keys' scales multiply each 32-dim block's partial score
///   (2^(e - R), R the warp tile's largest), values' scales multiply the
///   probabilities of the A operand per 32-dim block (2^(e - V), V the
///   warp's running largest value scale, o in units of 2^(V - 127)).
template <ElementFormat F, class G, class Args>
__global__ void __launch_bounds__(G::kThreads, G::kMinBlocks)
    ring_fast_warp_attend_kernel(Args a, FastExtra extra) {
  constexpr bool kFp8 = G::kFp8;
  constexpr int kStages = G::kStages;
  constexpr int kThreads = G::kThreads;
  constexpr int kWarps = G::kWarps;
  constexpr int kRowBytes = G::kRawRowBytes;
  constexpr int kKSteps = kFastHeadDim / 16;  // 8 k-steps of QK^T
  constexpr int kNTiles = kFastHeadDim / 8;   // 16 n-tiles of PV
  const float neg_inf = format_bits_float(0xFF800000u);

  extern __shared__ __align__(128) unsigned char fast_smem[];
  unsigned char* stages = fast_smem;
  int* slots = reinterpret_cast<int*>(fast_smem + G::kStagesBytes);
  __shared__ int last_block;

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;   // mma groupID: query head g of the tile
  const int tig = lane & 3;  // mma thread-in-group

  const std::int32_t kv_heads = a.layout.kv_heads;
  const std::int32_t group = a.q_heads / kv_heads;
  std::int64_t blk = blockIdx.x;
  const std::int32_t tile = static_cast<std::int32_t>(blk % extra.head_tiles);
  blk /= extra.head_tiles;
  const std::int32_t kvh = static_cast<std::int32_t>(blk % kv_heads);
  const std::int64_t qi = blk / kv_heads;
  const std::int32_t split = static_cast<std::int32_t>(blockIdx.y);
  if (qi >= a.n || split >= a.splits) return;  // whole block: no barrier skipped
  const std::int32_t h0 = kvh * group + tile * kFastHeads;
  const int heads_here = group - tile * kFastHeads < kFastHeads ? group - tile * kFastHeads : kFastHeads;

  const std::int64_t chunk = (a.width + a.splits - 1) / a.splits;
  const std::int64_t c_begin = split * chunk;
  const std::int64_t c_end = c_begin + chunk < a.width ? c_begin + chunk : a.width;
  const int columns = c_end > c_begin ? static_cast<int>(c_end - c_begin) : 0;
  const int tiles = (columns + 15) / 16;  // 16-row warp tiles of the split

  [[maybe_unused]] long long index_v[kFastPreloadPer<kThreads>];
  if constexpr (G::kBatchedIndex) {
    fast_load_slots<kThreads>(a.index + qi * a.width + c_begin, columns, tid, index_v);
  } else {
    const std::int64_t* index_row = a.index + qi * a.width + c_begin;
    for (int c = tid; c < tiles * 16; c += kThreads) {
      long long s = c < columns ? static_cast<long long>(index_row[c]) : -1ll;
      if (s < 0 || s >= a.row_count) s = -1;
      slots[c] = static_cast<int>(s);
    }
  }

  const std::int64_t head_offset = static_cast<std::int64_t>(kvh) * kFastHeadDim;
  const std::uint8_t* key_base = a.rows + head_offset * (kFp8 ? 1 : 2);
  const std::uint8_t* value_base = key_base + (a.layout.shared_row ? 0 : a.layout.row_bytes);
  const std::uint8_t* key_scale_base = a.rows + a.layout.row_elements + kvh * (kFastHeadDim / 32);
  const std::uint8_t* value_scale_base = key_scale_base + (a.layout.shared_row ? 0 : a.layout.row_bytes);

  // This warp's tiles: u = warp, warp + kWarps, ...; its stage ring.
  const int my_tiles = warp < tiles ? (tiles - warp + kWarps - 1) / kWarps : 0;
  unsigned char* ring = stages + warp * kStages * G::kWarpStageBytes;

  // Row r, 16-byte chunk c of a warp stage's K or V rows: chunk ^ (r & 7), so
  // the 8 rows one ldmatrix reads sit in 8 distinct bank groups.
  auto swz = [](int r, int c) -> std::uint32_t {
    return static_cast<std::uint32_t>(r * kRowBytes + ((c ^ (r & 7)) << 4));
  };

  // Issues the copies of this warp's k-th tile into stage k % kStages. A
  // warp instruction covers whole rows (4 fp8 rows, 2 bf16 rows).
  auto issue = [&](int k) {
    const int* ts = slots + (warp + k * kWarps) * 16;
    const std::uint32_t k_dst = fast_shared_address(ring + (k % kStages) * G::kWarpStageBytes);
    const std::uint32_t v_dst = k_dst + 16 * kRowBytes;
    constexpr int kRowChunks = kRowBytes / 16;
    constexpr int kPerLane = 16 * kRowChunks / 32;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int q = i * 32 + lane;
      const int r = q / kRowChunks;
      const int c = q % kRowChunks;
      const int s = ts[r];
      const bool live = s >= 0;
      const std::int64_t at = (live ? static_cast<std::int64_t>(s) : 0) * a.layout.slot_bytes + c * 16;
      fast_copy_async<16>(k_dst + swz(r, c), key_base + at, live);
      fast_copy_async<16>(v_dst + swz(r, c), value_base + at, live);
    }
    if constexpr (kFp8) {
      const int r = lane & 15;
      const int s = ts[r];
      const bool live = s >= 0;
      const std::int64_t at = (live ? static_cast<std::int64_t>(s) : 0) * a.layout.slot_bytes;
      const std::uint8_t* src = lane < 16 ? key_scale_base + at : value_scale_base + at;
      fast_copy_async<4>(v_dst + 16 * kRowBytes + static_cast<std::uint32_t>(lane * 4), src, live);
    }
  };

  // The query heads as mma A fragments: row g = hi(q), row g + 8 = lo(q).
  // bf16: k index i of k-step ks is dim 16 ks + i. fp8: k = 2t + j is dim
  // 16 ks + 4t + j and k = 2t + 8 + j is dim 16 ks + 4t + 2 + j (the order
  // the raw codes arrive in), q scaled by 2^-q_exp into f16's range.
  std::uint32_t qa[kKSteps][4];
  int q_exp = 0;
  {
    const bool head_live = g < heads_here;
    const float* qrow = a.q + (qi * a.q_heads + h0 + (head_live ? g : 0)) * kFastHeadDim;
    float qv[kKSteps][4];
    float qmax = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int d = kFp8 ? ks * 16 + 4 * tig + 2 * half : ks * 16 + half * 8 + 2 * tig;
        qv[ks][2 * half] = head_live ? qrow[d] : 0.0f;
        qv[ks][2 * half + 1] = head_live ? qrow[d + 1] : 0.0f;
        qmax = fmaxf(qmax, fmaxf(fabsf(qv[ks][2 * half]), fabsf(qv[ks][2 * half + 1])));
      }
    }
    if constexpr (kFp8) {
      qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, 1));
      qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, 2));
      q_exp = qmax > 0.0f ? static_cast<int>((format_float_bits(qmax) >> 23) & 0xFF) - 127 - 8 : 0;
      if (qmax > 0.0f && qmax < 1.17549435e-38f) q_exp = -127;
    }
    const float q_scale = kFp8 ? fast_pow2(-q_exp) : 1.0f;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        fast_split_pack<kFp8>(qv[ks][2 * half] * q_scale, qv[ks][2 * half + 1] * q_scale, qa[ks][2 * half],
                              qa[ks][2 * half + 1]);
      }
    }
  }
  const float q_factor = a.scale * (kFp8 ? fast_pow2(q_exp) : 1.0f);

  if constexpr (G::kBatchedIndex) fast_store_slots<kThreads>(index_v, tiles * 16, a.row_count, tid, slots);
  __syncthreads();  // the slots

  float o[kNTiles][4];
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m = neg_inf;  // running max of row g (same in the 4 lanes of a quad)
  float l = 0.0f;     // this lane's share of the running sum
  int v_exp = -1;     // fp8: the warp's largest value scale byte so far (o is in its units)

#pragma unroll
  for (int u = 0; u < kStages - 1; ++u) {
    if (u < my_tiles) issue(u);
    fast_commit();
  }

  const int mi = lane >> 3;
  const int rr = lane & 7;
  for (int k = 0; k < my_tiles; ++k) {
    if (k + kStages - 1 < my_tiles) issue(k + kStages - 1);
    fast_commit();
    fast_wait<kStages - 1>();
    __syncwarp();

    const unsigned char* st = ring + (k % kStages) * G::kWarpStageBytes;
    const std::uint32_t k_tile = fast_shared_address(st);
    const std::uint32_t v_tile = k_tile + 16 * kRowBytes;
    const int* ts = slots + (warp + k * kWarps) * 16;
    // This thread's keys: 2t, 2t + 1 (n-tile 0) and 2t + 8, 2t + 9 (n-tile 1).
    const bool live[4] = {ts[2 * tig] >= 0, ts[2 * tig + 1] >= 0, ts[8 + 2 * tig] >= 0, ts[9 + 2 * tig] >= 0};
    if (__any_sync(0xffffffffu, live[0] || live[1] || live[2] || live[3])) {
      float sc[4];
      std::uint32_t vword[4] = {0u, 0u, 0u, 0u};
      float value_rescale = 1.0f;
      if constexpr (kFp8) {
        const std::uint32_t* kw = reinterpret_cast<const std::uint32_t*>(st + 2 * 16 * kRowBytes);
        const std::uint32_t* vw = kw + 16;
        const std::uint32_t kword[4] = {kw[2 * tig], kw[2 * tig + 1], kw[8 + 2 * tig], kw[9 + 2 * tig]};
        vword[0] = vw[2 * tig];
        vword[1] = vw[2 * tig + 1];
        vword[2] = vw[8 + 2 * tig];
        vword[3] = vw[9 + 2 * tig];
        int k_ref = fast_scale_max(kword);
        int v_ref = fast_scale_max(vword);
        k_ref = max(k_ref, __shfl_xor_sync(0xffffffffu, k_ref, 1));
        k_ref = max(k_ref, __shfl_xor_sync(0xffffffffu, k_ref, 2));
        v_ref = max(v_ref, __shfl_xor_sync(0xffffffffu, v_ref, 1));
        v_ref = max(v_ref, __shfl_xor_sync(0xffffffffu, v_ref, 2));
        if (v_ref > v_exp) {
          value_rescale = v_exp < 0 ? 0.0f : fast_pow2(v_exp - v_ref);
          v_exp = v_ref;
        }
        sc[0] = sc[1] = sc[2] = sc[3] = 0.0f;
        const float k_unit = fast_pow2(127 - k_ref);  // 2^(e - 127) * k_unit = 2^(e - k_ref)
#pragma unroll
        for (int b = 0; b < kFastHeadDim / 32; ++b) {
          // keys rr (+8 for matrices 2, 3), chunks 2b (matrices 0, 2) and 2b + 1.
          std::uint32_t r[4];
          fast_ldmatrix_x4(k_tile + swz(rr + 8 * (mi >> 1), 2 * b + (mi & 1)), r);
          std::uint32_t kb[4][2];
#pragma unroll
          for (int i = 0; i < 4; ++i) fast_e4m3x4_to_f16(r[i], kb[i][0], kb[i][1]);
          float s0[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          float s1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          fast_mma<true>(s0, qa[2 * b], kb[0][0], kb[0][1]);
          fast_mma<true>(s1, qa[2 * b], kb[2][0], kb[2][1]);
          fast_mma<true>(s0, qa[2 * b + 1], kb[1][0], kb[1][1]);
          fast_mma<true>(s1, qa[2 * b + 1], kb[3][0], kb[3][1]);
          sc[0] = fmaf(s0[0] + s0[2], (fast_scale_abs(kword[0], b) * k_unit), sc[0]);
          sc[1] = fmaf(s0[1] + s0[3], (fast_scale_abs(kword[1], b) * k_unit), sc[1]);
          sc[2] = fmaf(s1[0] + s1[2], (fast_scale_abs(kword[2], b) * k_unit), sc[2]);
          sc[3] = fmaf(s1[1] + s1[3], (fast_scale_abs(kword[3], b) * k_unit), sc[3]);
        }
        const float f = q_factor * fast_pow2(k_ref - 127);
#pragma unroll
        for (int i = 0; i < 4; ++i) sc[i] *= f;
      } else {
        float s0[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        float s1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) {
          std::uint32_t b[4];
          fast_ldmatrix_x4(k_tile + swz(8 * (mi >> 1) + rr, 2 * ks + (mi & 1)), b);
          fast_mma<false>(s0, qa[ks], b[0], b[1]);
          fast_mma<false>(s1, qa[ks], b[2], b[3]);
        }
        sc[0] = (s0[0] + s0[2]) * q_factor;
        sc[1] = (s0[1] + s0[3]) * q_factor;
        sc[2] = (s1[0] + s1[2]) * q_factor;
        sc[3] = (s1[1] + s1[3]) * q_factor;
      }
      float top = neg_inf;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        sc[i] = live[i] ? sc[i] : neg_inf;
        top = sc[i] > top ? sc[i] : top;
      }
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
      const float m_new = m > top ? m : top;
      float corr = 1.0f;
      float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (m_new != neg_inf) {
        corr = m == neg_inf ? 0.0f : expf(m - m_new);
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = live[i] ? expf(sc[i] - m_new) : 0.0f;
        m = m_new;
      }
      l = l * corr + ((p[0] + p[1]) + (p[2] + p[3]));
      const float o_scale = corr * value_rescale;
      if (__any_sync(0xffffffffu, o_scale != 1.0f)) {
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
          o[j][0] *= o_scale;
          o[j][1] *= o_scale;
          o[j][2] *= o_scale;
          o[j][3] *= o_scale;
        }
      }
      if constexpr (kFp8) {
        // p * 2^(127 - v_exp) * 2^(e - 127) = p * 2^(e - v_exp) per 32-dim block.
        const float v_unit = fast_pow2(127 - v_exp);
        const float pv[4] = {p[0] * v_unit, p[1] * v_unit, p[2] * v_unit, p[3] * v_unit};
#pragma unroll
        for (int b = 0; b < kFastHeadDim / 32; ++b) {
          // Probabilities times 2^(value scale - v_exp) of this 32-dim block.
          std::uint32_t pa[4];
          fast_split_pack<true>(pv[0] * fast_scale_abs(vword[0], b), pv[1] * fast_scale_abs(vword[1], b),
                                pa[0], pa[1]);
          fast_split_pack<true>(pv[2] * fast_scale_abs(vword[2], b), pv[3] * fast_scale_abs(vword[3], b),
                                pa[2], pa[3]);
          // keys rr (+8 for matrices 1, 3), chunks 2b (matrices 0, 1) and 2b + 1.
          std::uint32_t r[4];
          fast_ldmatrix_x4_trans(v_tile + swz(rr + 8 * (mi & 1), 2 * b + (mi >> 1)), r);
#pragma unroll
          for (int cc = 0; cc < 2; ++cc) {
            // r: keys 2t, 2t + 1 of dims 2g, 2g + 1 -> (dim 2g: both keys), (dim 2g + 1: both keys).
            std::uint32_t d0_lo, d1_lo, d0_hi,
                d1_hi;  // dim 2g (d0) and 2g + 1 (d1) of keys 0-7 (lo), 8-15 (hi)
            d0_lo = fast_e4m3x2_to_f16x2(__byte_perm(r[2 * cc], 0u, 0x4420));  // bytes 0, 2: dim 2g
            d1_lo = fast_e4m3x2_to_f16x2(__byte_perm(r[2 * cc], 0u, 0x4431));  // bytes 1, 3: dim 2g + 1
            d0_hi = fast_e4m3x2_to_f16x2(__byte_perm(r[2 * cc + 1], 0u, 0x4420));
            d1_hi = fast_e4m3x2_to_f16x2(__byte_perm(r[2 * cc + 1], 0u, 0x4431));
            const int j = 2 * (2 * b + cc);
            fast_mma<true>(o[j], pa, d0_lo, d0_hi);
            fast_mma<true>(o[j + 1], pa, d1_lo, d1_hi);
          }
        }
      } else {
        std::uint32_t pa[4];
        fast_split_pack<false>(p[0], p[1], pa[0], pa[1]);
        fast_split_pack<false>(p[2], p[3], pa[2], pa[3]);
#pragma unroll
        for (int j = 0; j < kNTiles; j += 2) {
          std::uint32_t b[4];
          fast_ldmatrix_x4_trans(v_tile + swz(8 * (mi & 1) + rr, j + (mi >> 1)), b);
          fast_mma<false>(o[j], pa, b[0], b[1]);
          fast_mma<false>(o[j + 1], pa, b[2], b[3]);
        }
      }
    }
    __syncwarp();  // every lane is done with this stage before it is refilled
  }

  fast_wait<0>();
  __syncthreads();  // every warp is done with the stages: they hold the merge now

  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  const float o_unit = kFp8 ? (v_exp < 0 ? 0.0f : fast_pow2(v_exp - 127)) : 1.0f;
  float* sh_o = reinterpret_cast<float*>(stages);            // [warps][8][128]
  float* sh_ml = sh_o + kWarps * kFastHeads * kFastHeadDim;  // [warps][8][2]
  float* row = sh_o + (warp * kFastHeads + g) * kFastHeadDim;
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) {
    // bf16: n-tile j is dims 8j..8j+7; fp8: chunk j / 2, parity j % 2 (dims 16c + 2n + p).
    const int d0 = kFp8 ? 16 * (j / 2) + 4 * tig + (j % 2) : 8 * j + 2 * tig;
    const int d1 = kFp8 ? d0 + 2 : d0 + 1;
    row[d0] = (o[j][0] + o[j][2]) * o_unit;
    row[d1] = (o[j][1] + o[j][3]) * o_unit;
  }
  if (tig == 0) {
    sh_ml[(warp * kFastHeads + g) * 2] = m;
    sh_ml[(warp * kFastHeads + g) * 2 + 1] = l;
  }
  __syncthreads();
  fast_block_finish<kWarps, kThreads>(a, stages, heads_here, qi, h0, split, tid, &last_block);
}

// ---- the slot-major kernel -------------------------------------------------------

/// Geometry of the slot-major kernel (ring_fast_slot_attend_kernel): one
/// block is (query, up to Warps (KV head, head tile) pairs) x one split, and
/// warp w streams pair w's head rows of every column of the split through its
/// own ring of Stages 16-row stages. The warps of a block read the heads of
/// the same 16 slots at about the same time (Couple: one block barrier per
/// tile keeps them together), so the DRAM sees whole K and V rows (all KV
/// heads, 1-4 KiB contiguous) instead of one 128/256-byte head piece per
/// block at a time.
template <ElementFormat F, int Warps, int Stages, bool Couple, int MinBlocks = 1, int Halves = 1,
          int Cluster = 1, bool BatchedIndex = false>
struct FastSlotGeometry {
  static constexpr bool kWarpPipe = false;
  static constexpr bool kSlotMajor = true;
  /// Index preload with every load issued first (fast_load_slots) instead
  /// of the load-then-store loop. Not measured on a device yet.
  static constexpr bool kBatchedIndex = BatchedIndex;
  /// Blocks (consecutive splits of one query and group) per thread block
  /// cluster; > 1: the cluster merges its splits through distributed shared
  /// memory and writes one partial state (see ring_fast_slot_attend_kernel).
  static constexpr int kCluster = Cluster;
  static constexpr bool kCouple = Couple;
  static constexpr bool kFp8 = F == ElementFormat::kFp8E4m3;
  static constexpr int kWarps = Warps;
  static constexpr int kStages = Stages;
  static constexpr int kThreads = 32 * Warps;
  /// 16-row halves of a tile, processed with one softmax step.
  static constexpr int kHalves = Halves;
  /// Rows of one tile (every warp reads them, each its own head).
  static constexpr int kTileRows = 16 * Halves;
  static constexpr int kRawRowBytes = kFp8 ? kFastHeadDim : 2 * kFastHeadDim;
  /// One warp's stage: kTileRows K rows, as many V rows, (fp8) their scale words.
  static constexpr int kWarpStageBytes = 2 * kTileRows * kRawRowBytes + (kFp8 ? 2 * kTileRows * 4 : 0);
  static constexpr int kStagesBytes = kWarps * kStages * kWarpStageBytes;
  static constexpr int kIndexBytes = static_cast<int>(kFastMaxSplitColumns) * 4;
  static constexpr int kSharedBytes = kStagesBytes + kIndexBytes;
  static constexpr int kMinBlocks = MinBlocks;
  /// Most splits the warp-level combine holds weights for (8 per split in a
  /// warp's ring); with clusters, most partial states (one per cluster) the
  /// block-level combine holds weights for.
  static constexpr int kMostSplits =
      (Cluster > 1 ? kStagesBytes : kStages * kWarpStageBytes) / (4 * kFastHeads) - 1;
  static_assert(Cluster == 1 || (Cluster <= 8 && Warps % Cluster == 0),
                "a portable cluster; its blocks share the block's pairs evenly");
  static_assert(kStages * kWarpStageBytes >= kFastHeads * (kFastHeadDim + 2) * 4,
                "a warp's ring holds its state for the cluster merge");
};

/// The slot-major kernel (see FastSlotGeometry). The per-tile work of a warp
/// is ring_fast_warp_attend_kernel's; each warp owns whole (KV head, head
/// tile) pairs, so it finishes alone: it writes its split's partial state,
/// and the last split's warp of a pair to finish combines every split.
template <ElementFormat F, class G, class Args>
__global__ void __launch_bounds__(G::kThreads, G::kMinBlocks)
    ring_fast_slot_attend_kernel(Args a, FastExtra extra) {
  constexpr bool kFp8 = G::kFp8;
  constexpr int kStages = G::kStages;
  constexpr int kThreads = G::kThreads;
  constexpr int kWarps = G::kWarps;
  constexpr int kRowBytes = G::kRawRowBytes;
  constexpr int kHalves = G::kHalves;
  constexpr int kRows = G::kTileRows;
  constexpr int kKSteps = kFastHeadDim / 16;
  constexpr int kNTiles = kFastHeadDim / 8;
  const float neg_inf = format_bits_float(0xFF800000u);

  extern __shared__ __align__(128) unsigned char fast_smem[];
  unsigned char* stages = fast_smem;
  int* slots = reinterpret_cast<int*>(fast_smem + G::kStagesBytes);

  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int tig = lane & 3;

  const std::int32_t kv_heads = a.layout.kv_heads;
  const std::int32_t group = a.q_heads / kv_heads;
  const std::int32_t pairs = kv_heads * extra.head_tiles;
  const std::int32_t groups = (pairs + kWarps - 1) / kWarps;
  const std::int64_t qi = static_cast<std::int64_t>(blockIdx.x) / groups;
  const std::int32_t pair = static_cast<std::int32_t>(blockIdx.x % groups) * kWarps + warp;
  const std::int32_t split = static_cast<std::int32_t>(blockIdx.y);
  if (qi >= a.n || split >= a.splits) return;  // whole block: no barrier skipped
  const bool warp_live = pair < pairs;
  const std::int32_t kvh = warp_live ? pair / extra.head_tiles : 0;
  const std::int32_t tile = warp_live ? pair % extra.head_tiles : 0;
  const std::int32_t h0 = kvh * group + tile * kFastHeads;
  const int heads_here = !warp_live                               ? 0
                         : group - tile * kFastHeads < kFastHeads ? group - tile * kFastHeads
                                                                  : kFastHeads;

  const std::int64_t chunk = (a.width + a.splits - 1) / a.splits;
  const std::int64_t c_begin = split * chunk;
  const std::int64_t c_end = c_begin + chunk < a.width ? c_begin + chunk : a.width;
  const int columns = c_end > c_begin ? static_cast<int>(c_end - c_begin) : 0;
  const int tiles = (columns + kRows - 1) / kRows;

  [[maybe_unused]] long long index_v[kFastPreloadPer<kThreads>];
  if constexpr (G::kBatchedIndex) {
    fast_load_slots<kThreads>(a.index + qi * a.width + c_begin, columns, tid, index_v);
  } else {
    const std::int64_t* index_row = a.index + qi * a.width + c_begin;
    for (int c = tid; c < tiles * kRows; c += kThreads) {
      long long s = c < columns ? static_cast<long long>(index_row[c]) : -1ll;
      if (s < 0 || s >= a.row_count) s = -1;
      slots[c] = static_cast<int>(s);
    }
  }

  const std::int64_t head_offset = static_cast<std::int64_t>(kvh) * kFastHeadDim;
  const std::uint8_t* key_base = a.rows + head_offset * (kFp8 ? 1 : 2);
  const std::uint8_t* value_base = key_base + (a.layout.shared_row ? 0 : a.layout.row_bytes);
  const std::uint8_t* key_scale_base = a.rows + a.layout.row_elements + kvh * (kFastHeadDim / 32);
  const std::uint8_t* value_scale_base = key_scale_base + (a.layout.shared_row ? 0 : a.layout.row_bytes);
  unsigned char* ring = stages + warp * kStages * G::kWarpStageBytes;

  auto swz = [](int r, int c) -> std::uint32_t {
    return static_cast<std::uint32_t>(r * kRowBytes + ((c ^ (r & 7)) << 4));
  };
  auto issue = [&](int k) {
    const int* ts = slots + k * kRows;
    const std::uint32_t k_dst = fast_shared_address(ring + (k % kStages) * G::kWarpStageBytes);
    const std::uint32_t v_dst = k_dst + kRows * kRowBytes;
    constexpr int kRowChunks = kRowBytes / 16;
    constexpr int kPerLane = kRows * kRowChunks / 32;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int q = i * 32 + lane;
      const int r = q / kRowChunks;
      const int c = q % kRowChunks;
      const int s = ts[r];
      const bool live = s >= 0;
      const std::int64_t at = (live ? static_cast<std::int64_t>(s) : 0) * a.layout.slot_bytes + c * 16;
      fast_copy_async<16>(k_dst + swz(r, c), key_base + at, live);
      fast_copy_async<16>(v_dst + swz(r, c), value_base + at, live);
    }
    if constexpr (kFp8) {
#pragma unroll
      for (int i = lane; i < 2 * kRows; i += 32) {
        const int r = i % kRows;
        const int s = ts[r];
        const bool live = s >= 0;
        const std::int64_t at = (live ? static_cast<std::int64_t>(s) : 0) * a.layout.slot_bytes;
        const std::uint8_t* src = i < kRows ? key_scale_base + at : value_scale_base + at;
        fast_copy_async<4>(v_dst + kRows * kRowBytes + static_cast<std::uint32_t>(i * 4), src, live);
      }
    }
  };

  std::uint32_t qa[kKSteps][4];
  int q_exp = 0;
  {
    const bool head_live = g < heads_here;
    const float* qrow = a.q + (qi * a.q_heads + h0 + (head_live ? g : 0)) * kFastHeadDim;
    float qv[kKSteps][4];
    float qmax = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int d = kFp8 ? ks * 16 + 4 * tig + 2 * half : ks * 16 + half * 8 + 2 * tig;
        qv[ks][2 * half] = head_live ? qrow[d] : 0.0f;
        qv[ks][2 * half + 1] = head_live ? qrow[d + 1] : 0.0f;
        qmax = fmaxf(qmax, fmaxf(fabsf(qv[ks][2 * half]), fabsf(qv[ks][2 * half + 1])));
      }
    }
    if constexpr (kFp8) {
      qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, 1));
      qmax = fmaxf(qmax, __shfl_xor_sync(0xffffffffu, qmax, 2));
      q_exp = qmax > 0.0f ? static_cast<int>((format_float_bits(qmax) >> 23) & 0xFF) - 127 - 8 : 0;
      if (qmax > 0.0f && qmax < 1.17549435e-38f) q_exp = -127;
    }
    const float q_scale = kFp8 ? fast_pow2(-q_exp) : 1.0f;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        fast_split_pack<kFp8>(qv[ks][2 * half] * q_scale, qv[ks][2 * half + 1] * q_scale, qa[ks][2 * half],
                              qa[ks][2 * half + 1]);
      }
    }
  }
  const float q_factor = a.scale * (kFp8 ? fast_pow2(q_exp) : 1.0f);

  if constexpr (G::kBatchedIndex) fast_store_slots<kThreads>(index_v, tiles * kRows, a.row_count, tid, slots);
  __syncthreads();  // the slots

  float o[kNTiles][4];
#pragma unroll
  for (int j = 0; j < kNTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m = neg_inf;
  float l = 0.0f;
  int v_exp = -1;

#pragma unroll
  for (int u = 0; u < kStages - 1; ++u) {
    if (warp_live && u < tiles) issue(u);
    fast_commit();
  }

  const int mi = lane >> 3;
  const int rr = lane & 7;
  for (int k = 0; k < tiles; ++k) {
    if constexpr (G::kCouple) __syncthreads();
    if (warp_live && k + kStages - 1 < tiles) issue(k + kStages - 1);
    fast_commit();
    fast_wait<kStages - 1>();
    __syncwarp();
    if (!warp_live) continue;

    const unsigned char* st = ring + (k % kStages) * G::kWarpStageBytes;
    const std::uint32_t k_tile = fast_shared_address(st);
    const std::uint32_t v_tile = k_tile + kRows * kRowBytes;
    const int* ts = slots + k * kRows;
    // This thread's keys of half h: 16h + 2t, 2t + 1 (n-tile 0), 2t + 8, 2t + 9 (n-tile 1).
    bool live[kHalves][4];
    bool any = false;
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      live[h][0] = ts[16 * h + 2 * tig] >= 0;
      live[h][1] = ts[16 * h + 2 * tig + 1] >= 0;
      live[h][2] = ts[16 * h + 8 + 2 * tig] >= 0;
      live[h][3] = ts[16 * h + 9 + 2 * tig] >= 0;
      any = any || live[h][0] || live[h][1] || live[h][2] || live[h][3];
    }
    if (__any_sync(0xffffffffu, any)) {
      float sc[kHalves][4];
      std::uint32_t vword[kHalves][4];
      float value_rescale = 1.0f;
      if constexpr (kFp8) {
        const std::uint32_t* kw = reinterpret_cast<const std::uint32_t*>(st + 2 * kRows * kRowBytes);
        const std::uint32_t* vw = kw + kRows;
        std::uint32_t kword[kHalves][4];
        int k_ref = 0, v_ref = 0;
#pragma unroll
        for (int h = 0; h < kHalves; ++h) {
          const int b0 = 16 * h + 2 * tig;
          kword[h][0] = kw[b0];
          kword[h][1] = kw[b0 + 1];
          kword[h][2] = kw[b0 + 8];
          kword[h][3] = kw[b0 + 9];
          vword[h][0] = vw[b0];
          vword[h][1] = vw[b0 + 1];
          vword[h][2] = vw[b0 + 8];
          vword[h][3] = vw[b0 + 9];
          k_ref = max(k_ref, fast_scale_max(kword[h]));
          v_ref = max(v_ref, fast_scale_max(vword[h]));
        }
        k_ref = max(k_ref, __shfl_xor_sync(0xffffffffu, k_ref, 1));
        k_ref = max(k_ref, __shfl_xor_sync(0xffffffffu, k_ref, 2));
        v_ref = max(v_ref, __shfl_xor_sync(0xffffffffu, v_ref, 1));
        v_ref = max(v_ref, __shfl_xor_sync(0xffffffffu, v_ref, 2));
        if (v_ref > v_exp) {
          value_rescale = v_exp < 0 ? 0.0f : fast_pow2(v_exp - v_ref);
          v_exp = v_ref;
        }
        const float f = q_factor * fast_pow2(k_ref - 127);
        const float k_unit = fast_pow2(127 - k_ref);  // 2^(e - 127) * k_unit = 2^(e - k_ref)
#pragma unroll
        for (int h = 0; h < kHalves; ++h) {
          sc[h][0] = sc[h][1] = sc[h][2] = sc[h][3] = 0.0f;
#pragma unroll
          for (int b = 0; b < kFastHeadDim / 32; ++b) {
            // keys rr (+8 for matrices 2, 3), chunks 2b (matrices 0, 2) and 2b + 1.
            std::uint32_t r[4];
            fast_ldmatrix_x4(k_tile + swz(16 * h + rr + 8 * (mi >> 1), 2 * b + (mi & 1)), r);
            std::uint32_t kb[4][2];
#pragma unroll
            for (int i = 0; i < 4; ++i) fast_e4m3x4_to_f16(r[i], kb[i][0], kb[i][1]);
            float s0[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            float s1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            fast_mma<true>(s0, qa[2 * b], kb[0][0], kb[0][1]);
            fast_mma<true>(s1, qa[2 * b], kb[2][0], kb[2][1]);
            fast_mma<true>(s0, qa[2 * b + 1], kb[1][0], kb[1][1]);
            fast_mma<true>(s1, qa[2 * b + 1], kb[3][0], kb[3][1]);
            sc[h][0] = fmaf(s0[0] + s0[2], (fast_scale_abs(kword[h][0], b) * k_unit), sc[h][0]);
            sc[h][1] = fmaf(s0[1] + s0[3], (fast_scale_abs(kword[h][1], b) * k_unit), sc[h][1]);
            sc[h][2] = fmaf(s1[0] + s1[2], (fast_scale_abs(kword[h][2], b) * k_unit), sc[h][2]);
            sc[h][3] = fmaf(s1[1] + s1[3], (fast_scale_abs(kword[h][3], b) * k_unit), sc[h][3]);
          }
#pragma unroll
          for (int i = 0; i < 4; ++i) sc[h][i] *= f;
        }
      } else {
#pragma unroll
        for (int h = 0; h < kHalves; ++h) {
          float s0[4] = {0.0f, 0.0f, 0.0f, 0.0f};
          float s1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int ks = 0; ks < kKSteps; ++ks) {
            std::uint32_t b[4];
            fast_ldmatrix_x4(k_tile + swz(16 * h + 8 * (mi >> 1) + rr, 2 * ks + (mi & 1)), b);
            fast_mma<false>(s0, qa[ks], b[0], b[1]);
            fast_mma<false>(s1, qa[ks], b[2], b[3]);
          }
          sc[h][0] = (s0[0] + s0[2]) * q_factor;
          sc[h][1] = (s0[1] + s0[3]) * q_factor;
          sc[h][2] = (s1[0] + s1[2]) * q_factor;
          sc[h][3] = (s1[1] + s1[3]) * q_factor;
        }
      }
      float top = neg_inf;
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          sc[h][i] = live[h][i] ? sc[h][i] : neg_inf;
          top = sc[h][i] > top ? sc[h][i] : top;
        }
      }
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
      const float m_new = m > top ? m : top;
      float corr = 1.0f;
      float p[kHalves][4];
      float psum = 0.0f;
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          p[h][i] = live[h][i] && m_new != neg_inf ? expf(sc[h][i] - m_new) : 0.0f;
        }
        psum += (p[h][0] + p[h][1]) + (p[h][2] + p[h][3]);
      }
      if (m_new != neg_inf) {
        corr = m == neg_inf ? 0.0f : expf(m - m_new);
        m = m_new;
      }
      l = l * corr + psum;
      const float o_scale = corr * value_rescale;
      if (__any_sync(0xffffffffu, o_scale != 1.0f)) {
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
          o[j][0] *= o_scale;
          o[j][1] *= o_scale;
          o[j][2] *= o_scale;
          o[j][3] *= o_scale;
        }
      }
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        if constexpr (kFp8) {
          // p * 2^(127 - v_exp) * 2^(e - 127) = p * 2^(e - v_exp) per 32-dim block.
          const float v_unit = fast_pow2(127 - v_exp);
          const float pv[4] = {p[h][0] * v_unit, p[h][1] * v_unit, p[h][2] * v_unit, p[h][3] * v_unit};
#pragma unroll
          for (int b = 0; b < kFastHeadDim / 32; ++b) {
            // Probabilities times 2^(value scale - v_exp) of this 32-dim block.
            std::uint32_t pa[4];
            fast_split_pack<true>(pv[0] * fast_scale_abs(vword[h][0], b),
                                  pv[1] * fast_scale_abs(vword[h][1], b), pa[0], pa[1]);
            fast_split_pack<true>(pv[2] * fast_scale_abs(vword[h][2], b),
                                  pv[3] * fast_scale_abs(vword[h][3], b), pa[2], pa[3]);
            // keys rr (+8 for matrices 1, 3), chunks 2b (matrices 0, 1) and 2b + 1.
            std::uint32_t r[4];
            fast_ldmatrix_x4_trans(v_tile + swz(16 * h + rr + 8 * (mi & 1), 2 * b + (mi >> 1)), r);
#pragma unroll
            for (int cc = 0; cc < 2; ++cc) {
              // r: keys 2t, 2t + 1 of dims 2g, 2g + 1 -> (dim 2g: both keys), (dim 2g + 1: both keys).
              std::uint32_t d0_lo, d1_lo, d0_hi,
                  d1_hi;  // dim 2g (d0) and 2g + 1 (d1) of keys 0-7 (lo), 8-15 (hi)
              d0_lo = fast_e4m3x2_to_f16x2(__byte_perm(r[2 * cc], 0u, 0x4420));  // bytes 0, 2: dim 2g
              d1_lo = fast_e4m3x2_to_f16x2(__byte_perm(r[2 * cc], 0u, 0x4431));  // bytes 1, 3: dim 2g + 1
              d0_hi = fast_e4m3x2_to_f16x2(__byte_perm(r[2 * cc + 1], 0u, 0x4420));
              d1_hi = fast_e4m3x2_to_f16x2(__byte_perm(r[2 * cc + 1], 0u, 0x4431));
              const int j = 2 * (2 * b + cc);
              fast_mma<true>(o[j], pa, d0_lo, d0_hi);
              fast_mma<true>(o[j + 1], pa, d1_lo, d1_hi);
            }
          }
        } else {
          std::uint32_t pa[4];
          fast_split_pack<false>(p[h][0], p[h][1], pa[0], pa[1]);
          fast_split_pack<false>(p[h][2], p[h][3], pa[2], pa[3]);
#pragma unroll
          for (int j = 0; j < kNTiles; j += 2) {
            std::uint32_t b[4];
            fast_ldmatrix_x4_trans(v_tile + swz(16 * h + 8 * (mi & 1) + rr, j + (mi >> 1)), b);
            fast_mma<false>(o[j], pa, b[0], b[1]);
            fast_mma<false>(o[j + 1], pa, b[2], b[3]);
          }
        }
      }
    }
    __syncwarp();
  }
  fast_wait<0>();
  __syncwarp();
  if constexpr (G::kCluster > 1) {
    // The cluster's kCluster blocks are consecutive splits of one (query,
    // group). Each warp leaves its state (o in [8][128], then (m, l) per
    // head) in its own ring; block r of the cluster merges pairs r, r + C,
    // ... across the cluster's blocks, reading their rings through
    // distributed shared memory, and writes one partial state per cluster:
    // the combine then reads splits / C partials (at 128 splits of the
    // split-K shape one warp summing every split's partial was the longest
    // phase of the launch).
    constexpr int kC = G::kCluster;
    __shared__ int cluster_last;
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    {
      const float o_unit = kFp8 ? (v_exp < 0 ? 0.0f : fast_pow2(v_exp - 127)) : 1.0f;
      float* state = reinterpret_cast<float*>(ring);  // [8][128] o, then [8][2] (m, l)
      if (warp_live && g < heads_here) {
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
          const int d0 = kFp8 ? 16 * (j / 2) + 4 * tig + (j % 2) : 8 * j + 2 * tig;
          const int d1 = kFp8 ? d0 + 2 : d0 + 1;
          state[g * kFastHeadDim + d0] = (o[j][0] + o[j][2]) * o_unit;
          state[g * kFastHeadDim + d1] = (o[j][1] + o[j][3]) * o_unit;
        }
        if (tig == 0) {
          state[kFastHeads * kFastHeadDim + 2 * g] = m;
          state[kFastHeads * kFastHeadDim + 2 * g + 1] = l;
        }
      }
    }
    cluster.sync();  // every block's states are written (release / acquire across the cluster)
    const int rank = static_cast<int>(cluster.block_rank());
    const std::int32_t partials = a.splits / kC;
    const std::int32_t partial = split / kC;
    const std::int32_t group_base = static_cast<std::int32_t>(blockIdx.x % groups) * kWarps;
    for (int p = rank; p < kWarps; p += kC) {
      const std::int32_t pp = group_base + p;
      if (pp >= pairs) break;  // uniform over the block
      const std::int32_t p_kvh = pp / extra.head_tiles;
      const std::int32_t p_tile = pp % extra.head_tiles;
      const std::int32_t p_h0 = p_kvh * group + p_tile * kFastHeads;
      const int p_heads = group - p_tile * kFastHeads < kFastHeads ? group - p_tile * kFastHeads : kFastHeads;
      const float* src[kC];
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        src[c] =
            cluster.map_shared_rank(reinterpret_cast<float*>(stages + p * kStages * G::kWarpStageBytes), c);
      }
      for (int e = tid; e < p_heads * kFastHeadDim; e += kThreads) {
        const int h = e / kFastHeadDim;
        const int d = e % kFastHeadDim;
        float ms[kC], ls[kC], os[kC];
#pragma unroll
        for (int c = 0; c < kC; ++c) {
          ms[c] = src[c][kFastHeads * kFastHeadDim + 2 * h];
          ls[c] = src[c][kFastHeads * kFastHeadDim + 2 * h + 1];
          os[c] = src[c][h * kFastHeadDim + d];
        }
        float mm = neg_inf, ll = 0.0f, acc = 0.0f;
#pragma unroll
        for (int c = 0; c < kC; ++c) {
          float wa, wb;
          fast_merge_weights(mm, ll, ms[c], ls[c], wa, wb);
          acc = acc * wa + os[c] * wb;
        }
        const std::int64_t part = (qi * a.q_heads + p_h0 + h) * partials + partial;
        a.part_acc[part * kFastHeadDim + d] = acc;
        if (d == 0) {
          a.part_ml[part * 2] = mm;
          a.part_ml[part * 2 + 1] = ll;
        }
      }
    }
    cluster.sync();  // no block's rings are read any more: they hold the combine's weights now
    for (int p = rank; p < kWarps; p += kC) {
      const std::int32_t pp = group_base + p;
      if (pp >= pairs) break;
      const std::int32_t p_kvh = pp / extra.head_tiles;
      const std::int32_t p_tile = pp % extra.head_tiles;
      const std::int32_t p_h0 = p_kvh * group + p_tile * kFastHeads;
      const int p_heads = group - p_tile * kFastHeads < kFastHeads ? group - p_tile * kFastHeads : kFastHeads;
      fast_splits_combine<kWarps, kThreads>(a, stages, p_heads, qi, p_h0, partials,
                                            a.counters + qi * pairs + pp, tid, &cluster_last);
      __syncthreads();  // the weights in the stages are read before the next pair's combine
    }
    return;
  }
  if (!warp_live) return;

  // This warp's split state goes straight from registers to the partials.
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  const float o_unit = kFp8 ? (v_exp < 0 ? 0.0f : fast_pow2(v_exp - 127)) : 1.0f;
  const std::int32_t splits = a.splits;
  if (g < heads_here) {
    const std::int64_t part = (qi * a.q_heads + h0 + g) * splits + split;
    float* acc = a.part_acc + part * kFastHeadDim;
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) {
      const int d0 = kFp8 ? 16 * (j / 2) + 4 * tig + (j % 2) : 8 * j + 2 * tig;
      const int d1 = kFp8 ? d0 + 2 : d0 + 1;
      acc[d0] = (o[j][0] + o[j][2]) * o_unit;
      acc[d1] = (o[j][1] + o[j][3]) * o_unit;
    }
    if (tig == 0) {
      a.part_ml[part * 2] = m;
      a.part_ml[part * 2 + 1] = l;
    }
  }
  __threadfence();
  __syncwarp();
  unsigned int* counter = a.counters + qi * pairs + pair;
  unsigned int done = 0;
  if (lane == 0) done = atomicAdd(counter, 1u);
  done = __shfl_sync(0xffffffffu, done, 0);
  if (done != static_cast<unsigned int>(splits - 1)) return;
  __threadfence();
  // The combine: weights per (head, split) in this warp's ring, then 4 dims per lane.
  float* sh_w = reinterpret_cast<float*>(ring);  // [8][splits]
  for (int h = 0; h < heads_here; ++h) {
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
    if (a.has_sink && top != neg_inf) total += expf(a.sink - top);
    __syncwarp();
    const float* acc = a.part_acc + qh * splits * kFastHeadDim + 4 * lane;
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 4
    for (std::int32_t s = 0; s < splits; ++s) {
      const float ws = sh_w[h * splits + s];
      const float4 v =
          __ldcg(reinterpret_cast<const float4*>(acc + static_cast<std::int64_t>(s) * kFastHeadDim));
      sum[0] += ws == 0.0f ? 0.0f : v.x * ws;
      sum[1] += ws == 0.0f ? 0.0f : v.y * ws;
      sum[2] += ws == 0.0f ? 0.0f : v.z * ws;
      sum[3] += ws == 0.0f ? 0.0f : v.w * ws;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      a.out[qh * kFastHeadDim + 4 * lane + i] = total > 0.0f ? static_cast<double>(sum[i] / total) : 0.0;
    }
  }
  if (lane == 0) *counter = 0u;
}

/// The configuration the backend runs (measured on an H200, see README):
/// the slot-major kernel where its blocks fill the device (batch decode),
/// else the warp-pipelined kernel with 8 warps (the split-K case). (The
/// slot-major kernel in clusters of 8 splits, FastSlotGeometry<..., 8>,
/// measured slower on the split-K shape: 0.59 / 0.33 of peak against 0.67 /
/// 0.34 in the same run.)
template <ElementFormat F>
struct FastAuto {
  static constexpr bool kAuto = true;
  using Slot = FastSlotGeometry<F, 8, F == ElementFormat::kFp8E4m3 ? 3 : 2, F != ElementFormat::kFp8E4m3, 1,
                                F == ElementFormat::kFp8E4m3 ? 2 : 1>;
  using Warp = FastWarpGeometry<F, 8, 2>;
};
template <ElementFormat F>
using FastDefault = FastAuto<F>;

/// Whether the fast kernel takes this launch: bf16 or fp8 rows, head_dim
/// 128, 16-byte aligned rows and slots (bulk copies), a counter buffer.
template <ElementFormat F, class Args>
inline bool ring_fast_attend_fits(const Args& a) {
  if constexpr (F != ElementFormat::kBf16 && F != ElementFormat::kFp8E4m3) {
    return false;
  } else {
    return a.counters != nullptr && a.layout.head_dim == kFastHeadDim && a.layout.row_bytes % 16 == 0 &&
           a.layout.slot_bytes % 16 == 0 && a.layout.row_elements % 16 == 0 &&
           reinterpret_cast<std::uintptr_t>(a.rows) % 16 == 0 && a.q_heads % a.layout.kv_heads == 0;
  }
}

/// Head tiles of the fast kernel (8 query heads each).
inline std::int32_t ring_fast_head_tiles(std::int32_t q_heads, std::int32_t kv_heads) {
  const std::int32_t group = q_heads / kv_heads;
  return (group + kFastHeads - 1) / kFastHeads;
}

/// Splits for the fast kernel: the fewest splits whose waves of
/// `resident` blocks (blocks per SM x SMs) cost least, each split at most
/// kFastMaxSplitColumns columns, whole tiles of `tile_rows`, at most
/// max_splits. The cost of a choice is waves x (tiles per split + 2), the 2
/// standing for a block's pipeline fill and merge.
inline std::int32_t ring_fast_splits(std::int64_t base_blocks, std::int64_t width, std::int64_t resident,
                                     std::int32_t max_splits, std::int64_t tile_rows) {
  if (width <= 0 || base_blocks <= 0) return 1;
  if (resident < 1) resident = 1;
  const std::int64_t min_splits = (width + kFastMaxSplitColumns - 1) / kFastMaxSplitColumns;
  const std::int64_t most = (width + tile_rows - 1) / tile_rows;
  std::int64_t best = -1, best_cost = 0;
  for (std::int64_t s = min_splits; s <= most && s <= max_splits; ++s) {
    const std::int64_t per = (width + s - 1) / s;
    const std::int64_t tiles = (per + tile_rows - 1) / tile_rows;
    const std::int64_t real = (width + tiles * tile_rows - 1) / (tiles * tile_rows);
    const std::int64_t waves = (base_blocks * real + resident - 1) / resident;
    const std::int64_t cost = waves * (tiles + 2);
    if (best < 0 || cost < best_cost) {
      best = real;
      best_cost = cost;
    }
  }
  return static_cast<std::int32_t>(best < 0 ? 0 : best);
}

/// The kernel of configuration G: the warp-pipelined one for FastWarpGeometry.
template <ElementFormat F, class G, class Args>
inline auto ring_fast_kernel_of() {
  if constexpr (G::kSlotMajor) {
    return ring_fast_slot_attend_kernel<F, G, Args>;
  } else if constexpr (G::kWarpPipe) {
    return ring_fast_warp_attend_kernel<F, G, Args>;
  } else {
    return ring_fast_attend_kernel<F, G, Args>;
  }
}

/// Blocks of configuration G resident per SM (occupancy query, once per
/// configuration; the shared-memory carveout is asked at its maximum so two
/// 110 KiB blocks fit). 0 when G cannot run here (the error is cleared).
template <ElementFormat F, class G, class Args>
inline int ring_fast_blocks_per_sm() {
  if constexpr (requires { G::kAuto; }) {
    const int slot = ring_fast_blocks_per_sm<F, typename G::Slot, Args>();
    const int warp = ring_fast_blocks_per_sm<F, typename G::Warp, Args>();
    return slot < warp ? slot : warp;
  } else {
    static const int blocks = [] {
      const auto kernel = ring_fast_kernel_of<F, G, Args>();
      int n = 0;
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, G::kSharedBytes) !=
              cudaSuccess ||
          cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100) != cudaSuccess ||
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, G::kThreads, G::kSharedBytes) !=
              cudaSuccess) {
        cudaGetLastError();  // a configuration that does not fit is an answer, not an error
        return 0;
      }
      return n;
    }();
    return blocks;
  }
}

/// Blocks per cluster of configuration G (1: launched without clusters).
template <class G>
constexpr int fast_cluster_of() {
  if constexpr (requires { G::kCluster; }) {
    return G::kCluster;
  } else {
    return 1;
  }
}

/// Clusters of configuration G (kCluster > 1) the device holds at once
/// (occupancy query, once per configuration; 0 when none fits: the error is
/// cleared).
template <ElementFormat F, class G, class Args>
inline int ring_fast_resident_clusters() {
  static const int clusters = [] {
    if (ring_fast_blocks_per_sm<F, G, Args>() < 1) return 0;
    cudaLaunchConfig_t config = {};
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = 1;
    attribute[0].val.clusterDim.y = G::kCluster;
    attribute[0].val.clusterDim.z = 1;
    config.gridDim = dim3(1, G::kCluster, 1);
    config.blockDim = dim3(G::kThreads, 1, 1);
    config.dynamicSmemBytes = G::kSharedBytes;
    config.attrs = attribute;
    config.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, ring_fast_kernel_of<F, G, Args>(), &config) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return clusters;
}

/// Blocks of the grid's x dimension of configuration G over `a`: (query, KV
/// head, head tile), or for the slot-major kernel (query, group of kWarps
/// (KV head, head tile) pairs).
template <class G, class Args>
inline std::int64_t ring_fast_grid_x(const Args& a) {
  const std::int64_t pairs =
      static_cast<std::int64_t>(a.layout.kv_heads) * ring_fast_head_tiles(a.q_heads, a.layout.kv_heads);
  if constexpr (G::kSlotMajor) {
    return a.n * ((pairs + G::kWarps - 1) / G::kWarps);
  } else {
    return a.n * pairs;
  }
}

/// Whether the production policy G runs the slot-major kernel on `a`: when
/// its blocks (query, group of (KV head, head tile) pairs) fill the device
/// with at most 16 splits; else (few queries: the split-K case) the
/// warp-pipelined kernel, whose blocks are one KV head each.
template <class G, class Args>
inline bool ring_fast_use_slot(const Args& a) {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    sms = 0;
  }
  return ring_fast_grid_x<typename G::Slot>(a) * 16 >= sms;
}

/// Splits configuration G runs `a` with (0: it cannot), for `sm_count` SMs.
template <ElementFormat F, class G, class Args>
inline std::int32_t ring_fast_choose_splits(const Args& a, int sm_count, std::int32_t max_splits) {
  if constexpr (requires { G::kAuto; }) {
    return ring_fast_use_slot<G>(a) ? ring_fast_choose_splits<F, typename G::Slot>(a, sm_count, max_splits)
                                    : ring_fast_choose_splits<F, typename G::Warp>(a, sm_count, max_splits);
  } else if constexpr (fast_cluster_of<G>() > 1) {
    // One wave of clusters: the most splits (a multiple of the cluster) whose
    // blocks the device holds at once, at least enough that no split passes
    // kFastMaxSplitColumns, no more than one tile per split; max_splits and
    // kMostSplits bound the partial states (one per cluster).
    (void)sm_count;
    constexpr std::int64_t kC = G::kCluster;
    const std::int64_t resident = static_cast<std::int64_t>(ring_fast_resident_clusters<F, G, Args>()) * kC;
    const std::int64_t base = ring_fast_grid_x<G>(a);
    if (resident <= 0 || base <= 0 || a.width <= 0) return 0;
    std::int64_t s = resident / base / kC * kC;
    const std::int64_t need = (a.width + kFastMaxSplitColumns - 1) / kFastMaxSplitColumns;
    const std::int64_t most = (a.width + G::kTileRows - 1) / G::kTileRows;
    if (s > most) s = most / kC * kC;
    if (s < need) s = need;
    s = (s + kC - 1) / kC * kC;
    if (s / kC > max_splits || s / kC > G::kMostSplits || s > 65535) return 0;
    return static_cast<std::int32_t>(s);
  } else {
    const int per_sm = ring_fast_blocks_per_sm<F, G, Args>();
    if (per_sm <= 0) return 0;
    if (max_splits > G::kMostSplits) max_splits = G::kMostSplits;
    return ring_fast_splits(ring_fast_grid_x<G>(a), a.width,
                            static_cast<std::int64_t>(per_sm) * (sm_count > 0 ? sm_count : 1), max_splits,
                            G::kTileRows);
  }
}

/// Launches configuration G of the fast kernel. a.splits must be one it can
/// run (ring_fast_choose_splits), part_acc/part_ml hold that many splits,
/// counters hold one zeroed word per block of the grid's x dimension.
template <ElementFormat F, class G, class Args>
cudaError_t ring_fast_attend_launch_one(const Args& a, cudaStream_t stream) {
  FastExtra extra;
  extra.head_tiles = ring_fast_head_tiles(a.q_heads, a.layout.kv_heads);
  const std::int64_t blocks = ring_fast_grid_x<G>(a);
  if (blocks <= 0) return cudaSuccess;
  constexpr int kC = fast_cluster_of<G>();
  if (blocks > 0x7fffffff || a.splits < 1 || a.splits > 65535 || a.splits % kC != 0 ||
      a.splits / kC > G::kMostSplits || (a.width + a.splits - 1) / a.splits > kFastMaxSplitColumns) {
    return cudaErrorInvalidConfiguration;
  }
  if (ring_fast_blocks_per_sm<F, G, Args>() < 1) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(a.splits));
  if constexpr (kC > 1) {
    cudaLaunchConfig_t config = {};
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = 1;
    attribute[0].val.clusterDim.y = kC;
    attribute[0].val.clusterDim.z = 1;
    config.gridDim = grid;
    config.blockDim = dim3(G::kThreads, 1, 1);
    config.dynamicSmemBytes = G::kSharedBytes;
    config.stream = stream;
    config.attrs = attribute;
    config.numAttrs = 1;
    const cudaError_t err = cudaLaunchKernelEx(&config, ring_fast_kernel_of<F, G, Args>(), a, extra);
    return err != cudaSuccess ? err : cudaGetLastError();
  } else {
    ring_fast_kernel_of<F, G, Args>()<<<grid, G::kThreads, G::kSharedBytes, stream>>>(a, extra);
    return cudaGetLastError();
  }
}

/// Launches configuration G (or, for the production policy FastAuto, the
/// configuration it picks for `a`, the one ring_fast_choose_splits chose
/// splits for).
template <ElementFormat F, class G, class Args>
cudaError_t ring_fast_attend_launch(const Args& a, cudaStream_t stream) {
  if constexpr (requires { G::kAuto; }) {
    return ring_fast_use_slot<G>(a) ? ring_fast_attend_launch_one<F, typename G::Slot>(a, stream)
                                    : ring_fast_attend_launch_one<F, typename G::Warp>(a, stream);
  } else {
    return ring_fast_attend_launch_one<F, G>(a, stream);
  }
}

}  // namespace kvcheck::impl::cuda
