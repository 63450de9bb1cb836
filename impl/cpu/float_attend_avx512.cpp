// The AVX-512 block decode-attention kernel (see the design notes below).
#include <cstring>

// GCC 12's AVX-512 intrinsics start some results from _mm512_undefined_*(),
// which -Wmaybe-uninitialized reports at the header's lines (a known false
// positive); the warning stays on for this file's own code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "impl/cpu/cpu_backend.hpp"
#include "impl/cpu/float_kernel.hpp"
#include "support/assert.hpp"

namespace kvcheck::impl::cpu {

namespace {

// ---- AVX-512 decode-attention kernel -----------------------------------------
//
// The hot configuration (head_dim a multiple of 64 up to 256, GQA group a
// multiple of 4, f32/bf16/fp8 rows) runs this kernel when the CPU has
// AVX-512 (checked once in configure()); everything else, and every CPU
// without AVX-512, runs the portable kernel above. Same online softmax, same
// exp polynomial; only the summation order differs (float rounding).
//
// Per block of z_block_rows() index rows and per KV head g, 4 query heads at a time:
//  * scores: two rows at a time (four for fp8), each 32-element piece of the
//    key decoded once into two zmm and used by all 4 heads, one accumulator
//    per (row, head) (a second one per pair for the odd halves cost an add
//    per pair and measured ~7% slower for bf16); the 4 heads'
//    accumulators of 4 rows are reduced together by a shuffle tree into one
//    zmm [head][row] instead of 16 separate horizontal sums;
//  * softmax: on the [head][row] vectors as they come out of the reduction
//    (no transpose, no scalar work): one max per head and block, exp on
//    whole vectors, weights stored in that layout;
//  * values: 64 dims at a time, 4 heads x 4 chunks of accumulators in
//    registers for the whole block, each value piece decoded once and
//    weighted by a broadcast per head.
// Decoding: bf16 is the upper half of a float, so one 64-byte load of 32
// elements gives the even elements by a 16-bit left shift and the odd ones by
// masking; the kernel therefore works in that order (even then odd elements
// of each 32), and the caller permutes the query and un-permutes the output.
// fp8 e4m3 codes moved to float bit position 20 (sign to bit 31) read as
// float are exactly code_value * 2^-120 (subnormal codes included), and
// vscalefps multiplies by 2^(scale - 7), i.e. the block scale times 2^120,
// with one rounding, the same value as the portable decode.

#define KVCHECK_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma")))

/// Rows per block. The block is also the prefetch distance (the next block's
/// rows are prefetched while this one is computed): 16 rows of f32 (128 KiB)
/// keep the memory busy without overrunning the L2; bf16 and fp8 are bound by
/// arithmetic, and 32 rows halve the per-block softmax and rescale work
/// (measured, DRAM-resident batch: f32 16 rows ~0.82 vs 32 rows ~0.65 of a
/// streaming read; bf16 32 rows ahead of 16 compute-only by ~15%).
constexpr int z_block_rows(ElementFormat f) {
  return f == ElementFormat::kF32 ? 16 : 32;
}
constexpr int kZAheadBlocks = 1;           // prefetch distance in blocks
constexpr std::int64_t kZMaxScales = 128;  // fp8 scale bytes of a slot the block table holds

/// 32 elements of a row starting at element i (a multiple of 32) as two zmm
/// in kernel order. fexp: the block's fp8 scale exponent (scale byte - 7).
template <ElementFormat F>
KVCHECK_AVX512_TARGET [[gnu::always_inline]] inline void z_decode32(const std::uint8_t* row, std::int64_t i,
                                                                    const float* fexp, __m512& a, __m512& b) {
  if constexpr (F == ElementFormat::kF32) {
    (void)fexp;
    a = _mm512_loadu_ps(row + 4 * i);
    b = _mm512_loadu_ps(row + 4 * i + 64);
  } else if constexpr (F == ElementFormat::kBf16) {
    (void)fexp;
    const __m512i x = _mm512_loadu_si512(row + 2 * i);
    a = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    b = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  } else {
    const __m512i m = _mm512_set1_epi32(static_cast<int>(0x87F00000u));
    const __m512 e = _mm512_set1_ps(*fexp);
    // Sign-extended codes shifted by 20: magnitude at bits 20..26, sign
    // copies at 27..31; the mask keeps the magnitude and bit 31.
    const __m512i c0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i)));
    const __m512i c1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i + 16)));
    a = _mm512_scalef_ps(_mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(c0, 20), m)), e);
    b = _mm512_scalef_ps(_mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(c1, 20), m)), e);
  }
}

