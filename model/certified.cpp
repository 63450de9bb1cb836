#include "model/certified.hpp"

#include <algorithm>
#include <bit>

#include "support/assert.hpp"

namespace kvcheck::model::certified {

namespace {

/// A double-double from a 169-bit MPFR value: relative error <= 2^-105.
Dd split(const Real50& x) {
  const Ball b = from_real(x);
  return b.c;
}

}  // namespace

const ExpConstants& exp_constants() {
  static const ExpConstants constants = [] {
    using std::log;
    using std::pow;
    ExpConstants k;
    k.ln2_64 = split(log(Real50(2)) / 64);
    k.inv_ln2_64 = 1.0 / k.ln2_64.hi;
    for (int j = 0; j < 64; ++j) k.two_j64[j] = split(pow(Real50(2), Real50(j) / 64));
    Real50 f = 1;
    for (int n = 0; n < 12; ++n) {
      if (n > 0) f *= n;
      k.inv_factorial[n] = split(Real50(1) / f);
    }
    return k;
  }();
  return constants;
}

bool pin_double(const Ball& b, double* out) {
  const double hi = b.c.hi;
  if (!std::isfinite(hi) || !std::isfinite(b.r)) return false;
  if (b.r == 0 && b.c.lo == 0) {  // an exact double (an input carried through unchanged)
    *out = hi;
    return true;
  }
  if (!(std::fabs(hi) > 0x1.0p-1000) || std::fabs(hi) > 0x1.0p1000) return false;
  // Half the gaps to the neighbours (exact: halving a difference of adjacent
  // doubles); the neighbours by the representation (hi is normal and finite).
  const auto bits = std::bit_cast<std::uint64_t>(hi);
  const double away = std::bit_cast<double>(bits + 1);
  const double toward = std::bit_cast<double>(bits - 1);
  const double gap_out = std::fabs(away) - std::fabs(hi);   // away from zero
  const double gap_in = std::fabs(hi) - std::fabs(toward);  // toward zero
  const double up_half = (hi > 0 ? gap_out : gap_in) / 2;
  const double down_half = (hi > 0 ? gap_in : gap_out) / 2;
  // lo and r are far below hi's ulp; the margins cover the rounding of lo +- r.
  const double r = b.r * kUp + 0x1.0p-1074;
  if (!(b.c.lo + r < up_half * (1 - 0x1.0p-50)) || !(b.c.lo - r > -down_half * (1 - 0x1.0p-50))) return false;
  *out = hi;
  return true;
}

void outward(const Ball& b, double* lo_end, double* hi_end) {
  const double inf = std::numeric_limits<double>::infinity();
  const double r = b.r * kUp;
  *lo_end = std::nextafter(b.c.hi + (b.c.lo - r), -inf);
  *hi_end = std::nextafter(b.c.hi + (b.c.lo + r), inf);
}

RopeSteps rope_steps(const std::vector<Real50>& theta) {
  using std::cos;
  using std::sin;
  RopeSteps out;
  for (const Real50& t : theta) {
    const Ball c = from_real(Real50(cos(t)));
    const Ball s = from_real(Real50(sin(t)));
    out.theta.push_back(to_double(t));
    out.c.push_back(c.c);
    out.s.push_back(s.c);
    // 169-bit rounding (2^-169 <= 2^-160) plus the split.
    out.eps.push_back(std::max(c.r, s.r) + 0x1.0p-160);
  }
  return out;
}

void rope_advance(const RopeSteps& steps, RopeTrack* track) {
  for (std::size_t i = 0; i < steps.c.size(); ++i) {
    const Dd c = track->c[i], s = track->s[i];
    track->c[i] = dd_add(dd_mul(c, steps.c[i]), dd_neg(dd_mul(s, steps.s[i])));
    track->s[i] = dd_add(dd_mul(s, steps.c[i]), dd_mul(c, steps.s[i]));
    const double r = track->r[i];
    track->r[i] = (r * (1 + 2 * steps.eps[i]) + 2 * steps.eps[i] * (1 + r) + 16 * kOpRel + kTiny) * kUp;
  }
  ++track->position;
  ++track->steps;
}

void rope_track_balls(const RopeTrack& track, const std::vector<double>& theta, double um,
                      std::vector<Ball>* cos_out, std::vector<Ball>* sin_out) {
  cos_out->resize(track.c.size());
  sin_out->resize(track.c.size());
  for (std::size_t i = 0; i < track.c.size(); ++i) {
    const double angle = static_cast<double>(track.position) * std::fabs(theta[i]) * (1 + 0x1.0p-40);
    const double r = (track.r[i] + um * (angle + 1)) * kUp;
    (*cos_out)[i] = Ball{track.c[i], r};
    (*sin_out)[i] = Ball{track.s[i], r};
  }
}

std::vector<Ball> rotate_row(const double* x, std::int32_t heads, std::int32_t head_dim, const Rope& rope,
                             const std::vector<Ball>& cos_f, const std::vector<Ball>& sin_f, double um) {
  std::vector<Ball> out(static_cast<std::size_t>(heads) * static_cast<std::size_t>(head_dim));
  for (std::size_t e = 0; e < out.size(); ++e) out[e] = exact(x[e]);
  if (rope.style == RopeStyle::kNone || rope.rotary_dims == 0) return out;
  const std::int32_t half = rope.rotary_dims / 2;
  KVCHECK_ASSERT(cos_f.size() == static_cast<std::size_t>(half) && sin_f.size() == cos_f.size());
  for (std::int32_t h = 0; h < heads; ++h) {
    Ball* head = out.data() + static_cast<std::ptrdiff_t>(h) * head_dim;
    for (std::int32_t i = 0; i < half; ++i) {
      const std::size_t a =
          rope.style == RopeStyle::kNeox ? static_cast<std::size_t>(i) : static_cast<std::size_t>(2 * i);
      const std::size_t b = rope.style == RopeStyle::kNeox ? static_cast<std::size_t>(i + half)
                                                           : static_cast<std::size_t>(2 * i + 1);
      const Ball xa = head[a];
      const Ball yb = head[b];
      const Ball& c = cos_f[static_cast<std::size_t>(i)];
      const Ball& s = sin_f[static_cast<std::size_t>(i)];
      // head[a] = x c - y s; head[b] = x s + y c, each product and sum rounded by MPFR.
      head[a] = sub(mul(xa, c, um), mul(yb, s, um), um);
      head[b] = add(mul(xa, s, um), mul(yb, c, um), um);
    }
  }
  return out;
}

#if KVCHECK_CERTIFIED_FMA_CLONE
bool detail::fma_attend_runs() {
  static const bool fma = __builtin_cpu_supports("fma");
  return fma;
}
#else
bool detail::fma_attend_runs() {
  return false;
}

void detail::attend_fma(const Ball* query, const HeadRows& rows, std::int32_t head_dim, const Ball& scale,
                        const std::optional<double>& sink, double um, Ball* out) {
  attend_portable(query, rows, head_dim, scale, sink, um, out);
}
#endif

void attend(const Ball* query, const HeadRows& rows, std::int32_t head_dim, const Ball& scale,
            const std::optional<double>& sink, double um, Ball* out) {
  if (detail::fma_attend_runs()) return detail::attend_fma(query, rows, head_dim, scale, sink, um, out);
  detail::attend_portable(query, rows, head_dim, scale, sink, um, out);
}

}  // namespace kvcheck::model::certified
