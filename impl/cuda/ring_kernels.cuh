// CUDA kernels of the sliding-window pool (impl/kv_cache.hpp): RoPE +
// quantize + store with same-launch write-write collision detection, window
// gather into scratch, and split-width decode/verify attention with an online
// softmax for MHA, GQA, MQA and the shared-row layout. They take slot lists
// and index rows (-1 padded) made from a slot map (impl/slot_map.hpp) and
// compute no address, so a ring and a block table run the same kernels.
//
// Element math comes from impl/element_format.hpp, KVCHECK_HOST_DEVICE, so
// the kernels call the very functions the CPU backend and its tests run. The slot layout is the
// CPU backend's: [slots, slot_bytes], a slot being a key row followed by a
// value row (or one shared row), each row in impl/element_format.hpp's layout
// for kv_heads * head_dim elements.
//
// Every kernel bounds-checks its indices and skips what is out of range; the
// host launchers (impl/cuda/cuda_backend.cu) validate inputs before launching,
// so a skip here is a second line of defence, never the contract.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "impl/cuda/ring_fast_attend.cuh"
#include "impl/element_format.hpp"
#include "impl/kv_cache.hpp"

namespace kvcheck::impl::cuda {

/// Threads per block of the elementwise kernels.
inline constexpr int kElementwiseThreads = 256;
/// Threads (4 warps) per block of the attention split kernel.
inline constexpr int kAttendThreads = 128;
// kAttendHeadTile (query heads of one KV head one general-kernel block
// takes, so their shared key/value rows are read once): impl/cuda/attend_dispatch.hpp.

/// Byte geometry of one pool or scratch slot (same as the CPU backend's).
struct SlotLayout {
  std::int32_t kv_heads = 1;
  std::int32_t head_dim = 1;
  std::int64_t row_elements = 1;  ///< kv_heads * head_dim
  std::int64_t row_bytes = 0;     ///< bytes of one key (or value) row
  std::int64_t slot_bytes = 0;    ///< row_bytes (shared row) or 2 * row_bytes
  bool shared_row = false;
};

/// RoPE of one pool: style, rotary width (the first rope_dims of each head)
/// and base. Kernels rotate at the positions they are given; the
/// resident-length fault is applied by RingPool through ring_rope_position
/// (impl/ring_index.hpp) before any backend sees a position, as for the CPU.
struct RopeParams {
  RopeStyle style = RopeStyle::kNone;
  std::int32_t rope_dims = 0;
  double base = 10000.0;
};

// Bytes of one stored row: format_row_bytes (support/formats.hpp), on the host.

/// Accumulation type: double for f64 rows, float for everything else.
template <ElementFormat F>
struct RingAcc {
  using type = float;
};
template <>
struct RingAcc<ElementFormat::kF64> {
  using type = double;
};
template <ElementFormat F>
using RingAccT = typename RingAcc<F>::type;

/// Stored element type of a format (fp8: the e4m3 code).
template <ElementFormat F>
struct RingStore;
template <>
struct RingStore<ElementFormat::kF64> {
  using type = double;
};
template <>
struct RingStore<ElementFormat::kF32> {
  using type = float;
};
template <>
struct RingStore<ElementFormat::kBf16> {
  using type = std::uint16_t;
};
template <>
struct RingStore<ElementFormat::kFp8> {
  using type = std::uint8_t;
};
template <ElementFormat F>
using RingStoreT = typename RingStore<F>::type;

/// p[i] = value for i < n.
template <class T>
__global__ void ring_fill_kernel(T* p, std::int64_t n, T value) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    p[i] = value;
  }
}

// ---- RoPE ------------------------------------------------------------------------

/// Element d of one head row rotated at `position` (model/attention.hpp's
/// rope_rotate, element by element). Products and sums are rounded one by
/// one (__dmul_rn/__dsub_rn/__dadd_rn) so nvcc does not fuse them into FMAs
/// the CPU build does not use; only cos/sin/pow may differ by an ulp.
__device__ inline double ring_rope_element(const double* head, std::int32_t d, std::int64_t position,
                                           const RopeParams& rope) {
  if (rope.style == RopeStyle::kNone || rope.rope_dims <= 0 || d >= rope.rope_dims) return head[d];
  const std::int32_t half = rope.rope_dims / 2;
  std::int32_t i, a, b;
  bool first;
  if (rope.style == RopeStyle::kNeox) {
    i = d < half ? d : d - half;
    a = i;
    b = i + half;
    first = d < half;
  } else {
    i = d / 2;
    a = 2 * i;
    b = 2 * i + 1;
    first = (d & 1) == 0;
  }
  const double theta = pow(rope.base, static_cast<double>(-2 * i) / static_cast<double>(rope.rope_dims));
  const double angle = __dmul_rn(static_cast<double>(position), theta);
  double s, c;
  sincos(angle, &s, &c);
  const double x = head[a];
  const double y = head[b];
  return first ? __dsub_rn(__dmul_rn(x, c), __dmul_rn(y, s)) : __dadd_rn(__dmul_rn(x, s), __dmul_rn(y, c));
}

