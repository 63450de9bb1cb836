// A certified double-first reference: attention outputs and RoPE rotations
// computed in double-double arithmetic together with a rigorous bound on
// their distance from what the MPFR reference (model/attention.hpp at p
// significand bits) computes, so that the double the MPFR run would report
// is known without running MPFR whenever the bound pins it.
//
// The argument (README "Certified reference"):
//
// * A Ball is a double-double centre c (hi + lo, |lo| <= ulp(hi)/2) and a
//   radius r. Invariant: the value the MPFR reference computes for the same
//   quantity, by the same sequence of operations, lies in [c - r, c + r].
//   We never bound the distance to the exact value; only to MPFR's.
// * Every mirrored MPFR operation op(x, y) (+, -, *, /, exp) rounds to
//   nearest at p bits: mpfr = op(mx, my)(1 + d), |d| <= um = 2^-p, with mx, my
//   MPFR's inputs, which lie in the input balls. So
//     |mpfr - c| <= |op(mx,my) - op(cx,cy)|        (propagated: `prop`)
//                 + |op(cx,cy) - c|                  (our double-double error)
//                 + um |op(mx,my)|.
//   The double-double error of +, *, / is at most 16u^2 |op(cx,cy)| (u = 2^-53;
//   Joldes, Muller, Popescu, "Tight and rigorous error bounds for basic
//   building blocks of double-word arithmetic", ACM TOMS 2017: 3u^2 for
//   AccurateDWPlusDW, 4u^2 for DWTimesDW3, 15u^2 + 56u^3 for DWDivDW2); we
//   charge kOpRel = 2^-100 (> 25u^2). `prop` uses |mx - cx| <= rx etc.:
//     +-: rx + ry;   *: |cx| ry + |cy| rx + rx ry;
//     /: (|cy| rx + |cx| ry) / (|cy| (|cy| - ry))  (requires ry < |cy|/2).
//   An absolute kTiny = 2^-1040 per operation covers underflow in the
//   error-free transforms. Radii are computed in double and scaled by
//   (1 + 2^-48), which exceeds the rounding of the few double operations
//   that form them.
// * Dot products and the weighted sum (n terms) are bounded as one block:
//   MPFR's recursive sum of rounded products is within gamma_n(um) sum|x y|
//   of the exact sum of its inputs' products (Higham, Accuracy and Stability
//   of Numerical Algorithms, (3.5)); our compensated sum (TwoProd + TwoSum,
//   Ogita, Rump, Oishi 2005) is within gamma_2n(u)^2 sum|x y| plus the
//   rounded cross terms of the low parts (<= 4u^2 |x y| each), charged as
//   (8 (n+1)^2 + 16 n) u^2 sum|x y|.
// * exp: x = n ln2/64 + t with ln2/64 a double-double from MPFR (relative
//   error <= 2^-105, so n ln2/64 is off by <= 2^16 2^-111 = 2^-95 for
//   |n| < 2^16), |t| <= ln2/128; e^x = 2^(n div 64) 2^((n mod 64)/64) e^t
//   with the 64 table entries from MPFR (2^-105 each). e^t by Taylor to
//   degree 11 (remainder < 2^-107 for |t| <= 0.0055); the terms from t^5 on (< 2^-43) are
//   summed in double (error < 2^-95), the rest by five double-double Horner
//   steps (< 10 kOpRel). In all < 2^-93 relatively; we charge kExpRel =
//   2^-84. Arguments below -700 give a centre 0 and radius 2^-1000
//   (e^-700 < 2^-1009).
// * The peak subtracted before exp is MPFR's maximum score: its ball is
//   the hull of all score balls' maxima (the MPFR maximum is some score's
//   MPFR value, and no score's value exceeds the largest upper end).
// * RoPE: cos and sin of position * theta are MPFR's own values (computed
//   once per position and pair in MPFR, exactly as model::rope_rotate forms
//   them), split into a double-double with radius u |lo|; the rotation
//   x c - y s, x s + y c is then mirrored operation by operation. The angle
//   error question does not arise: the angle is MPFR's.
// * Pinning (pin_double): the double MPFR's value rounds to is known when
//   the whole ball lies strictly inside one rounding interval of a normal
//   double (|hi| > 2^-1000); else the caller recomputes with MPFR.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include <mpfr.h>