/// Lanes 4s..4s+3 of the result: four partial sums of a[s] (s = 0..3).
KVCHECK_AVX512_TARGET [[gnu::always_inline]] inline __m512 z_reduce_heads(__m512 a0, __m512 a1, __m512 a2,
                                                                          __m512 a3) {
  const __m512 u01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44), _mm512_shuffle_f32x4(a0, a1, 0xEE));
  const __m512 u23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44), _mm512_shuffle_f32x4(a2, a3, 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(u01, u23, 0x88), _mm512_shuffle_f32x4(u01, u23, 0xDD));
}

/// From z_reduce_heads of rows 0..3: lane 4s + r is the full sum of head s, row r.
KVCHECK_AVX512_TARGET [[gnu::always_inline]] inline __m512 z_reduce_rows(__m512 v0, __m512 v1, __m512 v2,
                                                                         __m512 v3) {
  const __m512 w01 = _mm512_add_ps(_mm512_unpacklo_ps(v0, v1), _mm512_unpackhi_ps(v0, v1));
  const __m512 w23 = _mm512_add_ps(_mm512_unpacklo_ps(v2, v3), _mm512_unpackhi_ps(v2, v3));
  return _mm512_add_ps(_mm512_shuffle_ps(w01, w23, 0x44), _mm512_shuffle_ps(w01, w23, 0xEE));
}

