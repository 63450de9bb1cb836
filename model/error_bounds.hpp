// Error bounds for the output check: how far a correct cache's attention
// output may be from the high-precision reference, derived from the
// computation being checked (unit roundoff of the accumulation, visible
// keys, head width, score and value magnitudes) and, separately, from the
// RoPE angle error at the query's and keys' positions, which grows with the
// position and with |ln base|. Plain doubles; the runner feeds them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "model/attention.hpp"
#include "support/formats.hpp"

namespace kvcheck::model {

/// theta_i = base^(-2i / rotary_dims) of RoPE pair i (as a double; may be inf or 0).
inline double rope_theta(const Rope& rope, std::int32_t pair) {
  return std::pow(rope.base, -2.0 * pair / rope.rotary_dims);
}

/// Bound (radians) on |computed - exact| RoPE angle of pair `pair` at
/// `position` for an implementation working in unit roundoff `u`:
///   4u (p theta_i (2 + |x_i ln base|) + 1),  x_i = 2i / rotary_dims.
/// theta_i = base^(-x_i) carries a relative error of about
/// u (1 + |x_i ln base|) (the rounded exponent x_i, scaled by ln base, then
/// pow or exp itself); p * theta_i adds u relative; cos and sin add u
/// absolute. The factor 4 covers other orders of evaluation (1/base^x,
/// exp(-x ln base), a float position). At p = 1e5, theta = 1, base 10000 the
/// bound is 8.9e-11 rad with u = 2^-53 and 4.8e-2 rad with u = 2^-24; a
/// float32 angle table there is off by up to 4e-3 rad. Infinite when theta
/// or the angle overflows.
inline double rope_angle_error_bound(const Rope& rope, std::int64_t position, std::int32_t pair, double u) {
  const double x = 2.0 * pair / rope.rotary_dims;
  const double theta = rope_theta(rope, pair);
  return 4.0 * u * (static_cast<double>(position) * theta * (2.0 + std::fabs(x * std::log(rope.base))) + 1.0);
}

/// Bound on each element's error after rotating a head row at `position`:
/// dev[e] = |(x_a, x_b)| * min(angle bound, 2) + 2u |(x_a, x_b)| for the pair
/// (a, b) holding e (a rotation by a wrong angle moves the pair by
/// 2 |sin(err / 2)| <= min(err, 2) times its length), 0 outside the rotary
/// dimensions. `head` is the (rotated) row, which has the same pair lengths.
template <class R>
void rope_element_deviation(const std::vector<R>& head, std::int64_t position, const Rope& rope, double u,
                            std::vector<double>* dev) {
  dev->assign(head.size(), 0.0);
  if (rope.style == RopeStyle::kNone || rope.rotary_dims == 0) return;
  const std::int32_t half = rope.rotary_dims / 2;
  for (std::int32_t i = 0; i < half; ++i) {
    const std::size_t a =
        rope.style == RopeStyle::kNeox ? static_cast<std::size_t>(i) : static_cast<std::size_t>(2 * i);
    const std::size_t b = rope.style == RopeStyle::kNeox ? static_cast<std::size_t>(i + half)
                                                         : static_cast<std::size_t>(2 * i + 1);
    const double len = std::hypot(to_double(head[a]), to_double(head[b]));
    const double err = std::min(rope_angle_error_bound(rope, position, i, u), 2.0);
    (*dev)[a] = (*dev)[b] = len * (err + 2.0 * u);
  }
}

/// The output rounding term (docs/observations-and-tolerances.md "Output
/// formats"): the largest |RN(y) - y| over |y| <= m when a kernel rounds its
/// accumulated result y once, to nearest, into output format `f` of p
/// significand bits. That is half the spacing of `f` at m: for m in
/// [2^e, 2^(e+1)) with e >= emin, 2^(e - p) (bf16 at 1: 2^-8, fp16 at 1:
/// 2^-11), between 2^-(p+1) and 2^-p of m; below 2^emin the subnormal
/// half-spacing 2^(emin - p). The spacing never shrinks as |y| grows, so the
/// binade of m bounds every smaller y. Infinite when m exceeds the largest
/// finite value (a correct rounding may then overflow); 0 for m = 0 and for
/// kAccumulation (nothing is rounded beyond the accumulation).
inline double output_rounding_bound(OutputFormat f, double m) {
  const OutputFormatInfo& info = output_format_info(f);
  if (info.significand_bits == 0 || m == 0) return 0;
  if (!(m <= info.max_finite)) return std::numeric_limits<double>::infinity();
  int e = 0;
  (void)std::frexp(m, &e);  // m = g 2^e, 0.5 <= g < 1: m in [2^(e-1), 2^e)
  const int lead = std::max(e - 1, info.min_exponent);
  return std::ldexp(1.0, lead - info.significand_bits);
}

/// The two parts of an output tolerance (absolute, per output element).
struct OutputTolerance {
  double accumulation = 0;  ///< rounding of scores, softmax and the weighted sum
  double rope = 0;          ///< RoPE angle error of the query and the keys (and what it may flip)
  /// Rounding of the accumulated output into a declared output format
  /// narrower than the accumulation (output_rounding_bound); 0 otherwise.
  double output_rounding = 0;
  double total() const noexcept { return accumulation + rope + output_rounding; }
};

/// gamma_n = n u / (1 - n u): the relative error bound of n rounded
/// operations in unit roundoff u (infinite when n u >= 1).
inline double gamma_bound(double n, double u) {
  const double nu = n * u;
  return nu < 1 ? nu / (1 - nu) : std::numeric_limits<double>::infinity();
}

/// One query head's attention as its output bound sees it: what kvcheck
/// knows of the computation a correct cache makes, all of it data of this
/// query (the a-posteriori bound below).
struct HeadAttention {
  std::int32_t head_dim = 0;
  std::int64_t keys = 0;
  const double* score = nullptr;          ///< [keys] s_j = scale q.k_j (estimated in double)
  const double* score_err = nullptr;      ///< [keys] bound on |kernel's s_j - exact s_j| before the softmax
  const double* const* values = nullptr;  ///< [keys] -> [head_dim] reference value rows
  const double* const* value_err = nullptr;  ///< [keys] -> [head_dim] or null: |kernel's v - reference v|
  const double* out = nullptr;               ///< [head_dim] reference output
  std::optional<double> sink;                ///< sink logit (a key with value 0)
  double sink_err = 0;                       ///< bound on the kernel's sink logit error
  double u = 0;                              ///< unit roundoff of the kernel's accumulation
  double prob_u = 0;  ///< unit roundoff the probabilities are rounded to before P.V (0: not rounded)
};

/// Scratch space for head_output_bound (kept by the caller between queries).
struct BoundScratch {
  std::vector<double> w, eps1, eps2, c1, c2, t1a, ba, t1b, bb, t3;
};

/// A second set of score errors (and value errors) evaluated in the same pass
/// over the values: the RoPE-free part and the whole bound of one query come
/// from one reading of its rows.
struct SecondErrors {
  const double* score_err = nullptr;         ///< [keys]
  const double* const* value_err = nullptr;  ///< [keys] -> [head_dim] or null
  double* bound = nullptr;                   ///< [head_dim] out
  double worst = 0;                          ///< out: max_e bound[e]
};

/// Bound, per output element e, on |kernel output - reference output| of one
/// head (written to bound[0 .. head_dim)). The argument, with w_j the
/// reference softmax weights (the sink is key 0 with value 0):
///
///  1. The kernel's probability p'_j = exp(s'_j - m') differs from the exact
///     e^(s_j - m) by a factor e^(d_j), |d_j| <= eps_j, where
///       eps_j = score_err_j + 2u (|s_j - m| + score_err_j + max_k score_err_k) + 16u :
///     the score error itself; rounding of the exp argument (|x| u, twice for
///     an exp2 with log2(e) folded in); the exp's own error (the CPU kernel's
///     polynomial: ~3.4u). A common m' cancels in the normalisation.
///  2. Weights w'_j = w_j e^(d_j) / Z, Z = sum_k w_k e^(d_k). By Jensen,
///     e^(-L) <= Z <= e^L with L = ln sum_k w_k e^(eps_k), so
///     |w'_j - w_j| <= w_j c_j, c_j = e^(eps_j + L) - 1.
///  3. sum_j (w'_j - w_j) = 0, so o' - o = sum_j (w'_j - w_j)(v_j - o):
///       T1 = sum_j w_j c_j |v_j - o|     (the sink's v = 0: |o|)
///     weighted by the softmax weights, so a key with a large |q.k| but a
///     small weight costs nothing (the former bound took the largest |q.k|
///     over all keys times every term).
///  4. The weighted sum and the normaliser in floating point (any order, an
///     online softmax's rescaling included: at most 2n + 8 roundings per
///     term): with B = sum_j w_j (1 + c_j) |v_j| >= sum_j w'_j |v_j|,
///       T2 = 2 gamma_(2n+8) B / (1 - gamma_(2n+8)) + prob_u B + 2u (|o| + T1)
///     (prob_u: probabilities rounded before P.V; the last term the final
///     division and conversion).
///  5. Values the kernel holds differently (a shared row's rotated key):
///       T3 = sum_j w_j (1 + c_j) value_err_j.
///  6. Underflow: a float exp flushes below e^-87 and products lose digits
///     below the smallest normal: (n + 2) 2^-122 (2 max|v| + |o|) for float
///     accumulation (2^-1018 for double).
/// bound = (T1 + T2 + T3 + underflow) (1 + 2^-20) (the estimate's own
/// double rounding, far below). Returns max_e bound[e].
inline double head_output_bound(const HeadAttention& a, BoundScratch* scratch, double* bound,
                                SecondErrors* second = nullptr) {
  const std::int64_t n = a.keys;
  const std::int32_t d = a.head_dim;
  const double u = a.u;
  const auto un = static_cast<std::size_t>(n);
  const auto ud = static_cast<std::size_t>(d);
  BoundScratch& s = *scratch;
  const bool two = second != nullptr;
  s.w.resize(un);
  double m = a.sink ? *a.sink : -std::numeric_limits<double>::infinity();
  double err_max1 = a.sink ? a.sink_err : 0.0, err_max2 = err_max1;
  for (std::int64_t j = 0; j < n; ++j) {
    m = std::max(m, a.score[j]);
    err_max1 = std::max(err_max1, a.score_err[j]);
    if (two) err_max2 = std::max(err_max2, second->score_err[j]);
  }
  double z = 0, sink_w = 0;
  for (std::size_t i = 0; i < un; ++i) {
    s.w[i] = std::exp(a.score[i] - m);
    z += s.w[i];
  }
  if (a.sink) {
    sink_w = std::exp(*a.sink - m);
    z += sink_w;
  }
  for (std::size_t i = 0; i < un; ++i) s.w[i] /= z;
  sink_w /= z;
  // eps_j, L and c_j of one set of score errors.
  auto weights = [&](const double* err, double err_max, std::vector<double>* eps, std::vector<double>* c,
                     double* sink_c) {
    auto eps_of = [&](double sj, double ej) {
      return ej + 2 * u * (std::fabs(sj - m) + ej + err_max) + 16 * u;
    };
    eps->resize(un);
    c->resize(un);
    double spread = 0;  // sum_j w_j (e^eps_j - 1)
    for (std::size_t i = 0; i < un; ++i) {
      (*eps)[i] = eps_of(a.score[i], err[i]);
      spread += s.w[i] * std::expm1((*eps)[i]);
    }
    const double sink_eps = a.sink ? eps_of(*a.sink, a.sink_err) : 0.0;
    spread += sink_w * std::expm1(sink_eps);
    const double big_l = std::log1p(spread);
    for (std::size_t i = 0; i < un; ++i) (*c)[i] = std::expm1((*eps)[i] + big_l);
    *sink_c = std::expm1(sink_eps + big_l);
  };
  double sink_c1 = 0, sink_c2 = 0;
  weights(a.score_err, err_max1, &s.eps1, &s.c1, &sink_c1);
  if (two) weights(second->score_err, err_max2, &s.eps2, &s.c2, &sink_c2);

  s.t1a.assign(ud, 0.0);
  s.ba.assign(ud, 0.0);
  s.t1b.assign(ud, 0.0);
  s.bb.assign(ud, 0.0);
  s.t3.assign(ud, 0.0);
  double vmax = 0;
  const bool value_err1 = a.value_err != nullptr;
  const bool value_err2 = two && second->value_err != nullptr;
  for (std::size_t i = 0; i < un; ++i) {
    const double wc1 = s.w[i] * s.c1[i], wb1 = s.w[i] * (1 + s.c1[i]);
    const double* v = a.values[i];
    if (!two) {
      for (std::size_t e = 0; e < ud; ++e) {
        const double ve = std::fabs(v[e]);
        vmax = std::max(vmax, ve);
        s.t1a[e] += wc1 * std::fabs(v[e] - a.out[e]);
        s.ba[e] += wb1 * ve;
      }
    } else {
      const double wc2 = s.w[i] * s.c2[i], wb2 = s.w[i] * (1 + s.c2[i]);
      for (std::size_t e = 0; e < ud; ++e) {
        const double ve = std::fabs(v[e]), dv = std::fabs(v[e] - a.out[e]);
        vmax = std::max(vmax, ve);
        s.t1a[e] += wc1 * dv;
        s.ba[e] += wb1 * ve;
        s.t1b[e] += wc2 * dv;
        s.bb[e] += wb2 * ve;
      }
    }
    // Value errors: in the first set's bound, or the second's.
    const double* dv = value_err2 ? second->value_err[i] : (value_err1 ? a.value_err[i] : nullptr);
    if (dv != nullptr) {
      const double wb = value_err2 ? s.w[i] * (1 + s.c2[i]) : wb1;
      for (std::size_t e = 0; e < ud; ++e) s.t3[e] += wb * dv[e];
    }
  }
  const double g = gamma_bound(2.0 * static_cast<double>(n) + 8, u);
  const double acc = 2 * g / (1 - g) + a.prob_u;
  const double tiny = (u > 0x1.0p-40 ? 0x1.0p-122 : 0x1.0p-1018) * static_cast<double>(n + 2);
  auto finish = [&](const std::vector<double>& t1v, const std::vector<double>& bv, double sink_c,
                    bool with_t3, double* out) {
    double worst = 0;
    for (std::size_t e = 0; e < ud; ++e) {
      const double o = std::fabs(a.out[e]);
      const double t1 = t1v[e] + sink_w * sink_c * o;
      double t = t1 + acc * bv[e] + 2 * u * (o + t1) + (with_t3 ? s.t3[e] : 0.0) + tiny * (2 * vmax + o);
      t *= 1 + 0x1.0p-20;
      if (std::isnan(t)) t = std::numeric_limits<double>::infinity();
      out[e] = t;
      worst = std::max(worst, t);
    }
    return worst;
  };
  const double first = finish(s.t1a, s.ba, sink_c1, value_err1 && !value_err2, bound);
  if (two) second->worst = finish(s.t1b, s.bb, sink_c2, value_err2, second->bound);
  return first;
}

}  // namespace kvcheck::model
