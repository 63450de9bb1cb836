// The production decode/verify attention kernel of the CUDA ring pool for
// bf16 and fp8 rows with head_dim 128: a gather over index rows at the memory
// roofline. impl/cuda/ring_kernels.cuh dispatches here when the pool fits
// (ring_fast_attend_fits) and keeps its general kernel for every other shape.
//
// Design (why each part is there):
// * One block = (query, KV head, tile of up to 8 query heads of that KV head)
//   x one split of the index columns. The block's query heads share every
//   key/value row, so each row crosses HBM once per block.
// * Rows move HBM -> shared memory with cp.async (16-byte, L1-bypassing),
//   Stages tiles of 16 rows per warp in flight per block: data in flight
//   occupies no registers. The column's slot comes from the block's copy of
//   its index range in shared memory (int32); a skipped column (-1, or a
//   slot past the pool) is a zero-filled row that is masked. (Bulk copies
//   through the Tensor Memory Accelerator, one per 256-byte row, measured
//   half as fast on an H200: the TMA's rate of small copies, not bandwidth,
//   bound them.)
// * Scores and the weighted sum run on tensor cores (mma.sync m16n8k16, f32
//   accumulate) fed by ldmatrix from XOR-swizzled rows, conflict-free for
//   both the plain and the transposed load. The 16 rows of the A operand hold, for each
//   query head g < 8, its 16-bit high part in row g and its residual
//   (x - hi(x)) in row g + 8, for the query in QK^T and for the probabilities
//   in PV. Row g and row g + 8 of the result land in the same thread, so
//   hi + lo is one add and no shuffle: the query and the probabilities keep
//   16 (bf16) or 22 (f16) significant bits while every multiply-add runs on
//   tensor cores. Stored rows are exact operands.
// * fp8 tiles are widened to f16 in shared memory once per tile by the
//   hardware e4m3x2 -> f16x2 conversion and one f16x2 multiply by
//   2^(e - R), e the block's ue8m0 scale exponent and R the largest of the
//   tile (keys and values apart): exact unless a value falls 2^24 below the
//   tile's largest scale, where it is flushed (an error below 2^-24 of the
//   tile's largest element). R returns in the score's factor (keys) and in
//   a running value exponent that rescales the accumulators like the
//   softmax maximum does (values). The query is carried as f16 hi + lo after
//   scaling it by a power of two to put its largest element in [256, 512).
// * The online softmax runs per tile of 16 rows per warp (one max, one
//   rescale per tile, not per row). Each warp keeps its own state; warps
//   merge through shared memory at the end of the split.
// * Splits are combined in the same launch: the last block of a (query, head
//   tile) to finish (a counter, threadfence pattern) merges every split's
//   partial state with the sink and writes the output, then resets the
//   counter to 0 for the next launch. No second kernel, no launch gap.
#pragma once

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
  static_assert(kFastMaxSplitColumns % kTileRows == 0, "a split holds whole tiles");
  static_assert(kStages * kStageBytes >= kWarps * kFastHeads * (kFastHeadDim + 2) * 4,
                "the stages hold the warps' states for the merge");
};

