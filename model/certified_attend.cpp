// The certified attention (model/certified.hpp, "attend"): compiled plainly
// here as detail::attend_portable and again with -mfma as detail::attend_fma
// (certified_attend_fma.cpp includes this file), so double-double products
// use a hardware FMA where the CPU has one. certified.cpp picks one.
#include <algorithm>
#include <vector>

#include "model/certified.hpp"
#include "support/assert.hpp"

#ifndef KVCHECK_CERTIFIED_ATTEND
#define KVCHECK_CERTIFIED_ATTEND attend_portable
#endif

namespace kvcheck::model::certified {

namespace {

/// sum_j x_j y_j over n terms, mirrored as one block (header): the centre by
/// a compensated sum, the radius from the inputs' radii, our error and
/// MPFR's gamma_n(um).
template <class GetX, class GetY>
Ball block_dot(std::size_t n, GetX x_at, GetY y_at, double um) {
  double s_hi = 0, s_lo = 0;
  double abs_sum = 0, prop = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const Ball& x = x_at(i);
    const Ball& y = y_at(i);
    const Dd p = two_prod(x.c.hi, y.c.hi);
#if defined(__FMA__)
    const double cross = std::fma(x.c.hi, y.c.lo, x.c.lo * y.c.hi);
#else
    const double cross = x.c.hi * y.c.lo + x.c.lo * y.c.hi;  // (a libm fma call costs more than it saves)
#endif
    const Dd t = two_sum(s_hi, p.hi);
    s_hi = t.hi;
    s_lo += t.lo + (p.lo + cross);
    abs_sum += std::fabs(p.hi);
    prop += mag(x.c) * y.r + mag(y.c) * x.r + x.r * y.r;
  }
  const Dd c = two_sum(s_hi, s_lo);
  const double nd = static_cast<double>(n);
  // sum |x.hi y.hi| rounded up: each |p.hi| is within u of its product, the
  // recursive sum within gamma_n.
  const double a = abs_sum * (1.0 + gamma_n(nd + 2, kU)) * (1.0 + 0x1.0p-50) + 0x1.0p-1070;
  const double ours = (8.0 * (nd + 1) * (nd + 1) + 16.0 * nd) * kU * kU * a;
  const double a_all = abs_sum * (1.0 + 0x1.0p-50) + a + prop;
  const double r = (prop * (1 + gamma_n(nd + 2, kU)) + ours + gamma_n(nd, um) * a_all + nd * kTiny) * kUp;
  return {c, r};
}

}  // namespace

void detail::KVCHECK_CERTIFIED_ATTEND(const Ball* query, const HeadRows& rows, std::int32_t head_dim,
                                      const Ball& scale, const std::optional<double>& sink, double um,
                                      Ball* out) {
  const std::size_t keys = rows.keys.size();
  const auto d = static_cast<std::size_t>(head_dim);
  KVCHECK_ASSERT(keys > 0 && rows.values.size() == keys);
  thread_local std::vector<Ball> scores;  // reused: one allocation per thread, not per head
  scores.resize(keys);
  for (std::size_t j = 0; j < keys; ++j) {
    const Ball* k = rows.keys[j];
    const Ball dot = block_dot(
        d, [&](std::size_t e) -> const Ball& { return query[e]; },
        [&](std::size_t e) -> const Ball& { return k[e]; }, um);
    scores[j] = mul(dot, scale, um);
  }
  // MPFR's peak is its largest score (or the sink): the hull of the maxima.
  const Ball* top = nullptr;
  std::optional<Ball> sink_ball;
  if (sink) sink_ball = exact(*sink);
  auto consider = [&](const Ball& s) {
    if (top == nullptr || s.c.hi > top->c.hi || (s.c.hi == top->c.hi && s.c.lo > top->c.lo)) top = &s;
  };
  if (sink_ball) consider(*sink_ball);
  for (const Ball& s : scores) consider(s);
  Ball peak = *top;
  auto widen = [&](const Ball& s) {
    const Dd diff = dd_add(s.c, dd_neg(top->c));  // <= 0 (top has the largest centre)
    double above = diff.hi + diff.lo;
    above += std::fabs(above) * 0x1.0p-50 + s.r;
    peak.r = std::max(peak.r, above * kUp + 0x1.0p-1074);
  };
  if (sink_ball) widen(*sink_ball);
  for (const Ball& s : scores) widen(s);

  Ball total = sink_ball ? exp(sub(*sink_ball, peak, um), um) : exact(0.0);
  for (Ball& s : scores) {
    s = exp(sub(s, peak, um), um);
    total = add(total, s, um);
  }
  for (Ball& s : scores) s = div(s, total, um);  // the weights
  for (std::size_t e = 0; e < d; ++e) {
    out[e] = block_dot(
        keys, [&](std::size_t j) -> const Ball& { return scores[j]; },
        [&](std::size_t j) -> const Ball& { return rows.values[j][e]; }, um);
  }
}

}  // namespace kvcheck::model::certified
