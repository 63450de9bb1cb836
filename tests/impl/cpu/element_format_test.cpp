// Element formats: bf16 round-to-nearest-even, fp8 e4m3 with ue8m0 block
// scales, row bytes. References are written independently here: exhaustive
// enumeration of the representable values and nearest-value search.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "impl/element_format.hpp"
#include "impl/kv_cache.hpp"
#include "support/prng.hpp"

using namespace kvcheck::impl;

namespace {

// All finite non-negative e4m3 values from the definition (bias 7, 3
// mantissa bits, exponent 15 mantissa 7 is NaN), ascending.
std::vector<double> e4m3_values() {
  std::vector<double> v;
  for (int e = 0; e < 16; ++e) {
    for (int m = 0; m < 8; ++m) {
      if (e == 15 && m == 7) continue;
      v.push_back(e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10));
    }
  }
  return v;
}

// Nearest e4m3 value with ties to the even code, saturating at 448.
double e4m3_nearest(double x) {
  const auto vals = e4m3_values();
  const double a = std::fabs(x);
  if (a >= 448) return std::copysign(448.0, x);
  std::size_t best = 0;
  for (std::size_t i = 1; i < vals.size(); ++i) {
    const double d = std::fabs(vals[i] - a), db = std::fabs(vals[best] - a);
    if (d < db || (d == db && i % 2 == 0)) best = i;
  }
  return std::copysign(vals[best], x);
}

}  // namespace

TEST_CASE("element format: e4m3 decodes every code as the definition says") {
  const auto vals = e4m3_values();
  for (int c = 0; c < 128; ++c) {
    if (c == 0x7F) {
      CHECK(std::isnan(fp8_e4m3_decode(static_cast<std::uint8_t>(c))));
      continue;
    }
    CHECK(fp8_e4m3_decode(static_cast<std::uint8_t>(c)) ==
          static_cast<float>(vals[static_cast<std::size_t>(c)]));
    CHECK(fp8_e4m3_decode(static_cast<std::uint8_t>(c | 0x80)) ==
          -static_cast<float>(vals[static_cast<std::size_t>(c)]));
  }
  CHECK(fp8_e4m3_decode(kFp8MaxCode) == 448.0f);
}

TEST_CASE("element format: e4m3 encode rounds to nearest even and saturates") {
  kvcheck::Prng prng(3);
  const auto vals = e4m3_values();
  // Exact values, midpoints (ties) and random values.
  std::vector<double> xs;
  for (std::size_t i = 0; i + 1 < vals.size(); ++i) {
    xs.push_back(vals[i]);
    xs.push_back((vals[i] + vals[i + 1]) / 2);
  }
  for (int i = 0; i < 5000; ++i) xs.push_back(std::ldexp(prng.unit(), static_cast<int>(prng.range(-12, 9))));
  xs.push_back(448.0);
  xs.push_back(463.0);
  xs.push_back(1e6);
  for (double x : xs) {
    for (double s : {1.0, -1.0}) {
      const double got = fp8_e4m3_decode(fp8_e4m3_encode(s * x));
      INFO("x = " << s * x);
      CHECK(got == e4m3_nearest(s * x));
    }
  }
}

TEST_CASE("element format: bf16 from double is the nearest bf16, ties to even") {
  kvcheck::Prng prng(5);
  for (int i = 0; i < 20000; ++i) {
    const double x =
        std::ldexp(prng.unit() + 0.5, static_cast<int>(prng.range(-140, 127))) * (prng.chance(1, 2) ? -1 : 1);
    const std::uint16_t h = bf16_from_double(x);
    const double got = bf16_to_float(h);
    const double up = bf16_to_float(static_cast<std::uint16_t>(h + 1));
    const double down = bf16_to_float(static_cast<std::uint16_t>(h - 1));
    INFO("x = " << x);
    // Neighbours past zero or infinity are NaN codes; compare only real ones.
    if (!std::isnan(up)) CHECK(std::fabs(got - x) <= std::fabs(up - x));
    if (!std::isnan(down)) CHECK(std::fabs(got - x) <= std::fabs(down - x));
  }
  // Ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 (even: 1).
  CHECK(bf16_to_float(bf16_from_double(1.0 + 0x1.0p-8)) == 1.0f);
  CHECK(bf16_to_float(bf16_from_double(1.0 + 3 * 0x1.0p-8)) == 1.0f + 0x1.0p-6f);
  // Just above a tie rounds up: a float-first conversion would lose this.
  CHECK(bf16_to_float(bf16_from_double(1.0 + 0x1.0p-8 + 0x1.0p-40)) == 1.0f + 0x1.0p-7f);
  CHECK(std::isinf(bf16_to_float(bf16_from_double(1e39))));
}