/// out[r, h, d] = rotated in[r, h, d] at positions[r] times `multiplier`:
/// [rows, heads, head_dim]. With rotate == false it is a plain copy (values
/// are not rotated). An element whose magnitude after rotation exceeds
/// `limit` (the format's range, as the CPU backend checks it) sets
/// *out_of_range, so the launcher can refuse before anything is written.
template <class Out>
__global__ void ring_rotate_rows_kernel(const double* in, std::int64_t rows, std::int32_t heads,
                                        std::int32_t head_dim, const std::int64_t* positions, RopeParams rope,
                                        bool rotate, double multiplier, double limit,
                                        unsigned int* out_of_range, Out* out) {
  const std::int64_t total = rows * heads * head_dim;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = i / (static_cast<std::int64_t>(heads) * head_dim);
    const std::int32_t d = static_cast<std::int32_t>(i % head_dim);
    const double* head = in + (i - d);
    const double x = rotate ? ring_rope_element(head, d, positions[row], rope) : head[d];
    if (out_of_range && !(fabs(x) <= limit)) atomicOr(out_of_range, 1u);
    out[i] = static_cast<Out>(multiplier == 1.0 ? x : __dmul_rn(x, multiplier));
  }
}

// ---- store ---------------------------------------------------------------------

/// One thread per stored row: counts writes per slot, counts every slot that
/// gets a second write once (duplicates), and elects the last row (highest
/// index, as a sequential store would leave it) as the slot's only writer.
/// counts/winner are [pool_slots], all 0 / -1 between launches.
__global__ void ring_claim_slots_kernel(const std::int64_t* slots, std::int64_t n, std::int64_t pool_slots,
                                        unsigned int* counts, int* winner, unsigned long long* duplicates) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t slot = slots[i];
    if (slot < 0 || slot >= pool_slots) continue;
    if (atomicAdd(&counts[slot], 1u) == 1u) atomicAdd(duplicates, 1ull);
    atomicMax(&winner[slot], static_cast<int>(i));
  }
}

/// Puts counts/winner of the slots a store touched back to 0 / -1.
__global__ void ring_release_slots_kernel(const std::int64_t* slots, std::int64_t n, std::int64_t pool_slots,
                                          unsigned int* counts, int* winner) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t slot = slots[i];
    if (slot < 0 || slot >= pool_slots) continue;
    counts[slot] = 0u;
    winner[slot] = -1;
  }
}

/// Destination row of stored row r: dest_rows[r] when given, else dest_first + r.
/// With a winner table, rows that lost a same-launch collision return -1.
__device__ inline std::int64_t ring_dest_row(std::int64_t r, const std::int64_t* dest_rows,
                                             std::int64_t dest_first, std::int64_t dest_count,
                                             const int* winner) {
  const std::int64_t row = dest_rows ? dest_rows[r] : dest_first + r;
  if (row < 0 || row >= dest_count) return -1;
  if (winner && winner[row] != static_cast<int>(r)) return -1;
  return row;
}