template <ElementFormat F, int kPairs>
KVCHECK_AVX512_TARGET void attend_query_z(const FloatJob& j) {
  constexpr std::int64_t hd = 32 * kPairs;
  const std::int64_t hs = j.head_stride, qh = j.q_heads, group = j.group, n = j.row_elements;
  const std::int64_t kv_heads = qh / group, width = j.width, nscale = n / 32;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  constexpr int kRows = z_block_rows(F);
  // Scores four rows at a time for fp8 (measured faster there), two rows
  // otherwise; one accumulator per (row, head) either way.
  constexpr bool kScore4 = F == ElementFormat::kFp8;
  float* m = j.stats;
  float* l = j.stats + qh;
  online_softmax_start(j);
  const std::int64_t pf_lines = (j.slot_bytes + 63) / 64;
  const std::uint8_t* rows[kRows];
  // fp8 only: [row][K scales then V scales] scale exponents (byte - 7).
  alignas(
      64) float fexp[F == ElementFormat::kFp8 ? kRows : 1][F == ElementFormat::kFp8 ? 2 * kZMaxScales : 1];
  // Softmax weights and rescale factors of two items in flight (see below).
  // [item parity][row / 4][4 * head + row % 4] weights, [item parity][4 * head] rescale factors.
  alignas(64) float pwb[2][kRows / 4][16];
  alignas(64) float alphab[2][16];
  const std::int64_t items = qh / 4;
  std::int64_t c = 0;
  while (c < width) {
    int nb = 0;
    for (; c < width && nb < kRows; ++c) {
      const std::int64_t e = j.index[c];
      if (e < 0) continue;  // padding: weight exactly 0, never read
      rows[nb++] = j.base + e * j.slot_stride;
    }
    if (nb == 0) break;
    // Rows past nb repeat row 0 (finite, read from cache) with weight 0.
    const int nb4 = (nb + 3) & ~3;
    for (int r = nb; r < kRows; ++r) rows[r] = rows[0];
    if constexpr (F == ElementFormat::kFp8) {
      const __m512i seven = _mm512_set1_epi32(7);
      for (int r = 0; r < nb4; ++r) {
        for (int half = 0; half < 2; ++half) {
          const std::uint8_t* sb = rows[r] + half * j.value_offset + n;
          float* dst = fexp[r] + half * kZMaxScales;
          for (std::int64_t k = 0; k < nscale; k += 16) {
            // Masked: a row's last scales may end less than 16 bytes before the pool does.
            const __mmask16 take =
                nscale - k >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (nscale - k)) - 1u);
            const __m512i b = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(take, sb + k));
            _mm512_store_ps(dst + k, _mm512_cvtepi32_ps(_mm512_sub_epi32(b, seven)));
          }
        }
      }
    }
    const std::int64_t pf_first = c + (kZAheadBlocks - 1) * kRows;
    // Slots of a later block's rows (null: none or padding).
    const std::uint8_t* pf_rows[kRows];
    for (int r = 0; r < kRows; ++r) {
      const std::int64_t pos = pf_first + r;
      const std::int64_t e = pos < width ? j.index[pos] : -1;
      pf_rows[r] = e < 0 ? nullptr : j.base + e * j.slot_stride;
    }
    // Items of 4 query heads (KV head g = 4 it / group), software-pipelined
    // by one stage: the scores and softmax of item it are issued before the
    // values of item it - 1, so the softmax's latency chain (reduction tree,
    // max, exp, sum) overlaps independent work instead of stalling the
    // value pass that needs its weights.
    for (std::int64_t it = 0; it <= items; ++it) {
      if (it < items) {
        const std::int64_t h0 = 4 * it, g = h0 / group, s0 = h0 % group;
        // This KV head's share of the prefetch of a later block's rows.
        // Issued row by row inside the score loop below, so the prefetches
        // spread over the computation instead of queueing up in one burst.
        // Lines [lo, mid) go out from the score loop, [mid, hi) from the value
        // loop (all formats since 32-row blocks: DRAM-resident bf16 ~0.59 -> ~0.64).
        const std::int64_t lo = g * pf_lines / kv_heads, hi = (g + 1) * pf_lines / kv_heads;
        const std::int64_t mid = (lo + hi) / 2;
        const float* q0 = j.q + h0 * hs;
        float(&pw)[kRows / 4][16] = pwb[it & 1];
        float* alpha = alphab[it & 1];
        // ---- scores: zs[k] lane 4s + i = head s, row 4k + i
        __m512 zs[kRows / 4];
        for (int r = 0; r < nb4; r += 4) {
          __m512 v[4];
          if constexpr (kScore4) {
            if (s0 == 0) {
              for (int t = r; t < r + 4; ++t) {
                if (pf_rows[t] == nullptr) continue;
                for (std::int64_t o = lo; o < mid; ++o)
                  _mm_prefetch(reinterpret_cast<const char*>(pf_rows[t] + 64 * o), _MM_HINT_T1);
              }
            }
            // One accumulator per (row, head): 16 independent chains, each
            // key piece decoded once and each query piece loaded once per 4 rows.
            __m512 a[4][4];
            for (int i = 0; i < 4; ++i) {
              for (int s = 0; s < 4; ++s) a[i][s] = _mm512_setzero_ps();
            }
            for (int p = 0; p < kPairs; ++p) {
              const std::int64_t el = g * hd + 32 * p;
              __m512 x[4], y[4];
              for (int i = 0; i < 4; ++i) {
                z_decode32<F>(
                    rows[r + i], el,
                    fexp[F == ElementFormat::kFp8 ? r + i : 0] + (F == ElementFormat::kFp8 ? el / 32 : 0),
                    x[i], y[i]);
              }
              for (int s = 0; s < 4; ++s) {
                const __m512 qa = _mm512_loadu_ps(q0 + s * hs + 32 * p);
                const __m512 qb = _mm512_loadu_ps(q0 + s * hs + 32 * p + 16);
                for (int i = 0; i < 4; ++i) a[i][s] = _mm512_fmadd_ps(qa, x[i], a[i][s]);
                for (int i = 0; i < 4; ++i) a[i][s] = _mm512_fmadd_ps(qb, y[i], a[i][s]);
              }
            }
            for (int i = 0; i < 4; ++i) v[i] = z_reduce_heads(a[i][0], a[i][1], a[i][2], a[i][3]);
          } else {
            for (int i = 0; i < 4; i += 2) {
              const std::uint8_t* k0 = rows[r + i];
              const std::uint8_t* k1 = rows[r + i + 1];
              if (s0 == 0) {
                for (int t = r + i; t < r + i + 2; ++t) {
                  if (pf_rows[t] == nullptr) continue;
                  for (std::int64_t o = lo; o < mid; ++o)
                    _mm_prefetch(reinterpret_cast<const char*>(pf_rows[t] + 64 * o), _MM_HINT_T1);
                }
              }
              __m512 a0[4], a1[4];
              for (int s = 0; s < 4; ++s) {
                a0[s] = _mm512_setzero_ps();
                a1[s] = _mm512_setzero_ps();
              }
              for (int p = 0; p < kPairs; ++p) {
                const std::int64_t el = g * hd + 32 * p;
                __m512 x0, y0, x1, y1;
                z_decode32<F>(
                    k0, el,
                    fexp[F == ElementFormat::kFp8 ? r + i : 0] + (F == ElementFormat::kFp8 ? el / 32 : 0), x0,
                    y0);
                z_decode32<F>(
                    k1, el,
                    fexp[F == ElementFormat::kFp8 ? r + i + 1 : 0] + (F == ElementFormat::kFp8 ? el / 32 : 0),
                    x1, y1);
                for (int s = 0; s < 4; ++s) {
                  const __m512 qa = _mm512_loadu_ps(q0 + s * hs + 32 * p);
                  const __m512 qb = _mm512_loadu_ps(q0 + s * hs + 32 * p + 16);
                  a0[s] = _mm512_fmadd_ps(qa, x0, a0[s]);
                  a1[s] = _mm512_fmadd_ps(qa, x1, a1[s]);
                  a0[s] = _mm512_fmadd_ps(qb, y0, a0[s]);
                  a1[s] = _mm512_fmadd_ps(qb, y1, a1[s]);
                }
              }
              v[i] = z_reduce_heads(a0[0], a0[1], a0[2], a0[3]);
              v[i + 1] = z_reduce_heads(a1[0], a1[1], a1[2], a1[3]);
            }
          }
          zs[r / 4] = z_reduce_rows(v[0], v[1], v[2], v[3]);
        }
        for (int r = nb4; r < kRows; r += 4) zs[r / 4] = _mm512_setzero_ps();
        if (s0 == 0) {
          // A short block: the later block's rows the loop above did not reach.
          for (int t = nb; t < kRows; ++t) {
            if (pf_rows[t] == nullptr) continue;
            for (std::int64_t o = t < nb4 ? mid : lo; o < hi; ++o)
              _mm_prefetch(reinterpret_cast<const char*>(pf_rows[t] + 64 * o), _MM_HINT_T1);
          }
        }
        // ---- softmax update, in the [head][row] layout of zs: lanes 4s..4s+3
        // of every vector below belong to head s, so one max and one sum per
        // head are two in-group shuffle steps (swap neighbours, swap pairs),
        // which leave the same value in all four lanes of a group (float
        // max and add commute), and the exp runs on whole vectors.
        const __m512 ninf = _mm512_set1_ps(kNegInf);
        __mmask16 live[kRows / 4];
        for (int k = 0; k < kRows / 4; ++k) {
          const int rows_live = nb - 4 * k < 0 ? 0 : (nb - 4 * k > 4 ? 4 : nb - 4 * k);
          live[k] = static_cast<__mmask16>(((1u << rows_live) - 1u) * 0x1111u);
        }
        __m512 bm = _mm512_mask_blend_ps(live[0], ninf, zs[0]);
        for (int k = 1; k < kRows / 4; ++k)
          bm = _mm512_max_ps(bm, _mm512_mask_blend_ps(live[k], ninf, zs[k]));
        bm = _mm512_max_ps(bm, _mm512_permute_ps(bm, 0xB1));
        bm = _mm512_max_ps(bm, _mm512_permute_ps(bm, 0x4E));
        const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
        const __m512 mo = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_loadu_ps(m + h0)));
        const __m512 mn = _mm512_max_ps(bm, mo);
        // The max grew: what was accumulated under the old max is scaled by
        // e^(old - new) (0 the first time; exactly 1 when it did not grow).
        const __m512 al =
            _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(mo, ninf, _CMP_NEQ_OQ),
                                static_cast<__m512>(exp_neg_v16(static_cast<V16f>(_mm512_sub_ps(mo, mn)))));
        _mm512_store_ps(alpha, al);
        __m512 sum = _mm512_setzero_ps();
        for (int k = 0; k < kRows / 4; ++k) {
          const __m512 pv = _mm512_maskz_mov_ps(
              live[k], static_cast<__m512>(exp_neg_v16(static_cast<V16f>(_mm512_sub_ps(zs[k], mn)))));
          _mm512_store_ps(pw[k], pv);
          sum = _mm512_add_ps(sum, pv);
        }
        sum = _mm512_add_ps(sum, _mm512_permute_ps(sum, 0xB1));
        sum = _mm512_add_ps(sum, _mm512_permute_ps(sum, 0x4E));
        const __m512 lold = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_loadu_ps(l + h0)));
        const __m512 ln = _mm512_add_ps(_mm512_mul_ps(lold, al), sum);
        const __m512i gather4 = _mm512_set_epi32(12, 8, 4, 0, 12, 8, 4, 0, 12, 8, 4, 0, 12, 8, 4, 0);
        _mm_storeu_ps(m + h0, _mm512_castps512_ps128(_mm512_permutexvar_ps(gather4, mn)));
        _mm_storeu_ps(l + h0, _mm512_castps512_ps128(_mm512_permutexvar_ps(gather4, ln)));
      }
      if (it > 0) {
        const std::int64_t h0 = 4 * (it - 1), g = h0 / group, s0 = h0 % group;
        const std::int64_t lo = g * pf_lines / kv_heads, hi = (g + 1) * pf_lines / kv_heads;
        const std::int64_t mid = (lo + hi) / 2;
        (void)lo;
        const float(&pw)[kRows / 4][16] = pwb[(it - 1) & 1];
        const float* alpha = alphab[(it - 1) & 1];
        // ---- values, 64 dims at a time
        for (int half = 0; half < kPairs / 2; ++half) {
          const std::int64_t d = 64 * half;
          __m512 acc[4][4];
          for (int s = 0; s < 4; ++s) {
            const __m512 al = _mm512_set1_ps(alpha[4 * s]);
            for (int k = 0; k < 4; ++k)
              acc[s][k] = _mm512_mul_ps(_mm512_loadu_ps(j.acc + (h0 + s) * hs + d + 16 * k), al);
          }
          const std::int64_t el = g * hd + d;
          for (int r = 0; r < nb; ++r) {
            const std::uint8_t* val = rows[r] + j.value_offset;
            if (s0 == 0 && half == 0 && pf_rows[r] != nullptr) {
              for (std::int64_t o = mid; o < hi; ++o)
                _mm_prefetch(reinterpret_cast<const char*>(pf_rows[r] + 64 * o), _MM_HINT_T1);
            }
            __m512 v[4];
            const float* fe = fexp[F == ElementFormat::kFp8 ? r : 0] +
                              (F == ElementFormat::kFp8 ? kZMaxScales + el / 32 : 0);
            z_decode32<F>(val, el, fe, v[0], v[1]);
            z_decode32<F>(val, el + 32, fe + (F == ElementFormat::kFp8 ? 1 : 0), v[2], v[3]);
            for (int s = 0; s < 4; ++s) {
              const __m512 w = _mm512_set1_ps(pw[r / 4][4 * s + r % 4]);
              for (int k = 0; k < 4; ++k) acc[s][k] = _mm512_fmadd_ps(w, v[k], acc[s][k]);
            }
          }
          for (int s = 0; s < 4; ++s) {
            for (int k = 0; k < 4; ++k) _mm512_storeu_ps(j.acc + (h0 + s) * hs + d + 16 * k, acc[s][k]);
          }
        }
      }
    }
  }
  online_softmax_finish(j);
}

