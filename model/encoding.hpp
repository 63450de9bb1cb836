// The reference encoding of stored rows: what a correct cache must store for
// an exact row, written from the formats' definitions and independent of the
// implementations' encoders (model/ never includes impl/). Each element
// format rounds to nearest, ties to even, from the exact value (no double
// rounding):
//   f64   IEEE binary64                    8 bytes per element
//   f32   IEEE binary32, overflow -> inf   4 bytes
//   bf16  upper half of binary32 (8 significand bits), overflow -> inf  2 bytes
//   fp8   e4m3 (OCP E4M3FN: bias 7, 3 mantissa bits, subnormal quantum 2^-9,
//         largest 448, no infinity, saturating at +-448), one ue8m0 scale
//         byte per block of 32 elements of the row, after the n codes.
// The fp8 block scale is 2^k with k the smallest integer such that the
// block's largest magnitude amax satisfies amax <= 448 * 2^k (so nothing in
// the block saturates), clamped to [-127, 127] (byte k + 127); a zero block
// gets k = 0 (byte 127). Element i decodes as e4m3(code_i) * 2^k.
// Bytes are little-endian; a negative value that rounds to zero keeps its
// sign bit.
//
// Templated on the real type so rotated keys are encoded from their exact
// (high-precision) value.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "model/real.hpp"
#include "support/assert.hpp"
#include "support/formats.hpp"

