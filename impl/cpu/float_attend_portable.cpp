// The portable float decode-attention kernel: one pass over a query's index
// rows in blocks of kBlockRows with an online softmax; each slot's key and
// value are read once, close together, and each decoded element serves all
// query heads of a GQA sub-group from registers. Written with GCC vector
// extensions, so one source lowers to AVX-512, AVX2 or SSE.
#include <cstring>
#include <limits>

#include "impl/cpu/float_kernel.hpp"
#include "support/assert.hpp"

namespace kvcheck::impl::cpu {

namespace {

/// Rows per block of the online softmax: one block's scores and weights live
/// on the stack, its value accumulators in registers.
constexpr int kBlockRows = 32;
constexpr bool kPrefetch = true;

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

/// Scores of kR rows (keys at rows[0..kR)) against kS query heads of KV head
/// g: kR * kS independent accumulators, each key chunk decoded once and used
/// kS times.
template <ElementFormat F, int kS, int kR>
[[gnu::always_inline]] inline void score_rows(const FloatJob& j, const std::uint8_t* const* rows,
                                              std::int64_t g, const float* q0, float (&sc)[kS][kBlockRows],
                                              int r0) {
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
  online_softmax_start(j);
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
  online_softmax_finish(j);
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

}  // namespace

/// One query's attention in float. Compiled for AVX-512, AVX2+FMA and the
/// baseline; the loader picks one at start-up (GCC function multiversioning).
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void attend_query_portable(
    const FloatJob& j) {
  switch (j.format) {
    case ElementFormat::kF32: attend_query_format<ElementFormat::kF32>(j); return;
    case ElementFormat::kBf16: attend_query_format<ElementFormat::kBf16>(j); return;
    case ElementFormat::kFp8: attend_query_format<ElementFormat::kFp8>(j); return;
    case ElementFormat::kF64: break;
  }
  KVCHECK_ASSERT(false);
}

}  // namespace kvcheck::impl::cpu
