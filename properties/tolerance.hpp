// The output tolerance of one query and the stored-key allowances it rests
// on: the a-posteriori bound of model::head_output_bound over this query's
// own scores, softmax weights and values, fed with per-key score error
// bounds (the kernel's accumulation, and the RoPE angle error a correct
// implementation may make at the query's and each key's position with the
// rounding flips it may cause in a stored key). README "Tolerances" has the
// formulas.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include "model/attention.hpp"
#include "model/encoding.hpp"
#include "model/error_bounds.hpp"

namespace kvcheck::properties {

/// Allowed deviations of one stored key row [kv_heads * head_dim] written at
/// `position`: `dev` is the RoPE allowance per element (0 outside the rotary
/// dimensions: those must be stored exactly); `err` bounds how far the
/// element a correct cache stores may be from the reference encoding
/// `encoded`: a correct cache stores the encoding of some value within `dev`
/// of the exact element (README "Stored rows"), and rounding is monotone, so
/// what it stores lies between the encodings of x - dev and x + dev (for fp8
/// under any block scale the block's maximum within those limits selects).
/// Only an element whose band straddles a rounding boundary gets more than
/// its `dev`: the rounding flip the deviation may cause.
template <class R>
void key_deviations(const model::Row<R>& exact_k, const model::EncodedRow& encoded, std::int32_t kv_heads,
                    std::int32_t head_dim, std::int64_t position, const model::Rope& rope,
                    model::Encoding enc, double accum_u, std::vector<double>* dev_out,
                    std::vector<double>* err_out) {
  const std::int64_t width = static_cast<std::int64_t>(exact_k.size());
  std::vector<double>& key_dev = *dev_out;
  key_dev.assign(static_cast<std::size_t>(width), 0.0);
  std::vector<double> dev;
  for (std::int32_t h = 0; h < kv_heads; ++h) {
    model::rope_element_deviation(model::head_slice(exact_k, h, head_dim), position, rope, accum_u, &dev);
    std::copy(dev.begin(), dev.end(), key_dev.begin() + static_cast<std::ptrdiff_t>(h) * head_dim);
  }
  std::vector<double>& key_err = *err_out;
  key_err.assign(static_cast<std::size_t>(width), 0.0);
  // The band of element e, widened by the double arithmetic forming it.
  auto band = [&](std::size_t e, double* lo, double* hi) {
    const double x = model::to_double(exact_k[e]);
    const double widen = key_dev[e] + (std::fabs(x) + key_dev[e]) * 0x1.0p-50 + 0x1.0p-1070;
    *lo = x - widen;
    *hi = x + widen;
  };
  const std::int64_t block = enc == model::Encoding::kFp8 ? model::kFp8ScaleBlock : 1;
  for (std::int64_t b0 = 0; b0 < width; b0 += block) {
    const std::int64_t b1 = std::min(width, b0 + block);
    bool rotated = false;
    for (std::int64_t e = b0; e < b1; ++e) rotated = rotated || key_dev[static_cast<std::size_t>(e)] > 0;
    if (!rotated) continue;  // stored bit for bit: err 0
    if (enc != model::Encoding::kFp8) {
      for (std::int64_t e = b0; e < b1; ++e) {
        const auto i = static_cast<std::size_t>(e);
        double lo = 0, hi = 0;
        band(i, &lo, &hi);
        const double ref = encoded.values[i];
        key_err[i] = std::max(std::fabs(model::encode_value(enc, hi) - ref),
                              std::fabs(ref - model::encode_value(enc, lo)));
      }
      continue;
    }
    // fp8: the scales the block maximum within the bands selects.
    double amax_lo = 0, amax_hi = 0;
    for (std::int64_t e = b0; e < b1; ++e) {
      double lo = 0, hi = 0;
      band(static_cast<std::size_t>(e), &lo, &hi);
      const double a_lo = lo > 0 ? lo : (hi < 0 ? -hi : 0.0);
      amax_lo = std::max(amax_lo, a_lo);
      amax_hi = std::max(amax_hi, std::max(std::fabs(lo), std::fabs(hi)));
    }
    const int k_hi = model::fp8_scale_exponent(amax_hi);
    // A block that may be all zero may take any smaller scale: elements then
    // lie within their band of zero, and any scale up to k_hi rounds them
    // by at most half its spacing at the band's end.
    const bool may_be_zero = !(amax_lo > 0);
    const int k_lo = may_be_zero ? k_hi : model::fp8_scale_exponent(amax_lo);
    for (std::int64_t e = b0; e < b1; ++e) {
      const auto i = static_cast<std::size_t>(e);
      double lo = 0, hi = 0;
      band(i, &lo, &hi);
      const double ref = encoded.values[i];
      double worst = 0;
      for (int k = k_lo; k <= k_hi; ++k) {
        worst = std::max(worst, std::max(std::fabs(model::encode_value(enc, hi, k) - ref),
                                         std::fabs(ref - model::encode_value(enc, lo, k))));
      }
      if (may_be_zero) worst += std::ldexp(1.0, k_hi - 9) + std::max(std::fabs(lo), std::fabs(hi)) / 8;
      key_err[i] = worst;
    }
  }
}

/// One visible key as the tolerance sees it: the reference-encoded key and
/// value, and the error allowed per key element (key_deviations' `err`).
struct KeyBounds {
  const std::vector<double>* values = nullptr;  ///< [kv_heads * head_dim] reference-encoded key
  const std::vector<double>* err = nullptr;     ///< [kv_heads * head_dim]
  const std::vector<double>* value = nullptr;   ///< [kv_heads * head_dim] reference-encoded value
};

/// How the kernel under check computes (the engine's declared capabilities).
struct KernelArithmetic {
  double u = 0x1.0p-24;       ///< unit roundoff of the accumulation (scores, softmax, P.V)
  double prob_u = 0;          ///< probabilities rounded to this unit roundoff before P.V (0: not)
  double rope_u = 0x1.0p-24;  ///< unit roundoff of the RoPE rotation (the query's allowance)
  /// The format outputs are written in (Capabilities::output_format): when
  /// its unit roundoff exceeds `u`, each output is rounded once more, into
  /// it, after the accumulation (parts.output_rounding).
  OutputFormat output = OutputFormat::kAccumulation;
};

/// Result of one query's tolerance.
struct QueryTolerance {
  model::OutputTolerance parts;  ///< max over output elements of the bound and its RoPE part
  double value_max = 0;          ///< largest |value element| visible
  /// The bound is below value_max: an output of zeros (or any output off by
  /// the size of the values) fails. False: the query is not output-checked.
  bool decisive = true;
};

/// Scratch kept between queries.
struct ToleranceScratch {
  model::BoundScratch bound;
  std::vector<double> score, err_acc, err_all, bound_acc, bound_all, q, q_abs, q_dev;
  std::vector<const double*> values, value_err;
};

/// The output tolerance of one query (rotated `query` as doubles, at
/// `position`, reference output `ref` [q_heads * head_dim]) over `keys`: per
/// head, model::head_output_bound over this query's scores and their error
/// bounds, which are, per key j,
///   acc:  gamma_(d+4) scale sum_e |q_e k_je|   (the dot product and the scale
///         in the kernel's precision, the query rounded to it; plus the
///         double estimate's own error)
///   rope: scale sum_e (|q_e| dk_je + dq_e (|k_je| + dk_je))   (the query's
///         and key's RoPE deviations, dk the stored key's err)
/// and, for shared rows (the value is the rotated key), the value error dk.
/// `parts.accumulation` is the bound with the RoPE terms left out;
/// `parts.rope` what they add; `parts.output_rounding` the rounding into an
/// output format narrower than the accumulation (arith.output), half its
/// spacing at the largest magnitude a correct unrounded output may have:
/// max |ref| plus the two parts before it (model::output_rounding_bound).
template <class R>
QueryTolerance query_tolerance(const model::Row<R>& query, const std::vector<KeyBounds>& keys,
                               const model::Heads& heads, double scale, const std::optional<double>& sink,
                               std::int64_t position, const model::Rope& rope, const KernelArithmetic& arith,
                               const std::vector<double>& ref, ToleranceScratch* scratch) {
  ToleranceScratch& s = *scratch;
  const std::int32_t d = heads.head_dim;
  const std::int32_t group = heads.q_heads / heads.kv_heads;
  const auto n = static_cast<std::int64_t>(keys.size());
  const auto un = static_cast<std::size_t>(n);
  const double u = arith.u;
  const double gamma_k = model::gamma_bound(d + 4, u) + model::gamma_bound(d + 4, 0x1.0p-53);
  const double abs_scale = std::fabs(scale);
  s.score.resize(un);
  s.err_acc.resize(un);
  s.err_all.resize(un);
  s.values.resize(un);
  s.value_err.resize(un);
  s.bound_acc.resize(static_cast<std::size_t>(d));
  s.bound_all.resize(static_cast<std::size_t>(d));
  s.q_abs.resize(static_cast<std::size_t>(d));
  QueryTolerance t;
  for (const KeyBounds& key : keys) {
    for (double x : *key.value) t.value_max = std::max(t.value_max, std::fabs(x));
  }
  double acc_worst = 0, all_worst = 0;
  for (std::int32_t h = 0; h < heads.q_heads; ++h) {
    const model::Row<R> head = model::head_slice(query, h, d);
    model::rope_element_deviation(head, position, rope, arith.rope_u, &s.q_dev);
    std::vector<double>& q = s.q;
    q.resize(static_cast<std::size_t>(d));
    for (std::int32_t e = 0; e < d; ++e) {
      q[static_cast<std::size_t>(e)] = model::to_double(head[static_cast<std::size_t>(e)]);
      s.q_abs[static_cast<std::size_t>(e)] = std::fabs(q[static_cast<std::size_t>(e)]);
    }
    const std::size_t off = static_cast<std::size_t>(h / group) * static_cast<std::size_t>(d);
    bool rope_terms = false;
    for (std::size_t j = 0; j < un; ++j) {
      const double* k = keys[j].values->data() + off;
      const double* dk = keys[j].err->data() + off;
      double dot = 0, mag = 0, moved = 0;
      for (std::size_t e = 0; e < static_cast<std::size_t>(d); ++e) {
        dot += q[e] * k[e];
        const double ka = std::fabs(k[e]);
        mag += s.q_abs[e] * ka;
        moved += s.q_abs[e] * dk[e] + s.q_dev[e] * (ka + dk[e]);
      }
      s.score[j] = scale * dot;
      s.err_acc[j] = gamma_k * abs_scale * mag;
      s.err_all[j] = s.err_acc[j] + abs_scale * moved * (1 + 0x1.0p-40);
      rope_terms = rope_terms || moved > 0;
      s.values[j] = keys[j].value->data() + off;
      s.value_err[j] = heads.shared_row ? keys[j].err->data() + off : nullptr;
    }
    model::HeadAttention a;
    a.head_dim = d;
    a.keys = n;
    a.score = s.score.data();
    a.values = s.values.data();
    a.out = ref.data() + static_cast<std::size_t>(h) * static_cast<std::size_t>(d);
    a.sink = sink;
    a.sink_err = sink ? (u + 0x1.0p-53) * std::fabs(*sink) : 0.0;
    a.u = u;
    a.prob_u = arith.prob_u;
    a.score_err = s.err_acc.data();
    double acc = 0, all = 0;
    if (rope_terms || heads.shared_row) {
      model::SecondErrors with_rope;
      with_rope.score_err = s.err_all.data();
      with_rope.value_err = heads.shared_row ? s.value_err.data() : nullptr;
      with_rope.bound = s.bound_all.data();
      acc = model::head_output_bound(a, &s.bound, s.bound_acc.data(), &with_rope);
      all = with_rope.worst;
    } else {
      acc = all = model::head_output_bound(a, &s.bound, s.bound_acc.data());
    }
    acc_worst = std::max(acc_worst, acc);
    all_worst = std::max(all_worst, std::max(all, acc));
  }
  t.parts.accumulation = acc_worst;
  t.parts.rope = all_worst - acc_worst;
  // An output is a convex combination of the values (and the sink's 0): no
  // correct cache is further than 2 value_max from it.
  if (t.parts.total() > 2 * t.value_max) {
    t.parts.accumulation = std::min(t.parts.accumulation, 2 * t.value_max);
    t.parts.rope = 2 * t.value_max - t.parts.accumulation;
  }
  // The output format: a kernel rounds its result y, within the parts
  // above of the reference, once more into it; |y| <= max|ref| + those parts
  // (max|ref| widened by its own double rounding). Not for an output format
  // as wide as the accumulation: its last operation already rounded there.
  if (output_format_unit_roundoff(arith.output) > u) {
    double ref_max = 0;
    for (const double r : ref) ref_max = std::max(ref_max, std::fabs(r));
    t.parts.output_rounding =
        model::output_rounding_bound(arith.output, ref_max * (1 + 0x1.0p-52) + t.parts.total());
  }
  t.decisive = t.value_max == 0 || t.parts.total() < t.value_max;
  return t;
}

}  // namespace kvcheck::properties