namespace kvcheck::model {

/// Element format of a stored row: the one format type of
/// support/formats.hpp, whose table gives its name, row bytes
/// (format_row_bytes) and unit roundoff (format_unit_roundoff). How each
/// format rounds and lays out its bytes is written here, from its definition.
using Encoding = ElementFormat;

/// Elements per fp8 scale block (the format table's scale_block).
inline constexpr std::int64_t kFp8ScaleBlock = format_scale_block(Encoding::kFp8);
/// Largest finite e4m3 magnitude.
inline constexpr double kE4m3Max = 448.0;

/// x rounded to `digits` significand bits, ties to even, with the exponent
/// floored at `emin` (below 2^emin the quantum stays 2^(emin - digits + 1):
/// gradual underflow). No overflow handling: the result may exceed the
/// format's largest value. Exact in R.
template <class R>
R round_nearest_even(const R& x, int digits, int emin) {
  using std::floor;
  using std::frexp;
  using std::ldexp;
  if (x == 0) return x;
  const bool negative = x < 0;
  const R a = negative ? R(-x) : x;
  int e = 0;
  (void)frexp(a, &e);  // a = f * 2^e, 0.5 <= f < 1: leading bit 2^(e-1)
  const int lead = e - 1 < emin ? emin : e - 1;
  const int quantum = lead - (digits - 1);
  const R t = ldexp(a, -quantum);  // < 2^digits: exact
  R n = floor(t);
  const R frac = t - n;
  if (frac > R(0.5) || (frac == R(0.5) && floor(n / 2) * 2 != n)) n += 1;
  const R r = ldexp(n, quantum);
  return negative ? R(-r) : r;
}

/// The ue8m0 exponent k of a block whose largest magnitude is `amax` (see the
/// header): smallest k with amax <= 448 * 2^k, clamped to [-127, 127]; 0 for 0.
template <class R>
int fp8_scale_exponent(const R& amax) {
  using std::frexp;
  if (!(amax > 0)) return 0;
  int e = 0;
  const R f = frexp(amax, &e);  // amax = f * 2^e, f in [0.5, 1): amax = 2f * 2^(e-1)
  // amax / 2^k <= 1.75 * 2^8 with amax = m * 2^(e-1), 1 <= m < 2: k = e-9 when m <= 1.75, else e-8.
  int k = (e - 1) - 8 + (f * 2 > R(1.75) ? 1 : 0);
  if (k < -127) k = -127;
  if (k > 127) k = 127;
  return k;
}

/// The value a format stores for x (fp8: in units already divided by the
/// block scale 2^k, given here as `scale_exponent`), as a double (exact).
template <class R>
double encode_value(Encoding f, const R& x, int scale_exponent = 0) {
  using std::ldexp;
  const double inf = std::numeric_limits<double>::infinity();
  switch (f) {
    case Encoding::kF64: {
      const R r = round_nearest_even(x, 53, -1022);
      return to_double(r);  // exact (or +-inf beyond the range)
    }
    case Encoding::kF32:
    case Encoding::kBf16: {
      const int digits = f == Encoding::kF32 ? 24 : 8;
      const R r = round_nearest_even(x, digits, -126);
      // Overflow: the rounded magnitude reached 2^128 (RNE rounds to infinity).
      const double d = to_double(r);
      if (std::fabs(d) >= 0x1.0p128) return d < 0 ? -inf : inf;
      return d;
    }
    case Encoding::kFp8: {
      const R y = ldexp(x, -scale_exponent);
      const R r = round_nearest_even(y, 4, -6);
      double d = to_double(r);
      if (d > kE4m3Max) d = kE4m3Max;  // saturate
      if (d < -kE4m3Max) d = -kE4m3Max;
      return std::ldexp(d, scale_exponent);
    }
  }
  return 0;
}

/// x rounded once, to nearest with ties to even, into output format `f`
/// (support/formats.hpp KVCHECK_OUTPUT_FORMATS, gradual underflow below
/// 2^emin): what a kernel that writes outputs in `f` returns for a result x
/// of its accumulation. A rounding past the largest finite value overflows
/// to +-inf (fp16: |x| >= 65520). kAccumulation returns x unchanged. Exact.
inline double round_output(OutputFormat f, double x) {
  const OutputFormatInfo& info = output_format_info(f);
  if (info.significand_bits == 0 || x == 0 || !std::isfinite(x)) return x;
  const double r = round_nearest_even(x, info.significand_bits, info.min_exponent);
  if (std::fabs(r) > info.max_finite) return std::copysign(std::numeric_limits<double>::infinity(), x);
  return r;
}

/// One row encoded: its bytes (layout in the header) and their exact decoding.
struct EncodedRow {
  std::vector<std::uint8_t> bytes;
  std::vector<double> values;
  std::vector<int> scale_exponents;  ///< fp8: k of each block; empty otherwise
};

namespace encoding_detail {

inline void put(std::vector<std::uint8_t>& out, const void* p, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(p);
  out.insert(out.end(), b, b + n);  // the build targets are little-endian
}

/// e4m3 code of a value already rounded to e4m3 (|v| <= 448); `negative`
/// carries the sign of the unrounded value (so -0 keeps its sign bit).
inline std::uint8_t e4m3_code(double v, bool negative) {
  const double a = std::fabs(v);
  std::uint8_t code = 0;
  if (a < 0x1.0p-6) {
    code = static_cast<std::uint8_t>(a * 512.0);  // subnormal: units of 2^-9
  } else {
    int e = 0;
    const double f = std::frexp(a, &e);  // a = 2f * 2^(e-1)
    const int mant = static_cast<int>((2 * f - 1) * 8);
    code = static_cast<std::uint8_t>(((e - 1 + 7) << 3) | mant);
  }
  return negative ? static_cast<std::uint8_t>(code | 0x80u) : code;
}

}  // namespace encoding_detail

/// Encodes one row of exact values (rules in the header).
template <class R>
EncodedRow encode_row(Encoding f, const std::vector<R>& x) {
  using std::signbit;
  EncodedRow out;
  const auto n = static_cast<std::int64_t>(x.size());
  out.values.resize(x.size());
  out.bytes.reserve(static_cast<std::size_t>(format_row_bytes(f, n)));
  if (f == Encoding::kFp8) {
    std::vector<std::uint8_t> scales;
    for (std::int64_t b0 = 0; b0 < n; b0 += kFp8ScaleBlock) {
      const std::int64_t b1 = std::min(n, b0 + kFp8ScaleBlock);
      R amax = 0;
      for (std::int64_t i = b0; i < b1; ++i) {
        const R a = x[static_cast<std::size_t>(i)] < 0 ? R(-x[static_cast<std::size_t>(i)])
                                                       : x[static_cast<std::size_t>(i)];
        if (a > amax) amax = a;
      }
      const int k = fp8_scale_exponent(amax);
      out.scale_exponents.push_back(k);
      scales.push_back(static_cast<std::uint8_t>(k + 127));
      for (std::int64_t i = b0; i < b1; ++i) {
        const R& xi = x[static_cast<std::size_t>(i)];
        const double v = encode_value(f, xi, k);
        out.values[static_cast<std::size_t>(i)] = v;
        out.bytes.push_back(encoding_detail::e4m3_code(std::ldexp(v, -k), signbit(xi)));
      }
    }
    out.bytes.insert(out.bytes.end(), scales.begin(), scales.end());
    return out;
  }
  for (std::size_t i = 0; i < x.size(); ++i) {
    double v = encode_value(f, x[i]);
    if (v == 0 && signbit(x[i])) v = -0.0;
    out.values[i] = v;
    if (f == Encoding::kF64) {
      encoding_detail::put(out.bytes, &v, 8);
    } else {
      const float s = static_cast<float>(v);  // exact: v is a binary32 value
      if (f == Encoding::kF32) {
        encoding_detail::put(out.bytes, &s, 4);
      } else {
        std::uint32_t u = 0;
        std::memcpy(&u, &s, 4);
        const auto h = static_cast<std::uint16_t>(u >> 16);  // exact: the low half is zero
        encoding_detail::put(out.bytes, &h, 2);
      }
    }
  }
  return out;
}

/// Decodes one encoded row of n elements (exact).
std::vector<double> decode_row(Encoding f, const std::uint8_t* bytes, std::int64_t n);

}  // namespace kvcheck::model
