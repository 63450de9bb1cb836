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

#include "model/attention.hpp"

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

/// The two parts of an output tolerance (absolute, per output element).
struct OutputTolerance {
  double accumulation = 0;  ///< rounding of scores, softmax and the weighted sum
  double rope = 0;          ///< RoPE angle error of the query and the keys
  double total() const noexcept { return accumulation + rope; }
};

/// Tolerance of one query's output. `keys`: visible rows; `head_dim`;
/// `score_abs`: max over heads and keys of scale * sum_d |q_d k_d| (bounds
/// every logit and its rounding); `value_max`: largest |value element|;
/// `rope_score`: max over heads and keys of the score change the RoPE
/// deviations can cause; `rope_value`: largest value-element deviation
/// (shared rows, whose rotated key is also the value).
///   accumulation = 16 u (keys + head_dim + (head_dim + 2) score_abs) max(1, value_max)
///     (dot products: gamma_d score_abs; exp(s - max) inherits the argument
///      error u |s - max| <= 2u score_abs; the normaliser and the weighted
///      sum add gamma_keys; a relative weight error e moves the output by at
///      most 2 e value_max)
///   rope = min(2 value_max, 2 value_max expm1(2 rope_score)) + rope_value
///     (scores moved by at most D move every weight by a factor within
///      e^(+-2D) after normalisation; an output is a convex combination of
///      values, so no perturbation moves it further than 2 value_max)
inline OutputTolerance attention_output_tolerance(double u, std::int64_t keys, std::int32_t head_dim,
                                                  double score_abs, double value_max, double rope_score,
                                                  double rope_value) {
  OutputTolerance t;
  t.accumulation = 16.0 * u * (static_cast<double>(keys) + head_dim + (head_dim + 2.0) * score_abs) *
                   std::max(1.0, value_max);
  const double mix = 2.0 * value_max;
  t.rope = rope_score > 0 ? std::min(mix, mix * std::expm1(2.0 * rope_score)) : 0.0;
  if (std::isnan(t.rope)) t.rope = mix;
  t.rope += rope_value;
  return t;
}

}  // namespace kvcheck::model
