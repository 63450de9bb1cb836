// The block-tile kernel (ring_fast_attend_kernel): one block per (query, KV
// head, up to 8 query heads) x split, tiles shared by the block's warps behind
// a barrier per tile. Kept as the benchmark's reference (see ring_fast_attend.cuh).
#pragma once

#include "impl/cuda/ring_fast_common.cuh"

namespace kvcheck::impl::cuda {

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

}  // namespace kvcheck::impl::cuda