/// Quantizes and writes n rows: key rows from `k` (already rotated) and,
/// unless shared, value rows from `v`, both [n, row_elements] doubles.
/// One thread per element (f64/f32/bf16) or per 32-element block (fp8, which
/// calls fp8_encode_row on the block so the scale rule is the CPU's).
template <ElementFormat F>
__global__ void ring_encode_rows_kernel(const double* k, const double* v, std::int64_t n, SlotLayout layout,
                                        const std::int64_t* dest_rows, std::int64_t dest_first,
                                        std::int64_t dest_count, const int* winner, std::uint8_t* base) {
  const std::int64_t e = layout.row_elements;
  const std::int64_t units = F == ElementFormat::kFp8 ? (e + kFp8BlockElements - 1) / kFp8BlockElements : e;
  const int parts = layout.shared_row ? 1 : 2;
  const std::int64_t total = n * parts * units;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t u = i % units;
    const int part = static_cast<int>((i / units) % parts);
    const std::int64_t r = i / (units * parts);
    const std::int64_t row = ring_dest_row(r, dest_rows, dest_first, dest_count, winner);
    if (row < 0) continue;
    const double* src = (part == 0 ? k : v) + r * e;
    std::uint8_t* dst = base + row * layout.slot_bytes + part * layout.row_bytes;
    if constexpr (F == ElementFormat::kFp8) {
      const std::int64_t b0 = u * kFp8BlockElements;
      const std::int64_t len = b0 + kFp8BlockElements < e ? kFp8BlockElements : e - b0;
      std::uint8_t block[kFp8BlockElements + 1];  // len codes, then the block's scale
      fp8_encode_row(src + b0, len, block);
      for (std::int64_t j = 0; j < len; ++j) dst[b0 + j] = block[j];
      dst[e + u] = block[len];
    } else if constexpr (F == ElementFormat::kBf16) {
      reinterpret_cast<std::uint16_t*>(dst)[u] = bf16_from_double(src[u]);
    } else if constexpr (F == ElementFormat::kF32) {
      reinterpret_cast<float*>(dst)[u] = static_cast<float>(src[u]);
    } else {
      reinterpret_cast<double*>(dst)[u] = src[u];
    }
  }
}

/// Writes the tag (and, for scratch, the origin slot) of each stored row.
__global__ void ring_write_row_meta_kernel(std::int64_t n, const std::int64_t* dest_rows,
                                           std::int64_t dest_first, std::int64_t dest_count,
                                           const int* winner, const Tag* tags_in, Tag* tags_out,
                                           const std::int64_t* origins_in, std::int64_t* origins_out) {
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < n;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = ring_dest_row(r, dest_rows, dest_first, dest_count, winner);
    if (row < 0) continue;
    if (tags_in && tags_out) tags_out[row] = tags_in[r];
    if (origins_in && origins_out) origins_out[row] = origins_in[r];
  }
}

// ---- load (gather) ---------------------------------------------------------------

/// Copies pool slots index[i] into scratch rows scratch_first + i (raw bytes,
/// so no re-quantization), with their tags and origin slots; a -1 entry
/// copies no data and leaves origin -1 and an empty tag (as the CPU does). One block per entry (grid-stride), threads over 4-byte words
/// (slot_bytes is a multiple of 4 unless fp8 with odd sizes: then bytes).
__global__ void ring_gather_kernel(const std::int64_t* index, std::int64_t count, std::int64_t scratch_first,
                                   const std::uint8_t* pool, std::int64_t pool_slots, const Tag* pool_tags,
                                   std::uint8_t* scratch, std::int64_t scratch_slots, Tag* scratch_tags,
                                   std::int64_t* scratch_origin, std::int64_t slot_bytes) {
  for (std::int64_t i = blockIdx.x; i < count; i += gridDim.x) {
    const std::int64_t slot = index[i];
    const std::int64_t row = scratch_first + i;
    if (row < 0 || row >= scratch_slots) continue;
    if (slot < 0 || slot >= pool_slots) {  // skipped column: no data, origin -1, empty tag
      if (threadIdx.x == 0) {
        if (scratch_tags) scratch_tags[row] = Tag{};
        if (scratch_origin) scratch_origin[row] = -1;
      }
      continue;
    }
    const std::uint8_t* src = pool + slot * slot_bytes;
    std::uint8_t* dst = scratch + row * slot_bytes;
    if (slot_bytes % 4 == 0) {
      const std::int64_t words = slot_bytes / 4;
      for (std::int64_t w = threadIdx.x; w < words; w += blockDim.x) {
        reinterpret_cast<std::uint32_t*>(dst)[w] = reinterpret_cast<const std::uint32_t*>(src)[w];
      }
    } else {
      for (std::int64_t b = threadIdx.x; b < slot_bytes; b += blockDim.x) dst[b] = src[b];
    }
    if (threadIdx.x == 0) {
      if (pool_tags && scratch_tags) scratch_tags[row] = pool_tags[slot];
      if (scratch_origin) scratch_origin[row] = slot;
    }
  }
}

// ---- attention -------------------------------------------------------------------