template <ElementFormat F>
KVCHECK_AVX512_TARGET void attend_query_z_format(const FloatJob& j) {
  switch (j.head_dim) {
    case 64: attend_query_z<F, 2>(j); return;
    case 128: attend_query_z<F, 4>(j); return;
    case 256: attend_query_z<F, 8>(j); return;
    default: break;
  }
  KVCHECK_ASSERT(false);
}

}  // namespace

bool fast_kernel_fits(const PoolSpec& spec, std::int64_t row_elements) {
  // The formats attend_query_avx512 decodes; any other runs the portable kernel.
  if (spec.format != ElementFormat::kF32 && spec.format != ElementFormat::kBf16 &&
      spec.format != ElementFormat::kFp8)
    return false;
  if (spec.head_dim != 64 && spec.head_dim != 128 && spec.head_dim != 256) return false;
  if (spec.kv_heads <= 0 || spec.q_heads % spec.kv_heads != 0 || (spec.q_heads / spec.kv_heads) % 4 != 0)
    return false;
  if (spec.format == ElementFormat::kFp8 && row_elements / 32 > kZMaxScales) return false;
  return fast_kernel_available();
}

/// One query's attention through the AVX-512 kernel: bf16 works in
/// even-then-odd element order within each 32, so q goes in permuted and the
/// output comes back un-permuted (in place, through a 32-float buffer).
void attend_query_avx512(const FloatJob& j) {
  const std::int64_t qn = j.q_heads * j.head_stride;
  float* q = const_cast<float*>(j.q);
  auto permute = [](float* p, std::int64_t count, bool forward) {
    float t[32];
    for (std::int64_t b = 0; b < count; b += 32) {
      for (int k = 0; k < 16; ++k) {
        if (forward) {
          t[k] = p[b + 2 * k];
          t[16 + k] = p[b + 2 * k + 1];
        } else {
          t[2 * k] = p[b + k];
          t[2 * k + 1] = p[b + 16 + k];
        }
      }
      for (int k = 0; k < 32; ++k) p[b + k] = t[k];
    }
  };
  switch (j.format) {
    case ElementFormat::kF32: attend_query_z_format<ElementFormat::kF32>(j); return;
    case ElementFormat::kBf16:
      permute(q, qn, true);
      attend_query_z_format<ElementFormat::kBf16>(j);
      permute(j.acc, qn, false);
      return;
    case ElementFormat::kFp8: attend_query_z_format<ElementFormat::kFp8>(j); return;
    default: break;  // fast_kernel_fits admits no other format
  }
  KVCHECK_ASSERT(false);
}

bool fast_kernel_available() {
  static const bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("fma");
  return cpu;
}

bool fast_kernel_runs(const PoolSpec& spec) {
  return fast_kernel_fits(spec, static_cast<std::int64_t>(spec.kv_heads) * spec.head_dim);
}

}  // namespace kvcheck::impl::cpu