#include "model/attention.hpp"
#include "model/real.hpp"

// The arithmetic below is compiled two ways where the CPU may have an FMA:
// plainly, and with -mfma for attend (the hot loop: model/certified_attend.cpp
// built twice, picked at run time in certified.cpp). Its inline functions
// live in a namespace named after the instruction set, so the two builds'
// copies never stand in for each other at link time.
#if defined(__FMA__)
#define KVCHECK_CERTIFIED_ISA fma_isa
#else
#define KVCHECK_CERTIFIED_ISA base_isa
#endif

namespace kvcheck::model::certified {

/// An unevaluated sum hi + lo with |lo| <= ulp(hi) / 2.
struct Dd {
  double hi = 0;
  double lo = 0;
};

/// A double-double centre and a radius that contains MPFR's value (header).
struct Ball {
  Dd c;
  double r = 0;
};

inline constexpr double kOpRel = 0x1.0p-100;    ///< double-double +,*,/ relative error charged
inline constexpr double kExpRel = 0x1.0p-84;    ///< double-double exp relative error charged
inline constexpr double kTiny = 0x1.0p-1040;    ///< absolute error per operation (underflow)
inline constexpr double kUp = 1.0 + 0x1.0p-48;  ///< covers the rounding of a radius' own computation
inline constexpr double kU = 0x1.0p-53;

inline namespace KVCHECK_CERTIFIED_ISA {

inline Dd two_sum(double a, double b) {
  const double s = a + b;
  const double bb = s - a;
  return {s, (a - (s - bb)) + (b - bb)};
}

inline Dd fast_two_sum(double a, double b) {
  const double s = a + b;
  return {s, b - (s - a)};
}

/// a * b = hi + lo exactly (barring underflow): with a hardware FMA when
/// the build targets one, else Dekker's product with Veltkamp's split (a
/// libm fma call would cost more than the split).
inline Dd two_prod(double a, double b) {
  const double p = a * b;
#if defined(__FMA__)
  return {p, std::fma(a, b, -p)};
#else
  constexpr double kSplit = 134217729.0;  // 2^27 + 1
  const double ca = kSplit * a, cb = kSplit * b;
  const double ah = ca - (ca - a), bh = cb - (cb - b);
  const double al = a - ah, bl = b - bh;
  return {p, ((ah * bh - p) + ah * bl + al * bh) + al * bl};
#endif
}

/// AccurateDWPlusDW (Joldes, Muller, Popescu, Algorithm 6).
inline Dd dd_add(Dd x, Dd y) {
  const Dd s = two_sum(x.hi, y.hi);
  const Dd t = two_sum(x.lo, y.lo);
  const Dd v = fast_two_sum(s.hi, s.lo + t.hi);
  return fast_two_sum(v.hi, t.lo + v.lo);
}

inline Dd dd_neg(Dd x) {
  return {-x.hi, -x.lo};
}

/// DWTimesDW3 (Algorithm 12; without a hardware FMA the two fused steps
/// round twice, which DWTimesDW2's bound of 5u^2 covers).
inline Dd dd_mul(Dd x, Dd y) {
  const Dd c = two_prod(x.hi, y.hi);
  const double tl0 = x.lo * y.lo;
#if defined(__FMA__)
  const double cl2 = std::fma(x.lo, y.hi, std::fma(x.hi, y.lo, tl0));
#else
  const double cl2 = x.lo * y.hi + (x.hi * y.lo + tl0);
#endif
  return fast_two_sum(c.hi, c.lo + cl2);
}

/// DWTimesFP (Algorithm 9 family) and DWDivDW2 (Algorithm 17).
inline Dd dd_div(Dd x, Dd y) {
  const double th = x.hi / y.hi;
  const Dd r = dd_mul(y, Dd{th, 0});
  const double ph = x.hi - r.hi;
  const double dl = x.lo - r.lo;
  const double d = ph + dl;
  return fast_two_sum(th, d / y.hi);
}

/// |hi + lo| <= mag(x) (the low part is at most 2^-53 |hi|).
inline double mag(const Dd& x) {
  return std::fabs(x.hi) * (1.0 + 0x1.0p-52);
}

/// gamma_n(u) = n u / (1 - n u), rounded up; +inf when n u >= 1.
inline double gamma_n(double n, double u) {
  const double nu = n * u;
  return nu < 0.5 ? nu / (1.0 - nu) * kUp : std::numeric_limits<double>::infinity();
}

/// The radius of an operation's result (header): propagated `prop`, our
/// error relative to the centre `rel`, MPFR's rounding `um`.
inline double result_radius(const Dd& c, double prop, double rel, double um) {
  const double m = mag(c);
  return (prop + rel * 2.0 * m + um * (2.0 * m + prop) + kTiny) * kUp;
}

inline Ball exact(double x) {
  return {{x, 0}, 0};
}

inline Ball add(const Ball& a, const Ball& b, double um) {
  const Dd c = dd_add(a.c, b.c);
  return {c, result_radius(c, a.r + b.r, kOpRel, um)};
}

inline Ball sub(const Ball& a, const Ball& b, double um) {
  return add(a, Ball{dd_neg(b.c), b.r}, um);
}

inline Ball mul(const Ball& a, const Ball& b, double um) {
  const Dd c = dd_mul(a.c, b.c);
  const double prop = mag(a.c) * b.r + mag(b.c) * a.r + a.r * b.r;
  return {c, result_radius(c, prop, kOpRel, um)};
}

inline Ball div(const Ball& a, const Ball& b, double um) {
  const double y = std::fabs(b.c.hi) * (1.0 - 0x1.0p-52);
  if (!(b.r < y / 2)) return {{0, 0}, std::numeric_limits<double>::infinity()};
  const Dd c = dd_div(a.c, b.c);
  const double prop = (mag(b.c) * a.r + mag(a.c) * b.r) / (y * (y - b.r));
  return {c, result_radius(c, prop, kOpRel, um)};
}

}  // namespace KVCHECK_CERTIFIED_ISA

/// Constants from MPFR as double-doubles (relative error <= 2^-105 each):
/// ln2 / 64, 2^(j/64) for j < 64, 1/n! for n <= 11.
struct ExpConstants {
  Dd ln2_64;
  double inv_ln2_64 = 0;  ///< 64 / ln2 to double precision (only picks n)
  Dd two_j64[64];
  Dd inv_factorial[12];
};
const ExpConstants& exp_constants();

inline namespace KVCHECK_CERTIFIED_ISA {

/// 2^e for -1022 <= e <= 1023 (exact).
inline double pow2(int e) {
  return std::bit_cast<double>(static_cast<std::uint64_t>(e + 1023) << 52);
}

/// exp of a double-double argument with |x| <= 700: relative error <= kExpRel (header).
inline Dd dd_exp(Dd x) {
  const ExpConstants& k = exp_constants();
  // n near x / (ln2/64) (any integer within one of it keeps |t| <= 0.0055):
  // rounded by the 1.5 * 2^52 shift, which beats a libm nearbyint call.
  constexpr double kShift = 0x1.8p52;
  const double n = (x.hi * k.inv_ln2_64 + kShift) - kShift;
  // t = x - n ln2/64 (|t| <= ln2/128): n times each part exactly (TwoProd), two additions.
  Dd t = dd_add(x, dd_neg(two_prod(n, k.ln2_64.hi)));
  t = dd_add(t, dd_neg(two_prod(n, k.ln2_64.lo)));
  // Taylor to degree 11: the terms from t^5 on are below 2^-43 and summed in double.
  double tail = k.inv_factorial[11].hi;
  for (int i = 10; i >= 5; --i) tail = tail * t.hi + k.inv_factorial[i].hi;
  Dd s{tail, 0};
  for (int i = 4; i >= 0; --i) s = dd_add(dd_mul(s, t), k.inv_factorial[i]);
  const auto ni = static_cast<std::int64_t>(n);
  const auto j = static_cast<int>(((ni % 64) + 64) % 64);
  const auto e = static_cast<int>((ni - j) / 64);
  s = dd_mul(s, k.two_j64[j]);
  const double scale = pow2(e);
  return {s.hi * scale, s.lo * scale};
}

inline Ball exp(const Ball& a, double um) {
  if (!(a.r <= 0x1.0p-30) || !(a.c.hi <= 700)) return {{0, 0}, std::numeric_limits<double>::infinity()};
  if (a.c.hi < -700) return {{0, 0}, 0x1.0p-1000};  // exp(x) < e^-699 < 2^-1000 for every x in the ball
  const Dd c = dd_exp(a.c);
  // |exp(m) - exp(c)| <= exp(c) (e^r - 1) <= exp(c) r (1 + 2r) for r <= 2^-30.
  const double prop = mag(c) * a.r * (1.0 + 0x1.0p-29);
  return {c, result_radius(c, prop, kExpRel, um)};
}

}  // namespace KVCHECK_CERTIFIED_ISA

/// A ball around MPFR's value `x` (any model real): hi the nearest double,
/// lo the nearest double to x - hi (exact in x's precision), radius u |lo|.
template <class R>
Ball from_real(const R& x) {
  const double hi = to_double(x);
  if (!std::isfinite(hi)) return {{hi, 0}, std::numeric_limits<double>::infinity()};
  const double lo = to_double(R(x - R(hi)));
  return {{hi, lo}, (std::fabs(lo) * 0x1.0p-52 + kTiny) * kUp};
}

/// The double MPFR's value rounds to, when the ball decides it (header).
bool pin_double(const Ball& b, double* out);

/// The ball's ends rounded outward to doubles (lo_end <= every value <= hi_end).
void outward(const Ball& b, double* lo_end, double* hi_end);

/// MPFR's cos and sin of position * theta_i for each RoPE pair, exactly as
/// model::rope_rotate forms them, as balls. `theta` holds MPFR's theta_i.
template <class R>
void rope_factors(const std::vector<R>& theta, std::int64_t position, std::vector<Ball>* cos_out,
                  std::vector<Ball>* sin_out) {
  using std::cos;
  using std::sin;
  cos_out->resize(theta.size());
  sin_out->resize(theta.size());
  for (std::size_t i = 0; i < theta.size(); ++i) {
    const R angle = R(position) * theta[i];
    if constexpr (std::is_same_v<R, double>) {
      (*cos_out)[i] = from_real(cos(angle));
      (*sin_out)[i] = from_real(sin(angle));
    } else {
      // Both correctly rounded, as cos() and sin() give them, in one call.
      R c = 0, s = 0;
      mpfr_sin_cos(s.backend().data(), c.backend().data(), angle.backend().data(), MPFR_RNDN);
      (*cos_out)[i] = from_real(c);
      (*sin_out)[i] = from_real(s);
    }
  }
}

/// cos and sin of p * theta_i for consecutive positions without a
/// transcendental call per position: the exact values (not MPFR's) are
/// enclosed, per pair, by double-double centres and one radius bounding the
/// Euclidean norm of the (cos, sin) error. A step multiplies by the rotation
/// (cos theta_i, sin theta_i) (double-doubles within eps_i of the exact, from
/// 169-bit MPFR): a rotation keeps the norm of an error, the matrix error
/// adds <= 2 eps_i (1 + r), the double-double products and sums <= 16
/// kOpRel. An anchor comes from MPFR at the requested precision: its value
/// at angle fl(p theta) is within um (p theta + 1) of cos(p theta) (the
/// angle's rounding moves it by at most the angle's error, cos's rounding
/// by um), doubled for the norm. factor_balls() then widens by um (p theta
/// + 1) again, so the balls contain MPFR's own cos(fl(p theta)) at every
/// position: what model::rope_rotate multiplies by.
struct RopeTrack {
  std::int64_t position = -1;
  std::int64_t steps = 0;  ///< advances since the anchor
  std::vector<Dd> c, s;
  std::vector<double> r;
};

/// The per-pair step rotations of a RoPE configuration.
struct RopeSteps {
  std::vector<double> theta;  ///< MPFR's theta_i rounded to double (|p theta| bounds only)
  std::vector<Dd> c, s;       ///< cos theta_i, sin theta_i
  std::vector<double> eps;    ///< their error bound
};

/// Anchors `track` at `position` from MPFR values of precision R.
template <class R>
void rope_anchor(const std::vector<R>& theta, std::int64_t position, double um, RopeTrack* track) {
  std::vector<Ball> c, s;
  rope_factors(theta, position, &c, &s);
  track->position = position;
  track->steps = 0;
  track->c.resize(theta.size());
  track->s.resize(theta.size());
  track->r.resize(theta.size());
  for (std::size_t i = 0; i < theta.size(); ++i) {
    const double angle = static_cast<double>(position) * std::fabs(to_double(theta[i])) * (1 + 0x1.0p-40);
    track->c[i] = c[i].c;
    track->s[i] = s[i].c;
    track->r[i] = (c[i].r + s[i].r + 2 * um * (angle + 1)) * kUp;
  }
}

/// Steps from MPFR's theta_i (169-bit cos and sin).
RopeSteps rope_steps(const std::vector<Real50>& theta);

/// Moves `track` one position on.
void rope_advance(const RopeSteps& steps, RopeTrack* track);

/// The balls of MPFR's cos and sin at the track's position (see RopeTrack).
/// `theta`: MPFR's theta_i as doubles (angle bounds only).
void rope_track_balls(const RopeTrack& track, const std::vector<double>& theta, double um,
                      std::vector<Ball>* cos_out, std::vector<Ball>* sin_out);

/// MPFR's theta_i = base^(-2i / rotary_dims), as model::rope_rotate forms it.
template <class R>
std::vector<R> rope_thetas(const Rope& rope) {
  using std::pow;
  std::vector<R> out;
  if (rope.style == RopeStyle::kNone || rope.rotary_dims == 0) return out;
  for (std::int32_t i = 0; i < rope.rotary_dims / 2; ++i)
    out.push_back(pow(R(rope.base), R(-2 * i) / R(rope.rotary_dims)));
  return out;
}

/// Balls of one flattened row [heads * head_dim] of doubles rotated at the
/// position whose factors are given (model::rope_rotate, mirrored).
std::vector<Ball> rotate_row(const double* x, std::int32_t heads, std::int32_t head_dim, const Rope& rope,
                             const std::vector<Ball>& cos_f, const std::vector<Ball>& sin_f, double um);

/// One head's keys and values for certified_attend: pointers to head_dim
/// balls each.
struct HeadRows {
  std::vector<const Ball*> keys;
  std::vector<const Ball*> values;
};

/// model::attend mirrored (header): `query` head_dim balls; writes head_dim
/// balls to `out`. `scale` MPFR's scale; `sink` an exact logit.
/// Runs the FMA build where the CPU has one (the same balls' guarantees;
/// the centres may differ in the last bits, so a query's fallback to MPFR
/// may too, never a pinned figure).
void attend(const Ball* query, const HeadRows& rows, std::int32_t head_dim, const Ball& scale,
            const std::optional<double>& sink, double um, Ball* out);

namespace detail {
/// attend as compiled plainly, and with -mfma (certified_attend_fma.cpp).
void attend_portable(const Ball* query, const HeadRows& rows, std::int32_t head_dim, const Ball& scale,
                     const std::optional<double>& sink, double um, Ball* out);
void attend_fma(const Ball* query, const HeadRows& rows, std::int32_t head_dim, const Ball& scale,
                const std::optional<double>& sink, double um, Ball* out);
/// True when attend runs attend_fma: built with it (x86-64) and the CPU has
/// an FMA. Where it was not built, attend_fma is attend_portable.
bool fma_attend_runs();
}  // namespace detail

}  // namespace kvcheck::model::certified