TEST_CASE("element format: fp8 rows pick the smallest power-of-two scale that fits the block") {
  kvcheck::Prng prng(9);
  for (int trial = 0; trial < 200; ++trial) {
    const std::int64_t n = prng.range(1, 100);
    const int e = static_cast<int>(prng.range(-20, 20));
    std::vector<double> x(static_cast<std::size_t>(n)), y(x.size());
    for (auto& v : x) v = std::ldexp(prng.signed_unit(), e);
    std::vector<std::uint8_t> row(static_cast<std::size_t>(format_row_bytes(ElementFormat::kFp8, n)));
    fp8_encode_row(x.data(), n, row.data());
    fp8_decode_row(row.data(), n, y.data());
    for (std::int64_t b0 = 0; b0 < n; b0 += 32) {
      double amax = 0;
      for (std::int64_t i = b0; i < std::min(n, b0 + 32); ++i)
        amax = std::max(amax, std::fabs(x[static_cast<std::size_t>(i)]));
      const int k = static_cast<int>(row[static_cast<std::size_t>(n + b0 / 32)]) - 127;
      if (amax > 0) {
        CHECK(amax / std::ldexp(1.0, k) <= 448.0);
        CHECK(amax / std::ldexp(1.0, k - 1) > 448.0);
      }
      for (std::int64_t i = b0; i < std::min(n, b0 + 32); ++i) {
        const auto u = static_cast<std::size_t>(i);
        CHECK(y[u] == std::ldexp(e4m3_nearest(std::ldexp(x[u], -k)), k));
      }
    }
  }
}

TEST_CASE("element format: row bytes and epsilons (golden value: 512 fp8 elements are 528 bytes)") {
  CHECK(format_row_bytes(ElementFormat::kFp8, 512) == 528);
  CHECK(format_row_bytes(ElementFormat::kFp8, 512) * 128 == 67584);
  CHECK(format_row_bytes(ElementFormat::kFp8, 512) * 134 == 70752);
  CHECK(format_row_bytes(ElementFormat::kFp8, 33) == 35);
  CHECK(format_row_bytes(ElementFormat::kBf16, 128) == 256);
  CHECK(format_row_bytes(ElementFormat::kF32, 3) == 12);
  CHECK(format_row_bytes(ElementFormat::kF64, 3) == 24);
  CHECK(format_unit_roundoff(ElementFormat::kBf16) == std::ldexp(1.0, -8));
  CHECK(format_unit_roundoff(ElementFormat::kFp8) == std::ldexp(1.0, -4));
}

TEST_CASE("element format: round trip is idempotent and within the format's epsilon") {
  kvcheck::Prng prng(11);
  for (auto f : {ElementFormat::kF64, ElementFormat::kF32, ElementFormat::kBf16, ElementFormat::kFp8}) {
    std::vector<double> x(70), y(70), z(70);
    for (auto& v : x) v = prng.signed_unit() * 3;
    format_round_trip(f, x.data(), y.data(), 70);
    format_round_trip(f, y.data(), z.data(), 70);
    CHECK(y == z);
    double amax = 0;
    for (double v : x) amax = std::max(amax, std::fabs(v));
    for (std::size_t i = 0; i < x.size(); ++i) {
      // fp8 errors scale with the block's scale, not the element.
      const double bound =
          f == ElementFormat::kFp8 ? std::ldexp(amax, -4) : std::fabs(x[i]) * format_unit_roundoff(f);
      CHECK(std::fabs(y[i] - x[i]) <= bound);
    }
  }
}
