// The reference encoding (model/encoding.hpp) against the formats' rules,
// value by value: round to nearest even with its ties, no double rounding,
// overflow, signed zero, and the fp8 block scale (the smallest 2^k with
// amax <= 448 * 2^k), saturation, subnormal codes and zero blocks; and the
// RoPE error bounds (model/error_bounds.hpp) at the numbers README quotes.
#include <catch2/catch.hpp>

#include <cmath>

#include "model/encoding.hpp"
#include "model/error_bounds.hpp"

using namespace kvcheck::model;

namespace {

std::uint16_t bf16_bits(double x) {
  const EncodedRow r = encode_row(Encoding::kBf16, std::vector<double>{x});
  return static_cast<std::uint16_t>(r.bytes[0] | (r.bytes[1] << 8));
}

}  // namespace

TEST_CASE("Encoding: bf16 rounds to nearest with ties to even from the exact value") {
  CHECK(bf16_bits(1.0) == 0x3F80);
  CHECK(bf16_bits(1.0 + 0x1.0p-8) == 0x3F80);              // tie, down to even
  CHECK(bf16_bits(1.0 + 0x1.0p-7 + 0x1.0p-8) == 0x3F82);   // tie, up to even
  CHECK(bf16_bits(1.0 + 0x1.0p-8 + 0x1.0p-30) == 0x3F81);  // above the tie; via float it would round down
  CHECK(bf16_bits(1.0 + 0x1.0p-7 + 0x1.0p-9) == 0x3F81);   // below the tie: truncation agrees here
  CHECK(bf16_bits(1.0 + 0x1.0p-7 + 0x1.0p-8 + 0x1.0p-12) == 0x3F82);  // truncation would give 0x3F81
  CHECK(bf16_bits(-2.0) == 0xC000);
  CHECK(bf16_bits(-0.0) == 0x8000);
  CHECK(bf16_bits(3.4e38) == 0x7F80);      // beyond max + half a step: +inf
  CHECK(bf16_bits(0x1.0p-133) == 0x0001);  // smallest subnormal
  // Beyond double precision: a 113-bit value just above a tie rounds up.
  const Real above = Real(1) + pow(Real(2), -8) + pow(Real(2), -80);
  CHECK(encode_row(Encoding::kBf16, std::vector<Real>{above}).values[0] == 1.0 + 0x1.0p-7);
  CHECK(encode_row(Encoding::kF64, std::vector<Real>{Real(1) + pow(Real(2), -53) + pow(Real(2), -100)})
            .values[0] == 1.0 + 0x1.0p-52);
  CHECK(encode_row(Encoding::kF32, std::vector<double>{1.0 + 0x1.0p-24}).values[0] == 1.0);
}

TEST_CASE("Encoding: fp8 e4m3 with one ue8m0 scale per 32 elements") {
  std::vector<double> x(40, 0.0);
  x[0] = 1.0;              // amax 1: k = -8 (1 <= 448 / 256), scaled 256 = code 0x78
  x[1] = 0x1.0p-16;        // scaled 2^-8 = two subnormal units: code 0x02
  x[2] = 1.5 * 0x1.0p-17;  // scaled 1.5 units: tie, to even 2: code 0x02
  x[3] = -0x1.0p-20;       // scaled 2^-12: rounds to -0, code 0x80
  x[4] = 0.3;              // scaled 76.8: step 8 at 64..128, 80 = 1.25 * 64: code 0x6A
  const EncodedRow r = encode_row(Encoding::kFp8, x);
  REQUIRE(r.bytes.size() == 40 + 2);
  CHECK(r.bytes[0] == 0x78);
  CHECK(r.bytes[1] == 0x02);
  CHECK(r.bytes[2] == 0x02);
  CHECK(r.bytes[3] == 0x80);
  CHECK(r.bytes[4] == 0x6A);
  CHECK(r.values[4] == 80.0 / 256.0);
  CHECK(r.bytes[40] == 127 - 8);
  CHECK(r.bytes[41] == 127);  // the second block is all zero: scale 1
  for (int i = 32; i < 40; ++i) CHECK(r.bytes[static_cast<std::size_t>(i)] == 0);
  // The boundary of the scale rule: 448 fits at k = 0, 449 needs k = 1.
  CHECK(fp8_scale_exponent(448.0) == 0);
  CHECK(fp8_scale_exponent(449.0) == 1);
  CHECK(fp8_scale_exponent(1.75) == -8);
  CHECK(fp8_scale_exponent(1.75 + 0x1.0p-40) == -7);
  const EncodedRow big = encode_row(Encoding::kFp8, std::vector<double>{449.0, -224.5});
  CHECK(big.bytes[2] == 128);
  CHECK(big.bytes[0] == 0x76);  // 449 / 2 = 224.5 -> 224 (step 16 at 128..256)
  CHECK(big.bytes[1] == 0xEE);  // -224.5 / 2 = -112.25 -> -112 (step 8 at 64..128)
  // Clamped scales: a block beyond 448 * 2^127 saturates, one below 2^-127 * 2^-9 underflows.
  const EncodedRow huge = encode_row(Encoding::kFp8, std::vector<double>{1e41});
  CHECK(huge.bytes[1] == 254);
  CHECK(huge.bytes[0] == 0x7E);
  CHECK(huge.values[0] == std::ldexp(448.0, 127));
  const EncodedRow tiny = encode_row(Encoding::kFp8, std::vector<double>{0x1.0p-140});
  CHECK(tiny.bytes[1] == 0);
  CHECK(tiny.values[0] == 0.0);
}