/// Everything one attention launch reads and writes (device pointers).
template <class Acc>
struct AttendArgs {
  const Acc* q = nullptr;               ///< [n, q_heads, head_dim], rotated
  const std::int64_t* index = nullptr;  ///< [n, width]; -1 = skip
  const std::uint8_t* rows = nullptr;   ///< [row_count, slot_bytes] pool or scratch
  std::int64_t row_count = 0;
  std::int64_t n = 0;
  std::int64_t width = 0;
  std::int32_t q_heads = 1;
  SlotLayout layout;
  Acc scale = 1;
  bool has_sink = false;
  Acc sink = 0;
  std::int32_t splits = 1;  ///< column ranges per query, one block each
  Acc* part_acc = nullptr;  ///< [n, q_heads, splits, head_dim] unnormalized outputs
  Acc* part_ml = nullptr;   ///< [n, q_heads, splits, 2] running max and sum
  double* out = nullptr;    ///< [n, q_heads, head_dim]
  /// Zeroed words, one per (query, KV head, fast head tile), that the fast
  /// kernel (ring_fast_attend.cuh) counts finished splits in; null = the
  /// general kernel only.
  unsigned int* counters = nullptr;
};

__device__ inline float ring_exp(float x) {
  return expf(x);
}
__device__ inline double ring_exp(double x) {
  return exp(x);
}

/// -inf of the accumulation type (std::numeric_limits is host-only in nvcc).
template <class Acc>
__device__ inline Acc ring_neg_inf();
template <>
__device__ inline float ring_neg_inf<float>() {
  return format_bits_float(0xFF800000u);
}
template <>
__device__ inline double ring_neg_inf<double>() {
  return format_bits_double(0xFFF0000000000000ull);
}

/// Aligned vector of N elements of T, loaded with the widest instructions.
template <class T, int N>
struct alignas(sizeof(T) * N >= 16 ? 16 : sizeof(T) * N) RingVec {
  T v[N];
};

/// Decodes stored element j of a row whose codes start at `row` (fp8: the
/// scales follow the row_elements codes).
template <ElementFormat F, class Acc>
__device__ inline Acc ring_decode(const std::uint8_t* row, std::int64_t j, std::int64_t row_elements) {
  if constexpr (F == ElementFormat::kFp8) {
    return static_cast<Acc>(fp8_e4m3_decode(row[j]) *
                            ue8m0_to_float(row[row_elements + j / kFp8BlockElements]));
  } else if constexpr (F == ElementFormat::kBf16) {
    return static_cast<Acc>(bf16_to_float(reinterpret_cast<const std::uint16_t*>(row)[j]));
  } else {
    return static_cast<Acc>(reinterpret_cast<const RingStoreT<F>*>(row)[j]);
  }
}

/// Loads this lane's E elements [d0, d0 + E) of head `kvh` of one row.
/// vector_ok: the chunk is aligned and in range, so one wide load suffices
/// (fp8: the chunk sits inside one 32-element scale block).
template <ElementFormat F, class Acc, int E>
__device__ inline void ring_load_chunk(const std::uint8_t* row, std::int64_t row_elements,
                                       std::int32_t head_dim, std::int32_t kvh, std::int32_t d0,
                                       bool vector_ok, Acc (&out)[E]) {
  using S = RingStoreT<F>;
  const std::int64_t j0 = static_cast<std::int64_t>(kvh) * head_dim + d0;
  if (vector_ok) {
    if (d0 >= head_dim) {  // lanes past the head hold zeros (head_dim % E == 0 here)
#pragma unroll
      for (int t = 0; t < E; ++t) out[t] = Acc(0);
      return;
    }
    const RingVec<S, E> chunk = *reinterpret_cast<const RingVec<S, E>*>(row + j0 * sizeof(S));
    if constexpr (F == ElementFormat::kFp8) {
      const float scale = ue8m0_to_float(row[row_elements + j0 / kFp8BlockElements]);
#pragma unroll
      for (int t = 0; t < E; ++t) out[t] = static_cast<Acc>(fp8_e4m3_decode(chunk.v[t]) * scale);
    } else if constexpr (F == ElementFormat::kBf16) {
#pragma unroll
      for (int t = 0; t < E; ++t) out[t] = static_cast<Acc>(bf16_to_float(chunk.v[t]));
    } else {
#pragma unroll
      for (int t = 0; t < E; ++t) out[t] = static_cast<Acc>(chunk.v[t]);
    }
  } else {
#pragma unroll
    for (int t = 0; t < E; ++t) {
      out[t] = d0 + t < head_dim ? ring_decode<F, Acc>(row, j0 + t, row_elements) : Acc(0);
    }
  }
}

