// The slot-major kernel (ring_fast_slot_attend_kernel): the batch-decode path
// (see ring_fast_attend.cuh).
#pragma once

#include "impl/cuda/ring_fast_warp.cuh"

namespace kvcheck::impl::cuda {

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
  static constexpr bool kFp8 = F == ElementFormat::kFp8;
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

}  // namespace kvcheck::impl::cuda
