// Element formats of cached rows: bf16 with round-to-nearest-even and fp8
// e4m3 (OCP "E4M3FN": bias 7, max 448, no infinity, saturating) with one
// ue8m0 scale byte per 32 elements. Shared by the CPU backend and the CUDA
// kernels, so everything here is KVCHECK_HOST_DEVICE, header-only, and uses
// only builtin arithmetic: no <cmath>, no std::bit_cast, no memcpy. Bit casts
// go through unions (GCC, Clang and nvcc define this type punning).
//
// Row layouts (bytes of one stored row of n elements, format_row_bytes in
// support/formats.hpp):
//   f64   [n] doubles                       8n
//   f32   [n] floats                        4n
//   bf16  [n] uint16 (upper half of a float) 2n
//   fp8   [n] e4m3 codes, then [ceil(n/32)] ue8m0 scale bytes   n + ceil(n/32)
// An fp8 element i decodes as e4m3(code[i]) * 2^(scale[i/32] - 127).
#pragma once

#include <cstdint>

#include "impl/host_device.hpp"
#include "support/formats.hpp"

namespace kvcheck::impl {

/// Elements per fp8 scale block (the format table's scale_block).
inline constexpr std::int64_t kFp8BlockElements = format_scale_block(ElementFormat::kFp8);
/// Largest finite e4m3 magnitude.
inline constexpr double kFp8Max = 448.0;
/// e4m3 code of +448 (0x7F is NaN and never produced).
inline constexpr std::uint8_t kFp8MaxCode = 0x7E;

/// Bit pattern of a double.
KVCHECK_HOST_DEVICE std::uint64_t format_double_bits(double x) {
  union {
    double d;
    std::uint64_t u;
  } b;
  b.d = x;
  return b.u;
}

/// Double with bit pattern `u`.
KVCHECK_HOST_DEVICE double format_bits_double(std::uint64_t u) {
  union {
    std::uint64_t u;
    double d;
  } b;
  b.u = u;
  return b.d;
}

/// Bit pattern of a float.
KVCHECK_HOST_DEVICE std::uint32_t format_float_bits(float x) {
  union {
    float f;
    std::uint32_t u;
  } b;
  b.f = x;
  return b.u;
}

/// Float with bit pattern `u`.
KVCHECK_HOST_DEVICE float format_bits_float(std::uint32_t u) {
  union {
    std::uint32_t u;
    float f;
  } b;
  b.u = u;
  return b.f;
}

/// 2^e as a double, exact for -1022 <= e <= 1023.
KVCHECK_HOST_DEVICE double format_pow2(int e) {
  return format_bits_double(static_cast<std::uint64_t>(e + 1023) << 52);
}

/// True when x is neither NaN nor infinite.
KVCHECK_HOST_DEVICE bool format_is_finite(double x) {
  return ((format_double_bits(x) >> 52) & 0x7FF) != 0x7FF;
}

// ---- bf16 -------------------------------------------------------------------

/// float -> bf16, round to nearest even (NaN stays NaN, overflow gives inf).
KVCHECK_HOST_DEVICE std::uint16_t bf16_from_float(float x) {
  const std::uint32_t u = format_float_bits(x);
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0) {
    return static_cast<std::uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  }
  const std::uint32_t rounded = u + 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(rounded >> 16);
}

/// double -> bf16, round to nearest even, without double rounding: the value
/// is first narrowed to float with round-to-odd (truncate, then set the last
/// bit when inexact), which keeps 16 guard bits below bf16's last digit, so
/// the final round-to-nearest-even sees the exact tie cases. Finite inputs
/// beyond bf16's range become +-inf (RNE overflow).
KVCHECK_HOST_DEVICE std::uint16_t bf16_from_double(double x) {
  if (!format_is_finite(x)) return bf16_from_float(static_cast<float>(x));
  const bool negative = (format_double_bits(x) >> 63) != 0;
  const double a = negative ? -x : x;
  std::uint32_t f;
  if (a >= 3.4028234663852886e38) {  // FLT_MAX: truncation stops there
    f = 0x7F7FFFFFu;
    if (a != 3.4028234663852886e38) f |= 1u;
  } else {
    f = format_float_bits(static_cast<float>(a));
    if (static_cast<double>(format_bits_float(f)) > a) f -= 1u;   // truncate
    if (static_cast<double>(format_bits_float(f)) != a) f |= 1u;  // sticky (odd)
  }
  std::uint16_t h = bf16_from_float(format_bits_float(f));
  if (negative) h = static_cast<std::uint16_t>(h | 0x8000u);
  return h;
}

/// bf16 -> float (exact).
KVCHECK_HOST_DEVICE float bf16_to_float(std::uint16_t h) {
  return format_bits_float(static_cast<std::uint32_t>(h) << 16);
}

// ---- fp8 e4m3 with ue8m0 block scales -----------------------------------------

/// Rounds a non-negative double below 2^52 to the nearest integer, ties to even.
KVCHECK_HOST_DEVICE std::int64_t format_round_even(double t) {
  std::int64_t n = static_cast<std::int64_t>(t);   // truncation == floor for t >= 0
  const double frac = t - static_cast<double>(n);  // exact below 2^52
  if (frac > 0.5 || (frac == 0.5 && (n & 1) != 0)) ++n;
  return n;
}