/// Folds state (m2, l2, acc2) into (m, l, acc). An empty state has m = -inf
/// and l = 0; it must contribute nothing, and exp(-inf - -inf) would be NaN,
/// so both sides test for it instead of trusting the exponential.
template <class Acc, int E>
__device__ inline void ring_merge_state(Acc& m, Acc& l, Acc (&acc)[E], Acc m2, Acc l2, const Acc (&acc2)[E]) {
  const Acc neg_inf = ring_neg_inf<Acc>();
  if (m2 == neg_inf) return;
  if (m == neg_inf) {
    m = m2;
    l = l2;
#pragma unroll
    for (int t = 0; t < E; ++t) acc[t] = acc2[t];
    return;
  }
  const Acc top = m > m2 ? m : m2;
  const Acc a = ring_exp(m - top);
  const Acc b = ring_exp(m2 - top);
  l = l * a + l2 * b;
#pragma unroll
  for (int t = 0; t < E; ++t) acc[t] = acc[t] * a + acc2[t] * b;
  m = top;
}

/// Split-width attention. Block (query, kv head, head tile) x split: the
/// block's kAttendHeadTile query heads share kv head `kvh`, so each key and
/// value row is read once for all of them. Inside a warp, workers of L lanes
/// each take whole rows (lane holds E = head_dim/L elements), so a score
/// needs log2(L) shuffles; each worker keeps its own online-softmax state and
/// the states are merged at the end (workers, then warps, then splits in
/// ring_attend_combine_kernel).
template <ElementFormat F, int E, int L>
__global__ void __launch_bounds__(kAttendThreads, E <= 8 ? 4 : 2)
    ring_attend_split_kernel(AttendArgs<RingAccT<F>> a, std::int32_t head_tiles, bool vector_ok) {
  using Acc = RingAccT<F>;
  constexpr int kHt = kAttendHeadTile;
  constexpr int kWarps = kAttendThreads / 32;
  constexpr int kWorkers = 32 / L;  // per warp
  const Acc neg_inf = ring_neg_inf<Acc>();

  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int worker = lane / L;
  const int sub = lane % L;
  const std::int32_t kv_heads = a.layout.kv_heads;
  const std::int32_t head_dim = a.layout.head_dim;
  const std::int32_t group = a.q_heads / kv_heads;

  std::int64_t blk = blockIdx.x;
  const std::int32_t tile = static_cast<std::int32_t>(blk % head_tiles);
  blk /= head_tiles;
  const std::int32_t kvh = static_cast<std::int32_t>(blk % kv_heads);
  const std::int64_t qi = blk / kv_heads;
  const std::int32_t split = static_cast<std::int32_t>(blockIdx.y);
  if (qi >= a.n || split >= a.splits) return;  // whole block: no barrier skipped
  const std::int32_t h0 = kvh * group + tile * kHt;
  const int heads_here = group - tile * kHt < kHt ? group - tile * kHt : kHt;
  const std::int32_t d0 = sub * E;

  Acc q[kHt][E];
#pragma unroll
  for (int j = 0; j < kHt; ++j) {
#pragma unroll
    for (int t = 0; t < E; ++t) {
      q[j][t] =
          (j < heads_here && d0 + t < head_dim) ? a.q[(qi * a.q_heads + h0 + j) * head_dim + d0 + t] : Acc(0);
    }
  }
  Acc m[kHt], l[kHt], acc[kHt][E];
#pragma unroll
  for (int j = 0; j < kHt; ++j) {
    m[j] = neg_inf;
    l[j] = 0;
#pragma unroll
    for (int t = 0; t < E; ++t) acc[j][t] = 0;
  }

  const std::int64_t chunk = (a.width + a.splits - 1) / a.splits;
  const std::int64_t c_begin = split * chunk;
  const std::int64_t c_end = c_begin + chunk < a.width ? c_begin + chunk : a.width;
  const std::int64_t* index_row = a.index + qi * a.width;
  const std::uint8_t* value_base = a.rows + (a.layout.shared_row ? 0 : a.layout.row_bytes);

  // Scores one row into every head's state; all 32 lanes call it together
  // (the shuffles need the full warp), invalid rows are masked afterwards.
  auto consume = [&](bool valid, const Acc(&k)[E], const Acc(&v)[E]) {
#pragma unroll
    for (int j = 0; j < kHt; ++j) {
      if (j >= heads_here) break;  // uniform over the block
      Acc dot = 0;
#pragma unroll
      for (int t = 0; t < E; ++t) dot += q[j][t] * k[t];
#pragma unroll
      for (int off = L / 2; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      if (valid) {
        const Acc s = dot * a.scale;
        const Acc top = m[j] > s ? m[j] : s;
        const Acc corr = m[j] == neg_inf ? Acc(0) : ring_exp(m[j] - top);
        const Acc p = ring_exp(s - top);
        l[j] = l[j] * corr + p;
#pragma unroll
        for (int t = 0; t < E; ++t) acc[j][t] = acc[j][t] * corr + p * v[t];
        m[j] = top;
      }
    }
  };
  auto fetch = [&](std::int64_t slot, Acc(&k)[E], Acc(&v)[E]) {
    const std::uint8_t* row = a.rows + slot * a.layout.slot_bytes;
    ring_load_chunk<F, Acc, E>(row, a.layout.row_elements, head_dim, kvh, d0, vector_ok, k);
    if (a.layout.shared_row) {
#pragma unroll
      for (int t = 0; t < E; ++t) v[t] = k[t];
    } else {
      ring_load_chunk<F, Acc, E>(value_base + slot * a.layout.slot_bytes, a.layout.row_elements, head_dim,
                                 kvh, d0, vector_ok, v);
    }
  };

  // Each warp takes batches of 32 columns; lane i loads column i's slot once
  // and the workers fetch their rows' slots by shuffle.
  for (std::int64_t batch = c_begin + static_cast<std::int64_t>(warp) * 32; batch < c_end;
       batch += static_cast<std::int64_t>(kWarps) * 32) {
    const std::int64_t col = batch + lane;
    long long mine = col < c_end ? static_cast<long long>(index_row[col]) : -1ll;
    if (mine >= a.row_count) mine = -1;  // defensive: out-of-range rows are skipped
    for (int r = 0; r < 32; r += 2 * kWorkers) {
      // Two rows per worker in flight: both fetches issue before either is used.
      const long long sa = __shfl_sync(0xffffffffu, mine, r + worker);
      const long long sb = __shfl_sync(0xffffffffu, mine, r + kWorkers + worker);
      if (!__any_sync(0xffffffffu, sa >= 0 || sb >= 0)) continue;
      Acc ka[E], va[E], kb[E], vb[E];
#pragma unroll
      for (int t = 0; t < E; ++t) ka[t] = va[t] = kb[t] = vb[t] = 0;
      if (sa >= 0) fetch(sa, ka, va);
      if (sb >= 0) fetch(sb, kb, vb);
      consume(sa >= 0, ka, va);
      consume(sb >= 0, kb, vb);
    }
  }

  // Merge the workers of a warp (lanes sub, sub + L, ...) by shuffles.
#pragma unroll
  for (int j = 0; j < kHt; ++j) {
#pragma unroll
    for (int off = L; off < 32; off *= 2) {
      const Acc m2 = __shfl_xor_sync(0xffffffffu, m[j], off);
      const Acc l2 = __shfl_xor_sync(0xffffffffu, l[j], off);
      Acc acc2[E];
#pragma unroll
      for (int t = 0; t < E; ++t) acc2[t] = __shfl_xor_sync(0xffffffffu, acc[j][t], off);
      ring_merge_state<Acc, E>(m[j], l[j], acc[j], m2, l2, acc2);
    }
  }

  // Merge the warps: 3 and 2 into 1 and 0, then 1 into 0 (lanes < L hold a warp's state).
  __shared__ Acc sh_acc[kWarps / 2][kHt][L * E];
  __shared__ Acc sh_ml[kWarps / 2][kHt][2];
  for (int active = kWarps / 2; active >= 1; active /= 2) {
    if (warp >= active && warp < 2 * active && lane < L) {
#pragma unroll
      for (int j = 0; j < kHt; ++j) {
        sh_ml[warp - active][j][0] = m[j];
        sh_ml[warp - active][j][1] = l[j];
#pragma unroll
        for (int t = 0; t < E; ++t) sh_acc[warp - active][j][d0 + t] = acc[j][t];
      }
    }
    __syncthreads();
    if (warp < active && lane < L) {
#pragma unroll
      for (int j = 0; j < kHt; ++j) {
        Acc acc2[E];
#pragma unroll
        for (int t = 0; t < E; ++t) acc2[t] = sh_acc[warp][j][d0 + t];
        ring_merge_state<Acc, E>(m[j], l[j], acc[j], sh_ml[warp][j][0], sh_ml[warp][j][1], acc2);
      }
    }
    __syncthreads();
  }

  if (warp == 0 && lane < L) {
    for (int j = 0; j < heads_here; ++j) {
      const std::int64_t part = (qi * a.q_heads + h0 + j) * a.splits + split;
      if (lane == 0) {
        a.part_ml[part * 2] = m[j];
        a.part_ml[part * 2 + 1] = l[j];
      }
#pragma unroll
      for (int t = 0; t < E; ++t) {
        if (d0 + t < head_dim) a.part_acc[part * head_dim + d0 + t] = acc[j][t];
      }
    }
  }
}

/// Merges the splits of each (query, head) with the sink and normalizes:
/// out = sum_s acc_s e^(m_s - M) / (sum_s l_s e^(m_s - M) + e^(sink - M)).
/// A query with no row and no sink has an empty sum; it outputs zeros
/// rather than 0/0.
template <class Acc>
__global__ void ring_attend_combine_kernel(AttendArgs<Acc> a) {
  const Acc neg_inf = ring_neg_inf<Acc>();
  const std::int32_t head_dim = a.layout.head_dim;
  for (std::int64_t qh = blockIdx.x; qh < a.n * a.q_heads; qh += gridDim.x) {
    const Acc* ml = a.part_ml + qh * a.splits * 2;
    Acc top = a.has_sink ? a.sink : neg_inf;
    for (std::int32_t s = 0; s < a.splits; ++s) top = ml[2 * s] > top ? ml[2 * s] : top;
    Acc total = 0;
    if (top != neg_inf) {
      if (a.has_sink) total += ring_exp(a.sink - top);
      for (std::int32_t s = 0; s < a.splits; ++s) {
        if (ml[2 * s] != neg_inf) total += ml[2 * s + 1] * ring_exp(ml[2 * s] - top);
      }
    }
    for (std::int32_t d = threadIdx.x; d < head_dim; d += blockDim.x) {
      Acc sum = 0;
      if (total > 0) {
        for (std::int32_t s = 0; s < a.splits; ++s) {
          if (ml[2 * s] != neg_inf) {
            sum += a.part_acc[(qh * a.splits + s) * head_dim + d] * ring_exp(ml[2 * s] - top);
          }
        }
        sum /= total;
      }
      a.out[qh * head_dim + d] = static_cast<double>(sum);
    }
  }
}

/// read_slots/read_tags [n, width] of one attention: the pool slot each
/// column's row represents and the tag it held (-1 / empty when skipped).
__global__ void ring_read_tags_kernel(const std::int64_t* index, std::int64_t total, std::int64_t row_count,
                                      const Tag* row_tags, const std::int64_t* row_origins, Tag* read_tags,
                                      std::int64_t* read_slots) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t row = index[i];
    if (row < 0 || row >= row_count) {
      read_slots[i] = -1;
      read_tags[i] = Tag{};
    } else {
      read_slots[i] = row_origins ? row_origins[row] : row;
      read_tags[i] = row_tags ? row_tags[row] : Tag{};
    }
  }
}

