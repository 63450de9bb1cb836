// CpuBackend kernels. f64 pools attend in two passes in double (scores, then
// a weighted sum of values). f32, bf16 and fp8 pools (the production kernel)
// decode to float and run one pass over each query's index rows in blocks
// with an online softmax: each slot's key and value are read once, close
// together, and each decoded element serves all query heads of a GQA
// sub-group from registers. Tag work is a template parameter of the attention
// loop, so a pool with tracking off runs a loop with no tag code in it.
#include "impl/cpu/cpu_backend.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>

// GCC 12's AVX-512 intrinsics start some results from _mm512_undefined_*(),
// which -Wmaybe-uninitialized reports at the header's lines (a known false
// positive); the warning stays on for this file's own code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "impl/element_format.hpp"
#include "impl/kernel_checks.hpp"
#include "impl/row_codec.hpp"
#include "impl/ring_index.hpp"
#include "support/assert.hpp"

// The 8-lane vector helpers below are internal and always inlined, so the
// AVX argument-passing ABI note GCC gives for them does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace kvcheck::impl::cpu {

namespace {

/// Padding between slots whose size is a multiple of 4 KiB (see configure()).
constexpr std::int64_t kSlotPadBytes = 64;

// Largest magnitude a non-f64 row may hold after RoPE: 2^126 keeps bf16
// rounding and fp8 dequantization (448 * 2^119 at most) inside float range.
constexpr double kFloatRowLimit = 0x1.0p126;

// ---- float attention kernel ------------------------------------------------
//
// GCC/Clang vector extensions: 16 float lanes, lowered to whatever the
// function's target has (one zmm in the AVX-512 clone, two ymm in the AVX2
// clone, four xmm in the baseline).
typedef float V16f __attribute__((vector_size(64)));
typedef float V8f __attribute__((vector_size(32)));
typedef float V4f __attribute__((vector_size(16)));
typedef std::int32_t V16i __attribute__((vector_size(64)));
typedef std::uint32_t V16u __attribute__((vector_size(64)));
typedef std::uint16_t V16h __attribute__((vector_size(32)));
typedef std::uint8_t V16b __attribute__((vector_size(16)));

/// Rows per block of the online softmax: one block's scores and weights live
/// on the stack, its value accumulators in registers.
constexpr int kBlockRows = 32;
constexpr bool kPrefetch = true;

[[gnu::always_inline]] inline V16f load16f(const float* p) {
  V16f v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline void store16f(float* p, V16f v) { __builtin_memcpy(p, &v, sizeof v); }
[[gnu::always_inline]] inline V16f splat16(float x) {
  return V16f{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
}

/// Sum of 16 lanes in a fixed tree order (deterministic on one machine).
[[gnu::always_inline]] inline float hsum16(V16f v) {
  const V8f a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const V4f b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

/// exp(x) for x <= 0 in float, branch-free so it vectorizes: x = n ln2 + r,
/// |r| <= ln2/2, degree-6 polynomial for e^r (relative error ~2e-7), 2^n
/// through the exponent bits. Below -87 the result is 0 (float underflow).
[[gnu::always_inline]] inline float exp_neg_f32(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float n = static_cast<float>(static_cast<int>(x * 1.44269504f - 0.5f));
  // Cody-Waite split of ln2 keeps r exact enough.
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int e = static_cast<int>(n) + 127;
  return p * format_bits_float(static_cast<std::uint32_t>(e) << 23);
}

/// exp_neg_f32 on 16 lanes, operation for operation (same results).
[[gnu::always_inline]] inline V16f exp_neg_v16(V16f x) {
  x = x < -87.0f ? splat16(-87.0f) : x;
  const V16i ni = __builtin_convertvector(x * 1.44269504f - 0.5f, V16i);
  const V16f n = __builtin_convertvector(ni, V16f);
  V16f r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  V16f p = splat16(1.3981999507e-3f);
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const V16u bits = __builtin_convertvector(ni + 127, V16u) << 23;
  V16f scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

/// Decodes one e4m3 code to float with integer ops only: normal codes move
/// their exponent and mantissa into float position and rebias by +120;
/// subnormals (exponent 0) are m * 2^-9. Sign goes to bit 31.
[[gnu::always_inline]] inline float fp8_fast(std::uint8_t c) {
  const std::uint32_t mag = c & 0x7Fu;
  const float normal = format_bits_float((mag << 20) + (120u << 23));
  const float sub = static_cast<float>(mag) * 0.001953125f;
  const float a = mag < 8u ? sub : normal;
  return format_bits_float(format_float_bits(a) | ((static_cast<std::uint32_t>(c) & 0x80u) << 24));
}

/// Element i of a stored row of n elements in format F, as float (exact).
template <ElementFormat F>
[[gnu::always_inline]] inline float decode_one(const std::uint8_t* row, std::int64_t n, std::int64_t i) {
  if constexpr (F == ElementFormat::kF32) {
    float x;
    __builtin_memcpy(&x, row + 4 * i, sizeof x);
    return x;
  } else if constexpr (F == ElementFormat::kBf16) {
    std::uint16_t h;
    __builtin_memcpy(&h, row + 2 * i, sizeof h);
    return bf16_to_float(h);
  } else {
    return fp8_fast(row[i]) * ue8m0_to_float(row[n + i / kFp8BlockElements]);
  }
}

/// Elements [i, i + count) (count <= 16) of a stored row of n elements in
/// format F, as 16 float lanes; lanes past count are zero. Full chunks decode
/// with vector integer ops; a short chunk, or an fp8 chunk that straddles two
/// scale blocks, decodes element by element (same values).
template <ElementFormat F>
[[gnu::always_inline]] inline V16f load16(const std::uint8_t* row, std::int64_t n, std::int64_t i,
                                          std::int64_t count) {
  if constexpr (F == ElementFormat::kF32) {
    if (count == 16) {
      V16f v;
      __builtin_memcpy(&v, row + 4 * i, sizeof v);
      return v;
    }
  } else if constexpr (F == ElementFormat::kBf16) {
    if (count == 16) {
      // bf16 is the upper half of a float: widen and shift into place.
      V16h h;
      __builtin_memcpy(&h, row + 2 * i, sizeof h);
      const V16u u = __builtin_convertvector(h, V16u) << 16;
      V16f v;
      __builtin_memcpy(&v, &u, sizeof v);
      return v;
    }
  } else {
    if (count == 16 && i % kFp8BlockElements <= kFp8BlockElements - 16) {
      // As fp8_fast, 16 lanes at once, then one multiply by the block scale
      // (a power of two, so exact).
      const float s = ue8m0_to_float(row[n + i / kFp8BlockElements]);
      V16b c8;
      __builtin_memcpy(&c8, row + i, sizeof c8);
      // Widened in two steps: GCC 12 scalarizes a direct 8-to-32-bit
      // __builtin_convertvector into byte extracts, but vectorizes 8-to-16
      // and 16-to-32 (vpmovzxbw, vpmovzxwd).
      const V16u c = __builtin_convertvector(__builtin_convertvector(c8, V16h), V16u);
      const V16u mag = c & 0x7Fu;
      const V16u normal_bits = (mag << 20) + (120u << 23);
      V16f normal;
      __builtin_memcpy(&normal, &normal_bits, sizeof normal);
      V16i mag_signed;
      __builtin_memcpy(&mag_signed, &mag, sizeof mag_signed);
      const V16f sub = __builtin_convertvector(mag_signed, V16f) * 0.001953125f;
      const V16f a = mag < 8u ? sub : normal;
      V16u bits;
      __builtin_memcpy(&bits, &a, sizeof bits);
      bits |= (c & 0x80u) << 24;
      V16f v;
      __builtin_memcpy(&v, &bits, sizeof v);
      return v * s;
    }
  }
  float t[16] = {};
  for (std::int64_t k = 0; k < count; ++k) t[k] = decode_one<F>(row, n, i + k);
  return load16f(t);
}

/// Prefetches `bytes` bytes at p. Index rows need not be adjacent in the
/// pool, and the hardware stream prefetcher stops at page boundaries, so the
/// kernel asks for each slot one block ahead.
[[gnu::always_inline]] inline void prefetch_bytes(const std::uint8_t* p, std::int64_t bytes) {
  for (std::int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 2);
}

/// Everything the float attention kernel needs for one query.
struct FloatJob {
  ElementFormat format;
  const std::uint8_t* base;   // [rows, slot_stride]
  std::int64_t slot_bytes, slot_stride, value_offset, row_elements;  // stride: bytes between slots
  std::int64_t head_dim, head_stride, q_heads, group, width;
  const std::int64_t* index;  // [width]
  const float* q;             // [q_heads, head_stride], RoPE'd, pre-scaled, zero past head_dim
  float* acc;                 // [q_heads, head_stride] out: the attention output
  float* stats;               // [2, q_heads] running max, running sum
  bool has_sink;
  float sink;
};

/// Scores of kR rows (keys at rows[0..kR)) against kS query heads of KV head
/// g: kR * kS independent accumulators, each key chunk decoded once and used
/// kS times.
template <ElementFormat F, int kS, int kR>
[[gnu::always_inline]] inline void score_rows(const FloatJob& j, const std::uint8_t* const* rows,
                                              std::int64_t g, const float* q0,
                                              float (&sc)[kS][kBlockRows], int r0) {
  const std::int64_t hd = j.head_dim, hs = j.head_stride, n = j.row_elements;
  V16f a[kR][kS] = {};
  for (std::int64_t d = 0; d < hd; d += 16) {
    const std::int64_t count = hd - d < 16 ? hd - d : 16;
    V16f k[kR];
    for (int r = 0; r < kR; ++r) k[r] = load16<F>(rows[r], n, g * hd + d, count);
    for (int s = 0; s < kS; ++s) {
      const V16f qv = load16f(q0 + s * hs + d);
      for (int r = 0; r < kR; ++r) a[r][s] += qv * k[r];
    }
  }
  for (int r = 0; r < kR; ++r) {
    for (int s = 0; s < kS; ++s) sc[s][r0 + r] = hsum16(a[r][s]);
  }
}

/// acc[s] += sum_r p[s][r] * value_r over `lanes` (16 or 32) elements at
/// column d of KV head g: the kS x lanes accumulators stay in registers for
/// the whole block, each value chunk decoded once and used kS times.
template <ElementFormat F, int kS, int kChunks>
[[gnu::always_inline]] inline void mix_values(const FloatJob& j, const std::uint8_t* const* rows, int nb,
                                              std::int64_t g, std::int64_t d,
                                              const float (&p)[kS][kBlockRows], float* acc0) {
  const std::int64_t hd = j.head_dim, hs = j.head_stride, n = j.row_elements;
  V16f a[kChunks][kS];
  for (int c = 0; c < kChunks; ++c) {
    for (int s = 0; s < kS; ++s) a[c][s] = load16f(acc0 + s * hs + d + 16 * c);
  }
  std::int64_t count[kChunks];
  for (int c = 0; c < kChunks; ++c) {
    const std::int64_t left = hd - d - 16 * c;
    count[c] = left < 16 ? left : 16;
  }
  for (int r = 0; r < nb; ++r) {
    const std::uint8_t* val = rows[r] + j.value_offset;
    V16f v[kChunks];
    for (int c = 0; c < kChunks; ++c) v[c] = load16<F>(val, n, g * hd + d + 16 * c, count[c]);
    for (int s = 0; s < kS; ++s) {
      const V16f w = splat16(p[s][r]);
      for (int c = 0; c < kChunks; ++c) a[c][s] += w * v[c];
    }
  }
  for (int c = 0; c < kChunks; ++c) {
    for (int s = 0; s < kS; ++s) store16f(acc0 + s * hs + d + 16 * c, a[c][s]);
  }
}

/// One query's attention in float, one streaming pass over its index rows in
/// blocks of kBlockRows with an online softmax (flash-decoding): per block
/// and KV head, the scores of kS query heads at a time, then the running
/// max/sum update (rescaling the accumulators only when the max grows), then
/// the weighted values. Each slot's key and value are read once, close
/// together, and each decoded element is used by kS query heads.
template <ElementFormat F, int kS>
[[gnu::always_inline]] inline void attend_query_blocks(const FloatJob& j) {
  const std::int64_t hd = j.head_dim, hs = j.head_stride, qh = j.q_heads, group = j.group;
  const std::int64_t kv_heads = qh / group, width = j.width;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float* m = j.stats;
  float* l = j.stats + qh;
  // The sink is one more logit with no value row: it starts the running max
  // and contributes e^0 = 1 to the running sum.
  for (std::int64_t h = 0; h < qh; ++h) {
    m[h] = j.has_sink ? j.sink : kNegInf;
    l[h] = j.has_sink ? 1.0f : 0.0f;
  }
  for (std::int64_t x = 0; x < qh * hs; ++x) j.acc[x] = 0.0f;
  const std::uint8_t* rows[kBlockRows];
  std::int64_t c = 0;
  while (c < width) {
    int nb = 0;
    for (; c < width && nb < kBlockRows; ++c) {
      const std::int64_t e = j.index[c];
      if (e < 0) continue;  // padding: weight exactly 0, never read
      rows[nb++] = j.base + e * j.slot_stride;
      if (kPrefetch && c + kBlockRows < width && j.index[c + kBlockRows] >= 0) {
        prefetch_bytes(j.base + j.index[c + kBlockRows] * j.slot_stride, j.slot_bytes);
      }
    }
    if (nb == 0) break;
    for (std::int64_t g = 0; g < kv_heads; ++g) {
      for (std::int64_t s0 = 0; s0 < group; s0 += kS) {
        const std::int64_t h0 = g * group + s0;
        alignas(64) float sc[kS][kBlockRows];
        alignas(64) float p[kS][kBlockRows];
        int r = 0;
        for (; r + 2 <= nb; r += 2) score_rows<F, kS, 2>(j, rows + r, g, j.q + h0 * hs, sc, r);
        if (r < nb) score_rows<F, kS, 1>(j, rows + r, g, j.q + h0 * hs, sc, r);
        for (int s = 0; s < kS; ++s) {
          const std::int64_t h = h0 + s;
          for (int t = nb; t < kBlockRows; ++t) sc[s][t] = kNegInf;
          float bm = kNegInf;
          for (int t = 0; t < nb; ++t) bm = sc[s][t] > bm ? sc[s][t] : bm;
          if (bm > m[h]) {
            // The max grew: rescale what was accumulated under the old max
            // (nothing, the first time: alpha 0 on zeros).
            const float alpha = m[h] == kNegInf ? 0.0f : exp_neg_f32(m[h] - bm);
            l[h] *= alpha;
            float* a = j.acc + h * hs;
            for (std::int64_t x = 0; x < hs; x += 16) store16f(a + x, load16f(a + x) * alpha);
            m[h] = bm;
          }
          V16f sum = {};
          for (int t = 0; t < kBlockRows; t += 16) {
            const V16f sv = load16f(&sc[s][t]);
            // Rows past nb hold -inf, which exp_neg clamps to e^-87: mask.
            const V16f pv = sv == kNegInf ? V16f{} : exp_neg_v16(sv - m[h]);
            store16f(&p[s][t], pv);
            sum += pv;
          }
          l[h] += hsum16(sum);
        }
        std::int64_t d = 0;
        for (; d + 16 < hd; d += 32) mix_values<F, kS, 2>(j, rows, nb, g, d, p, j.acc + h0 * hs);
        if (d < hd) mix_values<F, kS, 1>(j, rows, nb, g, d, p, j.acc + h0 * hs);
      }
    }
  }
  for (std::int64_t h = 0; h < qh; ++h) {
    const float inv = l[h] > 0 ? 1.0f / l[h] : 0.0f;
    for (std::int64_t x = 0; x < hs; ++x) j.acc[h * hs + x] *= inv;
  }
}

template <ElementFormat F>
[[gnu::always_inline]] inline void attend_query_format(const FloatJob& j) {
  // Query heads per pass over a KV head's rows: the largest of 4, 3, 2, 1
  // that divides the GQA group.
  if (j.group % 4 == 0) {
    attend_query_blocks<F, 4>(j);
  } else if (j.group % 3 == 0) {
    attend_query_blocks<F, 3>(j);
  } else if (j.group % 2 == 0) {
    attend_query_blocks<F, 2>(j);
  } else {
    attend_query_blocks<F, 1>(j);
  }
}

/// One query's attention in float. Compiled for AVX-512, AVX2+FMA and the
/// baseline; the loader picks one at start-up (GCC function multiversioning).
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void attend_query_f32(const FloatJob& j) {
  switch (j.format) {
    case ElementFormat::kF32:
      attend_query_format<ElementFormat::kF32>(j);
      return;
    case ElementFormat::kBf16:
      attend_query_format<ElementFormat::kBf16>(j);
      return;
    case ElementFormat::kFp8E4m3:
      attend_query_format<ElementFormat::kFp8E4m3>(j);
      return;
    case ElementFormat::kF64:
      break;
  }
  KVCHECK_ASSERT(false);
}

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
constexpr int z_block_rows(ElementFormat f) { return f == ElementFormat::kF32 ? 16 : 32; }
constexpr int kZAheadBlocks = 1; // prefetch distance in blocks
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
  constexpr bool kScore4 = F == ElementFormat::kFp8E4m3;
  float* m = j.stats;
  float* l = j.stats + qh;
  for (std::int64_t h = 0; h < qh; ++h) {
    m[h] = j.has_sink ? j.sink : kNegInf;
    l[h] = j.has_sink ? 1.0f : 0.0f;
  }
  for (std::int64_t x = 0; x < qh * hs; ++x) j.acc[x] = 0.0f;
  const std::int64_t pf_lines = (j.slot_bytes + 63) / 64;
  const std::uint8_t* rows[kRows];
  // fp8 only: [row][K scales then V scales] scale exponents (byte - 7).
  alignas(64) float fexp[F == ElementFormat::kFp8E4m3 ? kRows : 1][F == ElementFormat::kFp8E4m3 ? 2 * kZMaxScales : 1];
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
    if constexpr (F == ElementFormat::kFp8E4m3) {
      const __m512i seven = _mm512_set1_epi32(7);
      for (int r = 0; r < nb4; ++r) {
        for (int half = 0; half < 2; ++half) {
          const std::uint8_t* sb = rows[r] + half * j.value_offset + n;
          float* dst = fexp[r] + half * kZMaxScales;
          for (std::int64_t k = 0; k < nscale; k += 16) {
            // Masked: a row's last scales may end less than 16 bytes before the pool does.
            const __mmask16 take = nscale - k >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (nscale - k)) - 1u);
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
        float (&pw)[kRows / 4][16] = pwb[it & 1];
        float* alpha = alphab[it & 1];
        // ---- scores: zs[k] lane 4s + i = head s, row 4k + i
        __m512 zs[kRows / 4];
        for (int r = 0; r < nb4; r += 4) {
          __m512 v[4];
          if constexpr (kScore4) {
            if (s0 == 0) {
              for (int t = r; t < r + 4; ++t) {
                if (pf_rows[t] == nullptr) continue;
                for (std::int64_t o = lo; o < mid; ++o) _mm_prefetch(reinterpret_cast<const char*>(pf_rows[t] + 64 * o), _MM_HINT_T1);
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
                z_decode32<F>(rows[r + i], el, fexp[F == ElementFormat::kFp8E4m3 ? r + i : 0] + (F == ElementFormat::kFp8E4m3 ? el / 32 : 0), x[i], y[i]);
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
                  for (std::int64_t o = lo; o < mid; ++o) _mm_prefetch(reinterpret_cast<const char*>(pf_rows[t] + 64 * o), _MM_HINT_T1);
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
                z_decode32<F>(k0, el, fexp[F == ElementFormat::kFp8E4m3 ? r + i : 0] + (F == ElementFormat::kFp8E4m3 ? el / 32 : 0), x0, y0);
                z_decode32<F>(k1, el, fexp[F == ElementFormat::kFp8E4m3 ? r + i + 1 : 0] + (F == ElementFormat::kFp8E4m3 ? el / 32 : 0), x1, y1);
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
            for (std::int64_t o = t < nb4 ? mid : lo; o < hi; ++o) _mm_prefetch(reinterpret_cast<const char*>(pf_rows[t] + 64 * o), _MM_HINT_T1);
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
        for (int k = 1; k < kRows / 4; ++k) bm = _mm512_max_ps(bm, _mm512_mask_blend_ps(live[k], ninf, zs[k]));
        bm = _mm512_max_ps(bm, _mm512_permute_ps(bm, 0xB1));
        bm = _mm512_max_ps(bm, _mm512_permute_ps(bm, 0x4E));
        const __m512i spread = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
        const __m512 mo = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(_mm_loadu_ps(m + h0)));
        const __m512 mn = _mm512_max_ps(bm, mo);
        // The max grew: what was accumulated under the old max is scaled by
        // e^(old - new) (0 the first time; exactly 1 when it did not grow).
        const __m512 al = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(mo, ninf, _CMP_NEQ_OQ),
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
        const float (&pw)[kRows / 4][16] = pwb[(it - 1) & 1];
        const float* alpha = alphab[(it - 1) & 1];
        // ---- values, 64 dims at a time
        for (int half = 0; half < kPairs / 2; ++half) {
          const std::int64_t d = 64 * half;
          __m512 acc[4][4];
          for (int s = 0; s < 4; ++s) {
            const __m512 al = _mm512_set1_ps(alpha[4 * s]);
            for (int k = 0; k < 4; ++k) acc[s][k] = _mm512_mul_ps(_mm512_loadu_ps(j.acc + (h0 + s) * hs + d + 16 * k), al);
          }
          const std::int64_t el = g * hd + d;
          for (int r = 0; r < nb; ++r) {
            const std::uint8_t* val = rows[r] + j.value_offset;
            if (s0 == 0 && half == 0 && pf_rows[r] != nullptr) {
              for (std::int64_t o = mid; o < hi; ++o) _mm_prefetch(reinterpret_cast<const char*>(pf_rows[r] + 64 * o), _MM_HINT_T1);
            }
            __m512 v[4];
            const float* fe = fexp[F == ElementFormat::kFp8E4m3 ? r : 0] + (F == ElementFormat::kFp8E4m3 ? kZMaxScales + el / 32 : 0);
            z_decode32<F>(val, el, fe, v[0], v[1]);
            z_decode32<F>(val, el + 32, fe + (F == ElementFormat::kFp8E4m3 ? 1 : 0), v[2], v[3]);
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
  for (std::int64_t h = 0; h < qh; ++h) {
    const float inv = l[h] > 0 ? 1.0f / l[h] : 0.0f;
    for (std::int64_t x = 0; x < hs; ++x) j.acc[h * hs + x] *= inv;
  }
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

/// True when the AVX-512 kernel can run this pool on this CPU.
bool fast_kernel_fits(const PoolSpec& spec, std::int64_t row_elements) {
  if (spec.format == ElementFormat::kF64) return false;
  if (spec.head_dim != 64 && spec.head_dim != 128 && spec.head_dim != 256) return false;
  if (spec.kv_heads <= 0 || spec.q_heads % spec.kv_heads != 0 || (spec.q_heads / spec.kv_heads) % 4 != 0) return false;
  if (spec.format == ElementFormat::kFp8E4m3 && row_elements / 32 > kZMaxScales) return false;
  return fast_kernel_available();
}

/// One query's attention through the AVX-512 kernel: bf16 works in
/// even-then-odd element order within each 32, so q goes in permuted and the
/// output comes back un-permuted (in place, through a 32-float buffer).
void attend_query_fast(const FloatJob& j) {
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
    case ElementFormat::kF32:
      attend_query_z_format<ElementFormat::kF32>(j);
      return;
    case ElementFormat::kBf16:
      permute(q, qn, true);
      attend_query_z_format<ElementFormat::kBf16>(j);
      permute(j.acc, qn, false);
      return;
    case ElementFormat::kFp8E4m3:
      attend_query_z_format<ElementFormat::kFp8E4m3>(j);
      return;
    case ElementFormat::kF64:
      break;
  }
  KVCHECK_ASSERT(false);
}

bool mul_overflows(std::int64_t a, std::int64_t b, std::int64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

bool CpuBackend::supports(const PoolSpec& spec, std::string* why) const {
  auto no = [&](const char* text) {
    if (why) *why = text;
    return false;
  };
  if (spec.rope_style != RopeStyle::kNone) {
    if (spec.rope_dims < 0 || spec.rope_dims % 2 != 0 || spec.rope_dims > spec.head_dim) {
      return no("rope_dims must be even and at most head_dim");
    }
    if (!(spec.rope_base > 0.0) || !std::isfinite(spec.rope_base)) return no("rope_base must be positive");
  }
  if (spec.shared_row && spec.kv_heads != 1) return no("shared rows need kv_heads == 1");
  if (!std::isfinite(spec.softmax_scale) || spec.softmax_scale < 0.0) {
    return no("softmax_scale must be finite and >= 0");
  }
  if (spec.has_sink && !std::isfinite(spec.sink_logit)) return no("sink_logit must be finite");
  return true;
}

Status CpuBackend::configure(const PoolSpec& spec) {
  std::string why;
  if (!supports(spec, &why)) return Status::fail(CacheError::kUnsupported, why);
  if (spec.states <= 0 || spec.ring_rows <= 0) return Status::fail(CacheError::kZeroRing, "zero ring");
  if (spec.q_heads <= 0 || spec.kv_heads <= 0 || spec.head_dim <= 0 || spec.window_rows <= 0 ||
      spec.max_step_rows <= 0) {
    return Status::fail(CacheError::kZeroShape, "zero shape");
  }
  const std::int64_t keys = ring_window_keys(spec.window_rows, spec.fault);
  std::int64_t slots = 0, row_elements = 0, pool_bytes = 0, q_elements = 0, width_elements = 0;
  const std::int64_t row_bytes =
      format_row_bytes(spec.format, static_cast<std::int64_t>(spec.kv_heads) * spec.head_dim);
  const std::int64_t slot_bytes = spec.shared_row ? row_bytes : 2 * row_bytes;
  // Slots whose size is a multiple of 4 KiB (f32 and bf16 rows of 1024
  // elements, f64) are spaced one cache line further apart, so the rows of a
  // block do not all start at the same page offset (measured: bf16 decode
  // over a DRAM-resident batch ~0.60 -> ~0.68 of a streaming read). The
  // padding bytes stay zero: no kernel writes or reads them.
  std::int64_t slot_stride = slot_bytes;
  if (slot_bytes > 0 && slot_bytes % 4096 == 0 && __builtin_add_overflow(slot_bytes, kSlotPadBytes, &slot_stride)) {
    return Status::fail(CacheError::kSizeOverflow, "pool size overflows");
  }
  const std::int64_t scratch_rows = keys + spec.max_step_rows;
  std::int64_t scratch_bytes = 0, staging_bytes = 0;
  if (mul_overflows(spec.states, spec.ring_rows, &slots) ||
      mul_overflows(spec.kv_heads, spec.head_dim, &row_elements) ||
      mul_overflows(slots, slot_stride, &pool_bytes) ||
      mul_overflows(scratch_rows, slot_stride, &scratch_bytes) ||
      mul_overflows(spec.max_step_rows, slot_bytes, &staging_bytes) ||
      mul_overflows(spec.q_heads, spec.head_dim, &q_elements) ||
      mul_overflows(spec.q_heads, scratch_rows, &width_elements) ||
      static_cast<std::uint64_t>(pool_bytes) > std::numeric_limits<std::size_t>::max() / 2) {
    return Status::fail(CacheError::kSizeOverflow, "pool size overflows");
  }
  try {
    PoolSpec s = spec;
    std::vector<std::uint8_t> pool(static_cast<std::size_t>(pool_bytes), 0);
    std::vector<Tag> tags(spec.track_tags ? static_cast<std::size_t>(slots) : 0);
    std::vector<std::uint8_t> scratch(static_cast<std::size_t>(scratch_bytes), 0);
    std::vector<Tag> scratch_tags(static_cast<std::size_t>(scratch_rows));
    std::vector<std::int64_t> scratch_origin(static_cast<std::size_t>(scratch_rows), -1);
    std::vector<std::uint8_t> staging(static_cast<std::size_t>(staging_bytes), 0);
    std::vector<std::uint64_t> stamp(static_cast<std::size_t>(slots), 0);
    pool_ = std::move(pool);
    tags_ = std::move(tags);
    scratch_ = std::move(scratch);
    scratch_tags_ = std::move(scratch_tags);
    scratch_origin_ = std::move(scratch_origin);
    staging_ = std::move(staging);
    stamp_ = std::move(stamp);
    rotated_.assign(static_cast<std::size_t>(row_elements), 0.0);
    decoded_.assign(static_cast<std::size_t>(row_elements), 0.0);
    q_rot_.assign(static_cast<std::size_t>(q_elements), 0.0);
    acc_.assign(static_cast<std::size_t>(q_elements), 0.0);
    if (spec.format == ElementFormat::kF64) {
      scores_.assign(static_cast<std::size_t>(width_elements), 0.0);
      q_f32_.clear();
      acc_f32_.clear();
      softmax_f32_.clear();
    } else {
      // Float kernel rows are padded to whole 16-lane chunks (zeros past head_dim).
      const std::int64_t stride = (std::int64_t{spec.head_dim} + 15) / 16 * 16;
      q_f32_.assign(static_cast<std::size_t>(spec.q_heads * stride), 0.0f);
      acc_f32_.assign(static_cast<std::size_t>(spec.q_heads * stride), 0.0f);
      softmax_f32_.assign(static_cast<std::size_t>(2 * spec.q_heads), 0.0f);
      scores_.clear();
    }
    inv_freq_.clear();
    if (spec.rope_style != RopeStyle::kNone && spec.rope_dims > 0) {
      for (std::int32_t i = 0; i < spec.rope_dims / 2; ++i) {
        inv_freq_.push_back(std::pow(spec.rope_base, -2.0 * i / spec.rope_dims));
      }
    }
    spec_ = s;
  } catch (const std::bad_alloc&) {
    return Status::fail(CacheError::kAllocation, "pool allocation failed");
  }
  slots_ = slots;
  row_elements_ = row_elements;
  row_bytes_ = row_bytes;
  slot_bytes_ = slot_bytes;
  slot_stride_ = slot_stride;
  scratch_rows_ = scratch_rows;
  epoch_ = 0;
  scale_f64_ = spec.softmax_scale > 0.0 ? spec.softmax_scale : 1.0 / std::sqrt(double(spec.head_dim));
  scale_ = static_cast<float>(scale_f64_);
  fast_kernel_ = fast_kernel_fits(spec, row_elements);
  configured_ = true;
  return {};
}

Status CpuBackend::check_configured() const {
  if (!configured_) return Status::fail(CacheError::kUnsupported, "backend not configured");
  return {};
}

KernelBounds CpuBackend::bounds() const {
  return KernelBounds{spec_.states, slots_, scratch_rows_, spec_.max_step_rows, scratch_rows_,
                      static_cast<std::int64_t>(spec_.q_heads) * spec_.head_dim, spec_.track_tags};
}

void CpuBackend::rotate(double* head, std::int64_t position) const {
  if (inv_freq_.empty()) return;
  const std::int32_t half = spec_.rope_dims / 2;
  const bool neox = spec_.rope_style == RopeStyle::kNeox;
  for (std::int32_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(position) * inv_freq_[static_cast<std::size_t>(i)];
    const double c = std::cos(angle), s = std::sin(angle);
    const std::int32_t a = neox ? i : 2 * i;
    const std::int32_t b = neox ? i + half : 2 * i + 1;
    const double x = head[a], y = head[b];
    head[a] = x * c - y * s;
    head[b] = x * s + y * c;
  }
}

Status CpuBackend::metadata(std::span<const QueryRef> queries, std::span<ReadMeta> out) {
  if (auto st = check_configured(); !st.ok()) return st;
  if (auto st = check_metadata(bounds(), queries, out); !st.ok()) return st;
  for (std::size_t i = 0; i < queries.size(); ++i) {
    out[i] = ring_metadata(queries[i].state, queries[i].position, spec_.window_rows, spec_.ring_rows,
                           spec_.states, spec_.fault);
  }
  return {};
}

Status CpuBackend::expand_index(std::span<const ReadMeta> meta, std::int64_t width,
                                std::span<std::int64_t> index) {
  if (auto st = check_configured(); !st.ok()) return st;
  if (auto st = check_expand_index(bounds(), meta, width, index); !st.ok()) return st;
  for (std::size_t i = 0; i < meta.size(); ++i) {
    for (std::int64_t c = 0; c < width; ++c) {
      index[i * static_cast<std::size_t>(width) + static_cast<std::size_t>(c)] =
          ring_index_column(meta[i], c, spec_.ring_rows, spec_.fault);
    }
  }
  return {};
}

Status CpuBackend::stage_rows(std::int64_t rows, std::span<const std::int64_t> rope_positions,
                              const double* k, const double* v) {
  if (rows > spec_.max_step_rows) return Status::fail(CacheError::kTooManyRows, "more rows than max_step_rows");
  if (static_cast<std::int64_t>(rope_positions.size()) != rows) {
    return Status::fail(CacheError::kTooManyRows, "rope_positions size != rows");
  }
  if (rows > 0 && (k == nullptr || (!spec_.shared_row && v == nullptr))) {
    return Status::fail(CacheError::kNonFinite, "missing key or value rows");
  }
  const std::int64_t n = rows * row_elements_;
  for (std::int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(k[i]) || (!spec_.shared_row && !std::isfinite(v[i]))) {
      return Status::fail(CacheError::kNonFinite, "non-finite key or value element");
    }
  }
  for (auto p : rope_positions) {
    if (p < 0) return Status::fail(CacheError::kNegativePosition, "negative rope position");
  }
  const double limit = spec_.format == ElementFormat::kF64 ? std::numeric_limits<double>::max()
                                                           : kFloatRowLimit;
  for (std::int64_t r = 0; r < rows; ++r) {
    std::uint8_t* dst = staging_.data() + r * slot_bytes_;
    const double* src = k + r * row_elements_;
    std::copy(src, src + row_elements_, rotated_.begin());
    for (std::int32_t h = 0; h < spec_.kv_heads; ++h) {
      rotate(rotated_.data() + static_cast<std::int64_t>(h) * spec_.head_dim, rope_positions[static_cast<std::size_t>(r)]);
    }
    for (double x : rotated_) {
      if (!(std::fabs(x) <= limit)) {
        return Status::fail(CacheError::kNonFinite, "key row leaves the element format's range");
      }
    }
    encode_row(spec_.format, rotated_.data(), row_elements_, dst);
    if (!spec_.shared_row) {
      const double* vs = v + r * row_elements_;
      for (std::int64_t i = 0; i < row_elements_; ++i) {
        if (!(std::fabs(vs[i]) <= limit)) {
          return Status::fail(CacheError::kNonFinite, "value row leaves the element format's range");
        }
      }
      encode_row(spec_.format, vs, row_elements_, dst + row_bytes_);
    }
  }
  return {};
}

Status CpuBackend::store(std::span<const std::int64_t> slots,
                         std::span<const std::int64_t> rope_positions, const double* k,
                         const double* v, std::span<const Tag> tags, StoreReport* report) {
  if (auto st = check_configured(); !st.ok()) return st;
  const auto rows = static_cast<std::int64_t>(slots.size());
  if (auto st = check_store(bounds(), slots, tags); !st.ok()) return st;
  if (auto st = stage_rows(rows, rope_positions, k, v); !st.ok()) return st;
  // Commit: nothing below can fail.
  ++epoch_;
  std::int64_t duplicates = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto slot = static_cast<std::size_t>(slots[static_cast<std::size_t>(r)]);
    // stamp == 2*epoch: written once in this call; 2*epoch + 1: counted duplicate.
    if (stamp_[slot] == 2 * epoch_) {
      stamp_[slot] = 2 * epoch_ + 1;
      ++duplicates;
    } else if (stamp_[slot] != 2 * epoch_ + 1) {
      stamp_[slot] = 2 * epoch_;
    }
    std::memcpy(pool_.data() + slot * static_cast<std::size_t>(slot_stride_),
                staging_.data() + r * slot_bytes_, static_cast<std::size_t>(slot_bytes_));
    if (spec_.track_tags) tags_[slot] = tags[static_cast<std::size_t>(r)];
  }
  if (report) report->duplicate_slots = duplicates;
  return {};
}

Status CpuBackend::load(std::span<const std::int64_t> index, std::int64_t scratch_first) {
  if (auto st = check_configured(); !st.ok()) return st;
  const auto n = static_cast<std::int64_t>(index.size());
  if (auto st = check_load(bounds(), index, scratch_first); !st.ok()) return st;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t s = index[static_cast<std::size_t>(i)];
    const auto row = static_cast<std::size_t>(scratch_first + i);
    scratch_origin_[row] = s;
    if (s < 0) {
      scratch_tags_[row] = Tag{};
      continue;
    }
    std::memcpy(scratch_.data() + row * static_cast<std::size_t>(slot_stride_),
                pool_.data() + static_cast<std::size_t>(s) * static_cast<std::size_t>(slot_stride_),
                static_cast<std::size_t>(slot_bytes_));
    if (spec_.track_tags) scratch_tags_[row] = tags_[static_cast<std::size_t>(s)];
  }
  return {};
}

Status CpuBackend::scratch_store(std::int64_t scratch_first,
                                 std::span<const std::int64_t> origin_slots,
                                 std::span<const std::int64_t> rope_positions, const double* k,
                                 const double* v, std::span<const Tag> tags) {
  if (auto st = check_configured(); !st.ok()) return st;
  const auto rows = static_cast<std::int64_t>(origin_slots.size());
  if (auto st = check_scratch_store(bounds(), scratch_first, origin_slots, tags); !st.ok()) return st;
  if (auto st = stage_rows(rows, rope_positions, k, v); !st.ok()) return st;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto row = static_cast<std::size_t>(scratch_first + r);
    std::memcpy(scratch_.data() + row * static_cast<std::size_t>(slot_stride_),
                staging_.data() + r * slot_bytes_, static_cast<std::size_t>(slot_bytes_));
    scratch_origin_[row] = origin_slots[static_cast<std::size_t>(r)];
    if (spec_.track_tags) scratch_tags_[row] = tags[static_cast<std::size_t>(r)];
  }
  return {};
}

Status CpuBackend::attend(KvSource source, std::span<const std::int64_t> rope_positions,
                          const double* q, std::span<const std::int64_t> index, std::int64_t width,
                          double* out, Tag* read_tags, std::int64_t* read_slots) {
  if (auto st = check_configured(); !st.ok()) return st;
  if (auto st = check_attend(bounds(), source, rope_positions, q, index, width); !st.ok()) return st;
  const bool scratch = source == KvSource::kScratch;
  const std::uint8_t* base = scratch ? scratch_.data() : pool_.data();
  const Tag* tags = scratch ? scratch_tags_.data() : tags_.data();
  const std::int64_t* origins = scratch ? scratch_origin_.data() : nullptr;
  if (spec_.track_tags && read_tags != nullptr && read_slots != nullptr) {
    attend_rows<true>(base, tags, origins, scratch, rope_positions, q, index, width, out, read_tags,
                      read_slots);
  } else {
    attend_rows<false>(base, tags, origins, scratch, rope_positions, q, index, width, out, nullptr,
                       nullptr);
  }
  return {};
}

template <bool kTrack>
void CpuBackend::attend_rows(const std::uint8_t* base, const Tag* tags, const std::int64_t* origins,
                             bool from_scratch, std::span<const std::int64_t> rope_positions,
                             const double* q, std::span<const std::int64_t> index,
                             std::int64_t width, double* out, Tag* read_tags,
                             std::int64_t* read_slots) {
  const std::int64_t hd = spec_.head_dim;
  const std::int64_t qh = spec_.q_heads;
  const std::int64_t group = qh / spec_.kv_heads;
  const std::int64_t qe = qh * hd;
  const bool f64 = spec_.format == ElementFormat::kF64;
  const std::int64_t value_offset = spec_.shared_row ? 0 : row_bytes_;
  const std::int64_t n = static_cast<std::int64_t>(rope_positions.size());
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t* idx = index.data() + i * width;
    if constexpr (kTrack) {
      for (std::int64_t c = 0; c < width; ++c) {
        const std::int64_t e = idx[c];
        read_slots[i * width + c] = e < 0 ? -1 : (from_scratch ? origins[e] : e);
        read_tags[i * width + c] = e < 0 ? Tag{} : tags[e];
      }
    } else {
      (void)tags;
      (void)origins;
      (void)from_scratch;
    }
    // Rotate the query heads in double.
    std::copy(q + i * qe, q + (i + 1) * qe, q_rot_.begin());
    for (std::int64_t h = 0; h < qh; ++h) rotate(q_rot_.data() + h * hd, rope_positions[static_cast<std::size_t>(i)]);
    double* o = out + i * qe;
    if (f64) {
      // scores_: [q_heads, width]; -inf marks a skipped column.
      for (std::int64_t c = 0; c < width; ++c) {
        const std::int64_t e = idx[c];
        for (std::int64_t h = 0; h < qh; ++h) {
          double s = -std::numeric_limits<double>::infinity();
          if (e >= 0) {
            const auto* key = std::launder(reinterpret_cast<const double*>(base + e * slot_stride_)) + (h / group) * hd;
            const double* qv = q_rot_.data() + h * hd;
            double d = 0;
            for (std::int64_t x = 0; x < hd; ++x) d += qv[x] * key[x];
            s = d * scale_f64_;
          }
          scores_[static_cast<std::size_t>(h * width + c)] = s;
        }
      }
      std::fill(acc_.begin(), acc_.end(), 0.0);
      for (std::int64_t h = 0; h < qh; ++h) {
        double* sc = scores_.data() + h * width;
        double m = spec_.has_sink ? spec_.sink_logit : -std::numeric_limits<double>::infinity();
        for (std::int64_t c = 0; c < width; ++c) m = std::max(m, sc[c]);
        double total = spec_.has_sink ? std::exp(spec_.sink_logit - m) : 0.0;
        for (std::int64_t c = 0; c < width; ++c) {
          sc[c] = idx[c] < 0 ? 0.0 : std::exp(sc[c] - m);
          total += sc[c];
        }
        const double inv = total > 0 ? 1.0 / total : 0.0;
        for (std::int64_t c = 0; c < width; ++c) sc[c] *= inv;
      }
      for (std::int64_t c = 0; c < width; ++c) {
        const std::int64_t e = idx[c];
        if (e < 0) continue;
        const auto* val = std::launder(reinterpret_cast<const double*>(base + e * slot_stride_ + value_offset));
        for (std::int64_t h = 0; h < qh; ++h) {
          const double w = scores_[static_cast<std::size_t>(h * width + c)];
          const double* vv = val + (h / group) * hd;
          double* a = acc_.data() + h * hd;
          for (std::int64_t x = 0; x < hd; ++x) a[x] += w * vv[x];
        }
      }
      std::copy(acc_.begin(), acc_.end(), o);
      continue;
    }
    // Float path: [q_heads, hs] query and accumulators, padded with zeros.
    const std::int64_t hs = static_cast<std::int64_t>(q_f32_.size()) / qh;
    for (std::int64_t h = 0; h < qh; ++h) {
      for (std::int64_t x = 0; x < hd; ++x) {
        q_f32_[static_cast<std::size_t>(h * hs + x)] =
            static_cast<float>(q_rot_[static_cast<std::size_t>(h * hd + x)] * scale_f64_);
      }
    }
    const FloatJob job{spec_.format, base, slot_bytes_, slot_stride_, value_offset, row_elements_, hd, hs, qh, group,
                       width, idx, q_f32_.data(), acc_f32_.data(), softmax_f32_.data(),
                       spec_.has_sink, static_cast<float>(spec_.sink_logit)};
    if (fast_kernel_) {
      attend_query_fast(job);
    } else {
      attend_query_f32(job);
    }
    for (std::int64_t h = 0; h < qh; ++h) {
      for (std::int64_t x = 0; x < hd; ++x) o[h * hd + x] = acc_f32_[static_cast<std::size_t>(h * hs + x)];
    }
  }
}

Tag CpuBackend::slot_tag(std::int64_t slot) const {
  KVCHECK_ASSERT(configured_ && slot >= 0 && slot < slots_);
  if (!spec_.track_tags) return Tag{};
  return tags_[static_cast<std::size_t>(slot)];
}

Status CpuBackend::read_row(std::int64_t slot, double* key, double* value) const {
  if (auto st = check_configured(); !st.ok()) return st;
  if (slot < 0 || slot >= slots_) return Status::fail(CacheError::kStateOutOfRange, "read_row: slot outside the pool");
  const std::uint8_t* row = pool_.data() + slot * slot_stride_;
  decode_row(spec_.format, row, row_elements_, key);
  decode_row(spec_.format, row + (spec_.shared_row ? 0 : row_bytes_), row_elements_, value);
  return {};
}

Status CpuBackend::read_row_bytes(std::int64_t slot, std::uint8_t* key, std::uint8_t* value) const {
  if (auto st = check_configured(); !st.ok()) return st;
  if (slot < 0 || slot >= slots_) return Status::fail(CacheError::kStateOutOfRange, "read_row_bytes: slot outside the pool");
  const std::uint8_t* row = pool_.data() + slot * slot_stride_;
  std::memcpy(key, row, static_cast<std::size_t>(row_bytes_));
  std::memcpy(value, row + (spec_.shared_row ? 0 : row_bytes_), static_cast<std::size_t>(row_bytes_));
  return {};
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