/// Encodes a (scaled) finite value as e4m3, round to nearest even, saturating
/// at +-448 (values at or beyond 448 give 0x7E).
KVCHECK_HOST_DEVICE std::uint8_t fp8_e4m3_encode(double x) {
  const bool negative = (format_double_bits(x) >> 63) != 0;
  const double a = negative ? -x : x;
  std::uint8_t code;
  if (!(a < kFp8Max)) {  // also catches NaN: saturate (rows are validated finite)
    code = kFp8MaxCode;
  } else if (a < 0.015625) {  // below 2^-6: subnormal, units of 2^-9
    // Rounding up to 8 units gives code 0x08, which is exactly 2^-6.
    code = static_cast<std::uint8_t>(format_round_even(a * 512.0));
  } else {
    int e = static_cast<int>((format_double_bits(a) >> 52) & 0x7FF) - 1023;  // -6..8
    std::int64_t m = format_round_even((a * format_pow2(-e) - 1.0) * 8.0);
    if (m == 8) {
      m = 0;
      ++e;
    }
    const int bits = ((e + 7) << 3) | static_cast<int>(m);
    code = bits > kFp8MaxCode ? kFp8MaxCode : static_cast<std::uint8_t>(bits);
  }
  return negative ? static_cast<std::uint8_t>(code | 0x80u) : code;
}

/// Decodes an e4m3 code (0x7F / 0xFF are NaN).
KVCHECK_HOST_DEVICE float fp8_e4m3_decode(std::uint8_t code) {
  const int e = (code >> 3) & 0xF;
  const int m = code & 7;
  float a;
  if (e == 0xF && m == 7) {
    a = format_bits_float(0x7FC00000u);
  } else if (e == 0) {
    a = static_cast<float>(m) * 0.001953125f;  // m * 2^-9
  } else {
    a = static_cast<float>(8 + m) * format_bits_float(static_cast<std::uint32_t>(e - 10 + 127) << 23);
  }
  return (code & 0x80u) != 0 ? -a : a;
}

/// ue8m0 scale byte for a block whose largest magnitude is `amax`: the
/// smallest power of two 2^k with amax / 2^k <= 448, so no element saturates.
/// amax = m * 2^e (1 <= m < 2) gives amax / 2^(e-8) = 256 m, which is <= 448
/// exactly when m <= 1.75. k is clamped to [-127, 127]; a zero block gets
/// scale 1 (byte 127).
KVCHECK_HOST_DEVICE std::uint8_t ue8m0_choose(double amax) {
  if (!(amax > 0.0)) return 127;
  const std::uint64_t u = format_double_bits(amax);
  const int biased = static_cast<int>((u >> 52) & 0x7FF);
  if (biased == 0) return 0;  // double subnormal: smallest scale
  const int e = biased - 1023;
  const std::uint64_t frac = u & 0x000FFFFFFFFFFFFFull;
  int k = e - 8 + (frac > 0x000C000000000000ull ? 1 : 0);  // m > 1.75
  if (k < -127) k = -127;
  if (k > 127) k = 127;
  return static_cast<std::uint8_t>(k + 127);
}

/// Scale 2^(byte - 127) as a double.
KVCHECK_HOST_DEVICE double ue8m0_to_double(std::uint8_t s) {
  return format_pow2(static_cast<int>(s) - 127);
}

/// Scale 2^(byte - 127) as a float (byte 0 is the float subnormal 2^-127).
KVCHECK_HOST_DEVICE float ue8m0_to_float(std::uint8_t s) {
  if (s == 0) return format_bits_float(0x00400000u);
  return format_bits_float(static_cast<std::uint32_t>(s) << 23);
}

/// Quantizes n values into one fp8 row (layout above). `in` must be finite.
template <class T>
KVCHECK_HOST_DEVICE void fp8_encode_row(const T* in, std::int64_t n, std::uint8_t* row) {
  std::uint8_t* scales = row + n;
  for (std::int64_t b0 = 0; b0 < n; b0 += kFp8BlockElements) {
    const std::int64_t b1 = b0 + kFp8BlockElements < n ? b0 + kFp8BlockElements : n;
    double amax = 0.0;
    for (std::int64_t i = b0; i < b1; ++i) {
      const double a = in[i] < 0 ? -static_cast<double>(in[i]) : static_cast<double>(in[i]);
      if (a > amax) amax = a;
    }
    const std::uint8_t s = ue8m0_choose(amax);
    scales[b0 / kFp8BlockElements] = s;
    // Dividing by a power of two is multiplying by its inverse, exactly
    // (split in two steps so 2^127 never needs a double exponent beyond range).
    const double inv = format_pow2(127 - static_cast<int>(s));
    for (std::int64_t i = b0; i < b1; ++i) row[i] = fp8_e4m3_encode(static_cast<double>(in[i]) * inv);
  }
}

/// Dequantizes one fp8 row of n elements into doubles (exact).
KVCHECK_HOST_DEVICE void fp8_decode_row(const std::uint8_t* row, std::int64_t n, double* out) {
  const std::uint8_t* scales = row + n;
  for (std::int64_t i = 0; i < n; ++i) {
    out[i] = static_cast<double>(fp8_e4m3_decode(row[i])) * ue8m0_to_double(scales[i / kFp8BlockElements]);
  }
}

}  // namespace kvcheck::impl