// ---- attention launcher (host) ------------------------------------------------

/// Shape of the split kernel chosen for a head_dim: L lanes per row worker,
/// E elements per lane (L * E >= head_dim). 0 when head_dim is too wide.
struct AttendShape {
  int lanes = 0;
  int elements = 0;
};
inline AttendShape ring_attend_shape(std::int32_t head_dim) {
  if (head_dim <= 0) return {};
  if (head_dim <= 64) return {16, 4};
  if (head_dim <= 128) return {16, 8};
  if (head_dim <= 512) return {32, 16};
  return {};
}
// kAttendMaxHeadDim, ring_attend_head_tiles and ring_attend_splits: the host
// dispatch, impl/cuda/attend_dispatch.hpp.

template <ElementFormat F, int E, int L>
cudaError_t ring_attend_launch_shape(const AttendArgs<RingAccT<F>>& a, cudaStream_t stream) {
  using S = RingStoreT<F>;
  const std::int32_t head_tiles = ring_attend_head_tiles(a.q_heads, a.layout.kv_heads);
  const std::int64_t chunk_bytes = static_cast<std::int64_t>(sizeof(S)) * E;
  const bool vector_ok = a.layout.head_dim % E == 0 && a.layout.row_bytes % chunk_bytes == 0 &&
                         a.layout.slot_bytes % chunk_bytes == 0 &&
                         reinterpret_cast<std::uintptr_t>(a.rows) % 16 == 0;
  const std::int64_t blocks = a.n * a.layout.kv_heads * head_tiles;
  if (blocks <= 0) return cudaSuccess;
  if (blocks > 0x7fffffff || a.splits > 65535) return cudaErrorInvalidConfiguration;
  ring_attend_split_kernel<F, E, L>
      <<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(a.splits)), kAttendThreads, 0, stream>>>(
          a, head_tiles, vector_ok);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const std::int64_t heads = a.n * a.q_heads;
  const unsigned combine_blocks = static_cast<unsigned>(heads < 65535 * 16 ? heads : 65535 * 16);
  ring_attend_combine_kernel<RingAccT<F>><<<combine_blocks, 128, 0, stream>>>(a);
  return cudaGetLastError();
}