TEST_CASE("Encoding: decode_row inverts every format's bytes exactly, rows of the table's row bytes") {
  // The reference encoder appends bytes one element and one scale at a time,
  // so its length is counted, not computed: it must be the table's
  // format_row_bytes (fp8: ceil(n / 32) scales) for every format and size.
  for (const std::int64_t n : {1, 31, 32, 33, 70}) {
    std::vector<double> x;
    for (std::int64_t i = 0; i < n; ++i)
      x.push_back(std::ldexp(std::sin(static_cast<double>(i) * 1.7), (i % 9) - 4));
    for (const Encoding f : kvcheck::kElementFormats) {
      INFO(kvcheck::format_name(f) << " row of " << n);
      const EncodedRow r = encode_row(f, x);
      CHECK(static_cast<std::int64_t>(r.bytes.size()) == kvcheck::format_row_bytes(f, n));
      CHECK(decode_row(f, r.bytes.data(), n) == r.values);
    }
  }
}

TEST_CASE("Encoding: the table's unit roundoff is half the spacing the reference encoder rounds to at 1") {
  // Near 1 a format with unit roundoff u stores 1 and 1 + 2u and nothing in
  // between: 1 + u is a tie (to even: 1), just above it rounds up, just below down.
  for (const Encoding f : kvcheck::kElementFormats) {
    INFO(kvcheck::format_name(f));
    const double u = kvcheck::format_unit_roundoff(f);
    const Real one(1);
    CHECK(encode_value(f, one + Real(2 * u)) == 1 + 2 * u);
    CHECK(encode_value(f, one + Real(u)) == 1.0);
    CHECK(encode_value(f, one + Real(1.5 * u)) == 1 + 2 * u);
    CHECK(encode_value(f, one + Real(0.5 * u)) == 1.0);
    CHECK(encode_value(f, one - Real(0.75 * u)) == 1 - u);  // below 1 the spacing is u
  }
}

TEST_CASE("Error bounds: the RoPE angle bound at p = 1e5 and 2^40 and its cap") {
  const Rope rope{RopeStyle::kNeox, 128, 10000.0};
  CHECK(rope_angle_error_bound(rope, 100000, 0, 0x1.0p-53) == Approx(8.88e-11).epsilon(0.01));
  CHECK(rope_angle_error_bound(rope, 100000, 0, 0x1.0p-24) == Approx(4.77e-2).epsilon(0.01));
  CHECK(rope_angle_error_bound(rope, std::int64_t{1} << 40, 0, 0x1.0p-53) == Approx(9.77e-4).epsilon(0.01));
  // Position 0 still allows the cos/sin rounding.
  CHECK(rope_angle_error_bound(rope, 0, 5, 0x1.0p-53) == 4 * 0x1.0p-53);
  // A rotation error never moves a pair further than twice its length.
  std::vector<double> dev;
  rope_element_deviation(std::vector<double>{3.0, 0.0, 4.0, 0.0}, std::int64_t{1} << 40,
                         Rope{RopeStyle::kNeox, 4, 1e-20}, 0x1.0p-24, &dev);
  CHECK(dev[0] == Approx(5.0 * (2.0 + 2 * 0x1.0p-24)));
  // gamma_n and its saturation.
  CHECK(gamma_bound(4, 0x1.0p-24) == Approx(4 * 0x1.0p-24 / (1 - 4 * 0x1.0p-24)));
  CHECK(std::isinf(gamma_bound(0x1.0p24, 0x1.0p-24)));
}

