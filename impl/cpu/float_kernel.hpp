// Internal to impl/cpu/: the float decode-attention kernels' shared job
// description and vector helpers. The portable kernel (float_attend_portable.cpp,
// compiled for AVX-512, AVX2+FMA and the baseline by function multiversioning)
// and the AVX-512 block kernel (float_attend_avx512.cpp) both run one query's
// attention over f32, bf16 or fp8 index rows with the same online softmax and
// the same exp polynomial; CpuBackend (cpu_backend.cpp) picks one per pool.
#pragma once

#include <cstdint>
#include <limits>

#include "impl/element_format.hpp"
#include "impl/kv_cache.hpp"

// The 16-lane vector helpers below are internal and always inlined, so the
// AVX argument-passing ABI note GCC gives for them does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace kvcheck::impl::cpu {

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

[[gnu::always_inline]] inline V16f load16f(const float* p) {
  V16f v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
[[gnu::always_inline]] inline void store16f(float* p, V16f v) {
  __builtin_memcpy(p, &v, sizeof v);
}
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

/// Everything the float attention kernel needs for one query.
struct FloatJob {
  ElementFormat format;
  const std::uint8_t* base;                                          // [rows, slot_stride]
  std::int64_t slot_bytes, slot_stride, value_offset, row_elements;  // stride: bytes between slots
  std::int64_t head_dim, head_stride, q_heads, group, width;
  const std::int64_t* index;  // [width]
  const float* q;             // [q_heads, head_stride], RoPE'd, pre-scaled, zero past head_dim
  float* acc;                 // [q_heads, head_stride] out: the attention output
  float* stats;               // [2, q_heads] running max, running sum
  bool has_sink;
  float sink;
};

/// The online softmax's start, shared by both kernels: the running max and
/// sum per query head ([2, q_heads] in j.stats) and zero accumulators. The
/// sink is one more logit with no value row: it starts the running max and
/// contributes e^0 = 1 to the running sum.
inline void online_softmax_start(const FloatJob& j) {
  float* m = j.stats;
  float* l = j.stats + j.q_heads;
  for (std::int64_t h = 0; h < j.q_heads; ++h) {
    m[h] = j.has_sink ? j.sink : -std::numeric_limits<float>::infinity();
    l[h] = j.has_sink ? 1.0f : 0.0f;
  }
  for (std::int64_t x = 0; x < j.q_heads * j.head_stride; ++x) j.acc[x] = 0.0f;
}

/// The online softmax's end: each head's accumulators divided by its sum.
inline void online_softmax_finish(const FloatJob& j) {
  const float* l = j.stats + j.q_heads;
  for (std::int64_t h = 0; h < j.q_heads; ++h) {
    const float inv = l[h] > 0 ? 1.0f / l[h] : 0.0f;
    for (std::int64_t x = 0; x < j.head_stride; ++x) j.acc[h * j.head_stride + x] *= inv;
  }
}

/// One query's attention in float through the portable kernel (any CPU).
void attend_query_portable(const FloatJob& j);
/// One query's attention through the AVX-512 block kernel; only when
/// fast_kernel_fits() said yes for the pool.
void attend_query_avx512(const FloatJob& j);
/// True when the AVX-512 kernel can run a pool of `spec` (rows of
/// `row_elements` elements) on this CPU.
bool fast_kernel_fits(const PoolSpec& spec, std::int64_t row_elements);

}  // namespace kvcheck::impl::cpu