/// The launch shape the host dispatch (impl/cuda/attend_dispatch.hpp) reads of `a`.
template <ElementFormat F>
AttendLaunch ring_attend_launch_of(const AttendArgs<RingAccT<F>>& a) {
  AttendLaunch l;
  l.format = F;
  l.n = a.n;
  l.width = a.width;
  l.q_heads = a.q_heads;
  l.kv_heads = a.layout.kv_heads;
  l.head_dim = a.layout.head_dim;
  l.row_elements = a.layout.row_elements;
  l.row_bytes = a.layout.row_bytes;
  l.slot_bytes = a.layout.slot_bytes;
  l.rows_aligned = reinterpret_cast<std::uintptr_t>(a.rows) % 16 == 0;
  l.counters = a.counters != nullptr;
  return l;
}

/// What the dispatch needs of the current device: `sm_count` SMs and the
/// occupancy of FastAuto's two configurations in bf16 and fp8 (queried once
/// per process; 0 for a configuration that cannot run here).
inline AttendDevice ring_attend_device(int sm_count) {
  using Bf16Args = AttendArgs<RingAccT<ElementFormat::kBf16>>;
  using Fp8Args = AttendArgs<RingAccT<ElementFormat::kFp8>>;
  AttendDevice d;
  d.sm_count = sm_count;
  d.bf16.slot_major =
      ring_fast_blocks_per_sm<ElementFormat::kBf16, FastAuto<ElementFormat::kBf16>::Slot, Bf16Args>();
  d.bf16.warp_pipelined =
      ring_fast_blocks_per_sm<ElementFormat::kBf16, FastAuto<ElementFormat::kBf16>::Warp, Bf16Args>();
  d.fp8.slot_major =
      ring_fast_blocks_per_sm<ElementFormat::kFp8, FastAuto<ElementFormat::kFp8>::Slot, Fp8Args>();
  d.fp8.warp_pipelined =
      ring_fast_blocks_per_sm<ElementFormat::kFp8, FastAuto<ElementFormat::kFp8>::Warp, Fp8Args>();
  return d;
}