/// The configuration the backend runs: 4 warps, 3 stages (bf16) or 4 (fp8),
/// two blocks per SM on an H100/H200 (measured best on an H200; the
/// benchmark measures the others side by side).
template <ElementFormat F>
using FastDefault = FastGeometry<F, 4, F == ElementFormat::kFp8E4m3 ? 4 : 3>;

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
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_size)
                 : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(src_size)
                 : "memory");
  }
}
__device__ inline void fast_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
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
__device__ inline void fast_split_pack(float a, float b, std::uint32_t& hi_pair,
                                       std::uint32_t& lo_pair) {
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
__device__ inline void fast_widen_fp8(const uint4 codes, std::uint32_t factor, uint4& out0,
                                      uint4& out1) {
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

/// The fast kernel's argument beyond AttendArgs (whose `counters` hold a
/// zeroed word per (query, KV head, head tile), reset by the kernel after use).
struct FastExtra {
  std::int32_t head_tiles = 1;
};

/// Folds state (m2, l2) into (m, l): sets the weights of the two sides so
/// the caller folds its accumulators the same way.
__device__ inline void fast_merge_weights(float& m, float& l, float m2, float l2, float& wa,
                                          float& wb) {
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

template <ElementFormat F, class G, class Args>
__global__ void __launch_bounds__(G::kThreads, G::kWarps <= 4 ? 2 : 1)
    ring_fast_attend_kernel(Args a, FastExtra extra) {
  constexpr bool kFp8 = G::kFp8;
  constexpr int kStages = G::kStages;
  constexpr int kThreads = G::kThreads;
  constexpr int kTileRows = G::kTileRows;
  constexpr int kWarps = G::kWarps;
  constexpr int kKSteps = kFastHeadDim / 16;   // 8 k-steps of QK^T
  constexpr int kNTiles = kFastHeadDim / 8;    // 16 n-tiles of PV
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
  const int g = lane >> 2;    // mma groupID: query head g of the tile
  const int tig = lane & 3;   // mma thread-in-group

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
  const int heads_here = group - tile * kFastHeads < kFastHeads ? group - tile * kFastHeads
                                                                : kFastHeads;

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
  const std::uint8_t* value_scale_base =
      key_scale_base + (a.layout.shared_row ? 0 : a.layout.row_bytes);

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
        fast_split_pack<kFp8>(qv[ks][2 * half] * q_scale, qv[ks][2 * half + 1] * q_scale,
                              qa[ks][2 * half], qa[ks][2 * half + 1]);
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
        const uint4 codes = *reinterpret_cast<const uint4*>(
            st + which * kTileRows * G::kRawRowBytes + r * G::kRawRowBytes + c * 16);
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
  float* sh_o = reinterpret_cast<float*>(stages);                        // [warps][8][128]
  float* sh_ml = sh_o + kWarps * kFastHeads * kFastHeadDim;              // [warps][8][2]
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
  for (int e = tid; e < heads_here * kFastHeadDim; e += kThreads) {
    const int h = e / kFastHeadDim;
    const int d = e % kFastHeadDim;
    float mm = neg_inf, ll = 0.0f, acc = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      float wa, wb;
      fast_merge_weights(mm, ll, sh_ml[(w * kFastHeads + h) * 2], sh_ml[(w * kFastHeads + h) * 2 + 1],
                         wa, wb);
      acc = acc * wa + sh_o[(w * kFastHeads + h) * kFastHeadDim + d] * wb;
    }
    const std::int64_t part = (qi * a.q_heads + h0 + h) * a.splits + split;
    a.part_acc[part * kFastHeadDim + d] = acc;
    if (d == 0) {
      a.part_ml[part * 2] = mm;
      a.part_ml[part * 2 + 1] = ll;
    }
  }

  // The last split block of this (query, KV head, head tile) combines.
  __threadfence();
  __syncthreads();
  unsigned int* counter = a.counters + blockIdx.x;
  if (tid == 0) {
    const unsigned int done = atomicAdd(counter, 1u);
    last_block = done == static_cast<unsigned int>(a.splits - 1) ? 1 : 0;
  }
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  for (int e = tid; e < heads_here * kFastHeadDim; e += kThreads) {
    const int h = e / kFastHeadDim;
    const int d = e % kFastHeadDim;
    const std::int64_t qh = qi * a.q_heads + h0 + h;
    const float* ml = a.part_ml + qh * a.splits * 2;
    float top = a.has_sink ? a.sink : neg_inf;
    for (std::int32_t s = 0; s < a.splits; ++s) {
      const float ms = __ldcg(ml + 2 * s);
      top = ms > top ? ms : top;
    }
    float total = 0.0f, sum = 0.0f;
    if (top != neg_inf) {
      if (a.has_sink) total += expf(a.sink - top);
      for (std::int32_t s = 0; s < a.splits; ++s) {
        const float ms = __ldcg(ml + 2 * s);
        if (ms == neg_inf) continue;
        const float w = expf(ms - top);
        total += __ldcg(ml + 2 * s + 1) * w;
        sum += __ldcg(a.part_acc + (qh * a.splits + s) * kFastHeadDim + d) * w;
      }
    }
    a.out[qh * kFastHeadDim + d] = total > 0.0f ? static_cast<double>(sum / total) : 0.0;
  }
  if (tid == 0) *counter = 0u;
}

/// Whether the fast kernel takes this launch: bf16 or fp8 rows, head_dim
/// 128, 16-byte aligned rows and slots (bulk copies), a counter buffer.
template <ElementFormat F, class Args>
inline bool ring_fast_attend_fits(const Args& a) {
  if constexpr (F != ElementFormat::kBf16 && F != ElementFormat::kFp8E4m3) {
    return false;
  } else {
    return a.counters != nullptr && a.layout.head_dim == kFastHeadDim &&
           a.layout.row_bytes % 16 == 0 && a.layout.slot_bytes % 16 == 0 &&
           a.layout.row_elements % 16 == 0 && reinterpret_cast<std::uintptr_t>(a.rows) % 16 == 0 &&
           a.q_heads % a.layout.kv_heads == 0;
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
inline std::int32_t ring_fast_splits(std::int64_t base_blocks, std::int64_t width,
                                     std::int64_t resident, std::int32_t max_splits,
                                     std::int64_t tile_rows) {
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

/// Blocks of configuration G resident per SM (occupancy query, once per
/// configuration; the shared-memory carveout is asked at its maximum so two
/// 110 KiB blocks fit).
template <ElementFormat F, class G, class Args>
inline int ring_fast_blocks_per_sm() {
  static const int blocks = [] {
    int n = 0;
    if (cudaFuncSetAttribute(ring_fast_attend_kernel<F, G, Args>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             G::kSharedBytes) != cudaSuccess ||
        cudaFuncSetAttribute(ring_fast_attend_kernel<F, G, Args>,
                             cudaFuncAttributePreferredSharedMemoryCarveout, 100) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ring_fast_attend_kernel<F, G, Args>,
                                                      G::kThreads, G::kSharedBytes) != cudaSuccess) {
      return 0;
    }
    return n;
  }();
  return blocks;
}

/// Splits configuration G runs `a` with (0: it cannot), for `sm_count` SMs.
template <ElementFormat F, class G, class Args>
inline std::int32_t ring_fast_choose_splits(const Args& a, int sm_count, std::int32_t max_splits) {
  const int per_sm = ring_fast_blocks_per_sm<F, G, Args>();
  if (per_sm <= 0) return 0;
  return ring_fast_splits(a.n * a.layout.kv_heads * ring_fast_head_tiles(a.q_heads, a.layout.kv_heads),
                          a.width, static_cast<std::int64_t>(per_sm) * (sm_count > 0 ? sm_count : 1),
                          max_splits, G::kTileRows);
}

/// Launches configuration G of the fast kernel. a.splits must be one it can
/// run (ring_fast_choose_splits), part_acc/part_ml hold that many splits,
/// counters hold one zeroed word per block of the grid's x dimension.
template <ElementFormat F, class G, class Args>
cudaError_t ring_fast_attend_launch(const Args& a, cudaStream_t stream) {
  FastExtra extra;
  extra.head_tiles = ring_fast_head_tiles(a.q_heads, a.layout.kv_heads);
  const std::int64_t blocks = a.n * a.layout.kv_heads * extra.head_tiles;
  if (blocks <= 0) return cudaSuccess;
  if (blocks > 0x7fffffff || a.splits < 1 || a.splits > 65535 ||
      (a.width + a.splits - 1) / a.splits > kFastMaxSplitColumns) {
    return cudaErrorInvalidConfiguration;
  }
  if (ring_fast_blocks_per_sm<F, G, Args>() < 1) return cudaErrorInvalidConfiguration;
  ring_fast_attend_kernel<F, G, Args>
      <<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(a.splits)), G::kThreads,
         G::kSharedBytes, stream>>>(a, extra);
  return cudaGetLastError();
}

}  // namespace kvcheck::impl::cuda
