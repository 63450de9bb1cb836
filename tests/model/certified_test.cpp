// The certified reference's balls really contain MPFR's values: exp, the
// RoPE rotation at positions up to 2^40, and whole attention heads on
// random and adversarial inputs (large logits, cancelling values, long
// windows, a sink), at 113 and 169 bits; and a pinned double is the one
// MPFR's value rounds to.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "model/attention.hpp"
#include "model/certified.hpp"
#include "model/real.hpp"
#include "support/prng.hpp"

namespace kvcheck::model {
namespace {

namespace cf = certified;

/// |MPFR value - ball centre| <= radius, evaluated in R (exact enough: R
/// has at least 113 bits, the centre is hi + lo).
template <class R>
bool contains(const cf::Ball& b, const R& value) {
  const R centre = R(b.c.hi) + R(b.c.lo);
  const R gap = value > centre ? R(value - centre) : R(centre - value);
  return gap <= R(b.r);
}

template <class R>
void check_pin(const cf::Ball& b, const R& value, std::int64_t* pinned) {
  double d = 0;
  if (cf::pin_double(b, &d)) {
    ++*pinned;
    REQUIRE(d == to_double(value));
  }
}

double draw(Prng& rng, double lo, double hi) {
  return lo + (hi - lo) * rng.unit();
}

TEST_CASE("Certified: double-double exp is within kExpRel of MPFR's exp, with room to spare") {
  Prng rng(7);
  using std::exp;
  for (int i = 0; i < 20000; ++i) {
    const double range = i % 4 == 0 ? 1e-3 : (i % 4 == 1 ? 1.0 : 700.0);
    const cf::Dd x = cf::two_sum(draw(rng, -range, range), draw(rng, -1, 1) * 0x1.0p-60 * range);
    const Real50 exact_value = exp(Real50(x.hi) + Real50(x.lo));
    const cf::Dd e = cf::dd_exp(x);
    const Real50 err = abs(Real50(e.hi) + Real50(e.lo) - exact_value);
    INFO("x = " << x.hi);
    // Relative, plus the low part's underflow near e^-700 (an absolute
    // 2^-1074, which the balls' kTiny covers).
    REQUIRE(err <= Real50(cf::kExpRel / 256) * exact_value + Real50(0x1.0p-1070));
  }
}

template <class R>
void rope_contains(std::uint64_t seed) {
  Prng rng(seed);
  const double um = std::ldexp(1.0, -real_bits<R>());
  std::int64_t pinned = 0, total = 0;
  for (int t = 0; t < 300; ++t) {
    Rope rope;
    rope.style = t % 2 ? RopeStyle::kNeox : RopeStyle::kInterleaved;
    rope.rotary_dims = 2 * static_cast<std::int32_t>(1 + rng.next() % 8);
    rope.base = t % 5 == 0 ? 1e-20 : (t % 5 == 1 ? 1e6 : 10000.0);
    const std::int64_t position =
        static_cast<std::int64_t>(rng.next() >> (24 + rng.next() % 40));  // up to 2^40
    const std::int32_t head_dim = rope.rotary_dims + static_cast<std::int32_t>(rng.next() % 3);
    std::vector<double> x(static_cast<std::size_t>(2 * head_dim));
    for (double& v : x) v = draw(rng, -4, 4);
    std::vector<cf::Ball> c, s;
    cf::rope_factors(cf::rope_thetas<R>(rope), position, &c, &s);
    const auto balls = cf::rotate_row(x.data(), 2, head_dim, rope, c, s, um);
    for (std::int32_t h = 0; h < 2; ++h) {
      Row<R> head(x.begin() + h * head_dim, x.begin() + (h + 1) * head_dim);
      rope_rotate(head, position, rope);
      for (std::int32_t e = 0; e < head_dim; ++e) {
        const cf::Ball& b = balls[static_cast<std::size_t>(h * head_dim + e)];
        INFO("position " << position << " element " << e);
        REQUIRE(contains(b, head[static_cast<std::size_t>(e)]));
        ++total;
        check_pin(b, head[static_cast<std::size_t>(e)], &pinned);
      }
    }
  }
  CHECK(pinned * 100 >= total * 99);
}

TEST_CASE("Certified: rotated rows contain MPFR's rotation at positions up to 2^40") {
  rope_contains<Real>(11);
  rope_contains<Real50>(12);
}

template <class R>
void track_contains(std::uint64_t seed) {
  using std::cos;
  using std::sin;
  Prng rng(seed);
  const double um = std::ldexp(1.0, -real_bits<R>());
  for (int t = 0; t < 6; ++t) {
    Rope rope;
    rope.style = RopeStyle::kNeox;
    rope.rotary_dims = 16;
    rope.base = t % 2 ? 10000.0 : 500000.0;
    const std::vector<R> theta = cf::rope_thetas<R>(rope);
    const std::vector<Real50> wide(theta.begin(), theta.end());
    const cf::RopeSteps steps = cf::rope_steps(wide);
    cf::RopeTrack track;
    const std::int64_t p0 = static_cast<std::int64_t>(rng.next() >> (34 + t));  // up to 2^30
    cf::rope_anchor(theta, p0, um, &track);
    std::vector<cf::Ball> c, s;
    for (std::int64_t k = 0; k < 4096; ++k) {
      if (k > 0) cf::rope_advance(steps, &track);
      if (k % 61 != 0 && k != 4095) continue;
      cf::rope_track_balls(track, steps.theta, um, &c, &s);
      for (std::size_t i = 0; i < theta.size(); ++i) {
        const R angle = R(p0 + k) * theta[i];  // MPFR's angle and factors, as rope_rotate forms them
        INFO("position " << p0 + k << " pair " << i);
        REQUIRE(contains(c[i], R(cos(angle))));
        REQUIRE(contains(s[i], R(sin(angle))));
        REQUIRE(c[i].r < 0x1.0p-60);  // still tight enough to pin rotated rows
      }
    }
  }
}

TEST_CASE("Certified: RoPE factors carried over 4096 positions contain MPFR's cos and sin") {
  track_contains<Real>(21);
  track_contains<Real50>(22);
}

/// One attention head on drawn inputs: the ball contains model::attend's
/// MPFR output; returns how many of the head's elements were pinned.
template <class R>
std::int64_t attend_case(Prng& rng, int kind, std::int64_t* total) {
  const double um = std::ldexp(1.0, -real_bits<R>());
  const auto keys = static_cast<std::size_t>(kind == 2 ? 600 + rng.next() % 1400 : 1 + rng.next() % 9);
  const auto d = static_cast<std::size_t>(kind == 2 ? 64 : 1 + rng.next() % 8);
  const double size = kind == 1 ? 40.0 : 1.0;  // kind 1: logits in the thousands
  std::vector<double> q(d), k(keys * d), v(keys * d);
  for (double& x : q) x = draw(rng, -size, size);
  for (double& x : k) x = draw(rng, -size, size);
  for (std::size_t j = 0; j < keys; ++j) {
    for (std::size_t e = 0; e < d; ++e) {
      // kind 3: values that cancel (+-1 plus a tiny remainder)
      v[j * d + e] = kind == 3 ? (j % 2 ? -1.0 : 1.0) + draw(rng, -1, 1) * 1e-9 : draw(rng, -3, 3);
    }
  }
  const std::optional<double> sink =
      rng.next() % 3 == 0 ? std::optional<double>(draw(rng, -5, 5)) : std::nullopt;
  using std::sqrt;
  const R scale = R(1) / sqrt(R(static_cast<double>(d)));

  std::vector<cf::Ball> qb(d), kb(k.size()), vb(v.size()), out(d);
  for (std::size_t e = 0; e < d; ++e) qb[e] = cf::exact(q[e]);
  for (std::size_t e = 0; e < k.size(); ++e) kb[e] = cf::exact(k[e]);
  for (std::size_t e = 0; e < v.size(); ++e) vb[e] = cf::exact(v[e]);
  cf::HeadRows rows;
  for (std::size_t j = 0; j < keys; ++j) {
    rows.keys.push_back(kb.data() + j * d);
    rows.values.push_back(vb.data() + j * d);
  }
  // Both builds of the certified attention (portable, and -mfma where the
  // CPU runs it) must contain MPFR's output; attend is one of them.
  std::vector<cf::Ball> out_portable(d);
  cf::detail::attend_portable(qb.data(), rows, static_cast<std::int32_t>(d), cf::from_real(scale), sink, um,
                              out_portable.data());
  if (cf::detail::fma_attend_runs()) {
    cf::detail::attend_fma(qb.data(), rows, static_cast<std::int32_t>(d), cf::from_real(scale), sink, um,
                           out.data());
  } else {
    out = out_portable;
  }

  Row<R> qr(q.begin(), q.end());
  std::vector<Row<R>> kr(keys), vr(keys);
  for (std::size_t j = 0; j < keys; ++j) {
    kr[j] = Row<R>(k.begin() + static_cast<std::ptrdiff_t>(j * d),
                   k.begin() + static_cast<std::ptrdiff_t>((j + 1) * d));
    vr[j] = Row<R>(v.begin() + static_cast<std::ptrdiff_t>(j * d),
                   v.begin() + static_cast<std::ptrdiff_t>((j + 1) * d));
  }
  const std::optional<R> sink_r = sink ? std::optional<R>(R(*sink)) : std::nullopt;
  const Row<R> ref = attend(qr, kr, vr, scale, sink_r);
  std::int64_t pinned = 0;
  for (std::size_t e = 0; e < d; ++e) {
    INFO("kind " << kind << " keys " << keys << " element " << e);
    REQUIRE(contains(out[e], ref[e]));
    REQUIRE(contains(out_portable[e], ref[e]));
    check_pin(out[e], ref[e], &pinned);
  }
  *total += static_cast<std::int64_t>(d);
  return pinned;
}

TEST_CASE("Certified: attention balls contain MPFR's output on random and adversarial heads") {
  Prng rng(2026);
  for (int kind = 0; kind < 4; ++kind) {
    std::int64_t pinned = 0, total = 0;
    const int heads = kind == 2 ? 3 : 400;
    for (int t = 0; t < heads; ++t) {
      pinned += t % 2 ? attend_case<Real>(rng, kind, &total) : attend_case<Real50>(rng, kind, &total);
    }
    INFO("kind " << kind << ": " << pinned << " of " << total << " pinned");
    CHECK(pinned * 100 >= total * 95);
  }
}

TEST_CASE("Certified: a ball pins a double only when every value in it rounds there") {
  const double x = 1.0 + 0x1.0p-52;
  double out = 0;
  // Exactly halfway between x and its upper neighbour: undecided.
  CHECK_FALSE(cf::pin_double(cf::Ball{{x, 0x1.0p-53}, 0x1.0p-120}, &out));
  // Well inside: decided.
  CHECK(cf::pin_double(cf::Ball{{x, 0x1.0p-60}, 0x1.0p-100}, &out));
  CHECK(out == x);
  // Below a power of two the lower gap is half as wide.
  CHECK_FALSE(cf::pin_double(cf::Ball{{1.0, -0x1.0p-54}, 0x1.0p-120}, &out));
  CHECK(cf::pin_double(cf::Ball{{-1.0, 0x1.0p-55}, 0x1.0p-120}, &out));
  CHECK(out == -1.0);
  // Values near zero or beyond the range are left to MPFR.
  CHECK_FALSE(cf::pin_double(cf::Ball{{0x1.0p-1010, 0}, 0x1.0p-1070}, &out));
}

}  // namespace
}  // namespace kvcheck::model
