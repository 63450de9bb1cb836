// The warp-pipelined kernel (ring_fast_warp_attend_kernel): the split-K path
// (see ring_fast_attend.cuh).
#pragma once

#include "impl/cuda/ring_fast_block.cuh"

namespace kvcheck::impl::cuda {

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
  static constexpr bool kFp8 = F == ElementFormat::kFp8;
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

}  // namespace kvcheck::impl::cuda