TEST_CASE("Output formats: round_output rounds once to nearest even into bf16 and fp16, with overflow") {
  using kvcheck::OutputFormat;
  // bf16 (8 significand bits): ties to even at 1 + 2^-8, 1 + 3 2^-8.
  CHECK(round_output(OutputFormat::kBf16, 1.0 + 0x1.0p-8) == 1.0);
  CHECK(round_output(OutputFormat::kBf16, 1.0 + 3 * 0x1.0p-8) == 1.0 + 0x1.0p-6);
  CHECK(round_output(OutputFormat::kBf16, 1.0 + 0x1.0p-8 + 0x1.0p-40) ==
        1.0 + 0x1.0p-7);  // no double rounding
  CHECK(round_output(OutputFormat::kBf16, -0x1.0p-140) == 0.0);
  CHECK(std::signbit(round_output(OutputFormat::kBf16, -0x1.0p-140)));  // the sign of a zero kept
  CHECK(round_output(OutputFormat::kBf16, 0x1.0p-133) == 0x1.0p-133);   // the least subnormal
  CHECK(std::isinf(round_output(OutputFormat::kBf16, 0x1.ffp127)));
  // fp16 (11 bits, emin -14, largest 65504): 65519 rounds down, 65520 (the tie) overflows.
  CHECK(round_output(OutputFormat::kFp16, 1.0 + 0x1.0p-11) == 1.0);
  CHECK(round_output(OutputFormat::kFp16, 65519.0) == 65504.0);
  CHECK(std::isinf(round_output(OutputFormat::kFp16, 65520.0)));
  CHECK(round_output(OutputFormat::kFp16, 0x1.0p-24) == 0x1.0p-24);  // the least subnormal
  CHECK(round_output(OutputFormat::kFp16, 0x1.8p-25) == 0x1.0p-24);  // above half of it
  CHECK(round_output(OutputFormat::kF32, 1.0 + 0x1.0p-30) == 1.0);
  CHECK(round_output(OutputFormat::kAccumulation, 1.0 + 0x1.0p-30) == 1.0 + 0x1.0p-30);
  // Idempotent: a value of the format is left as it is.
  for (const double x : {1.0078125, -3.5, 0x1.0p-133, 448.0})
    CHECK(round_output(OutputFormat::kBf16, x) == x);
}

TEST_CASE(
    "Output formats: the rounding term is half the spacing at the magnitude, and bounds every rounding below "
    "it") {
  using kvcheck::OutputFormat;
  // Half an ULP of the binade: bf16 2^(e-8), fp16 2^(e-11); relative to m
  // between 2^-(p+1) (just under 2^(e+1)) and 2^-p (at 2^e).
  CHECK(output_rounding_bound(OutputFormat::kBf16, 1.0) == 0x1.0p-8);
  CHECK(output_rounding_bound(OutputFormat::kBf16, 1.99) == 0x1.0p-8);
  CHECK(output_rounding_bound(OutputFormat::kBf16, 0.75) == 0x1.0p-9);
  CHECK(output_rounding_bound(OutputFormat::kFp16, 1.0) == 0x1.0p-11);
  CHECK(output_rounding_bound(OutputFormat::kFp16, 1000.0) == 0x1.0p-2);  // 1000 in [2^9, 2^10)
  CHECK(output_rounding_bound(OutputFormat::kFp16, 1e-6) == 0x1.0p-25);   // subnormal: half of 2^-24
  CHECK(output_rounding_bound(OutputFormat::kBf16, 0x1.0p-130) == 0x1.0p-134);
  CHECK(std::isinf(output_rounding_bound(OutputFormat::kFp16, 70000.0)));  // a correct rounding may overflow
  CHECK(output_rounding_bound(OutputFormat::kAccumulation, 1.0) == 0);
  CHECK(output_rounding_bound(OutputFormat::kBf16, 0.0) == 0);
  // Every |y| <= m rounds within the bound at m, and the worst (a tie in
  // m's binade, below m: m is not at its binade's foot) reaches it: the
  // bound is neither short nor doubled.
  for (const OutputFormat f : {OutputFormat::kBf16, OutputFormat::kFp16}) {
    for (const double m : {1.5, 0.3, 3000.0, 1e-6}) {
      const double bound = output_rounding_bound(f, m);
      double worst = 0;
      for (int i = 0; i <= 4096; ++i) {
        const double y = m * i / 4096.0;
        worst = std::max(worst, std::fabs(round_output(f, y) - y));
      }
      // A tie in m's binade: half a spacing below a point of the format.
      const double tie = round_output(f, m) - bound;
      REQUIRE(tie <= m);
      worst = std::max(worst, std::fabs(round_output(f, tie) - tie));
      INFO(kvcheck::output_format_name(f) << " m " << m << ": bound " << bound << ", worst " << worst);
      CHECK(worst <= bound);
      CHECK(worst == bound);
    }
  }
}