/// The kernel and splits of one attention launch of format F over `a`
/// (a.splits is ignored): ring_attend_dispatch, at most max_splits.
template <ElementFormat F>
AttendDispatch ring_attend_dispatch_of(const AttendArgs<RingAccT<F>>& a, const AttendDevice& device,
                                       std::int32_t max_splits) {
  return ring_attend_dispatch(ring_attend_launch_of<F>(a), device, max_splits);
}

/// Launches the attention of a pool of format F with the kernel the
/// dispatch chose: a fast kernel (FastAuto's slot-major or warp-pipelined
/// configuration), else split + combine of the general kernel. The caller
/// has rotated q, set a.splits to the dispatch's, sized part_acc/part_ml for
/// them, and validated the index. A fast kernel asked of a launch it does not
/// fit is cudaErrorInvalidValue, never a silent fallback.
template <ElementFormat F>
cudaError_t ring_attend_launch(const AttendArgs<RingAccT<F>>& a, AttendKernel kernel, cudaStream_t stream) {
  const AttendShape shape = ring_attend_shape(a.layout.head_dim);
  if (a.q_heads % a.layout.kv_heads != 0) return cudaErrorInvalidValue;
  if (kernel != AttendKernel::kGeneral) {
    if constexpr (F == ElementFormat::kBf16 || F == ElementFormat::kFp8) {
      if (!ring_fast_attend_fits(ring_attend_launch_of<F>(a))) return cudaErrorInvalidValue;
      return kernel == AttendKernel::kSlotMajor
                 ? ring_fast_attend_launch<F, typename FastAuto<F>::Slot>(a, stream)
                 : ring_fast_attend_launch<F, typename FastAuto<F>::Warp>(a, stream);
    } else {
      return cudaErrorInvalidValue;
    }
  }
  if (shape.lanes == 16 && shape.elements == 4) return ring_attend_launch_shape<F, 4, 16>(a, stream);
  if (shape.lanes == 16 && shape.elements == 8) return ring_attend_launch_shape<F, 8, 16>(a, stream);
  if (shape.lanes == 32 && shape.elements == 16) {
    return ring_attend_launch_shape<F, 16, 32>(a, stream);
  }
  return cudaErrorInvalidValue;
}

/// Grid size of an elementwise kernel over `total` items (grid-stride loops
/// cover the rest).
inline unsigned ring_grid(std::int64_t total) {
  const std::int64_t blocks = (total + kElementwiseThreads - 1) / kElementwiseThreads;
  if (blocks < 1) return 1;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

}  // namespace kvcheck::impl::cuda
