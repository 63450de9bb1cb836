// The output tolerance of one query and the stored-key allowances it rests
// on, from model/error_bounds.hpp: the accumulation part (unit roundoff of
// the kernel's arithmetic, visible keys, head width, logit and value size)
// and the RoPE part (the angle error a correct implementation may make at the
// query's and each key's position, and the rounding flips it may cause in a
// stored key). README "Tolerances" has the formulas.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "model/attention.hpp"
#include "model/encoding.hpp"
#include "model/error_bounds.hpp"

namespace kvcheck::properties {

/// Allowed deviations of one stored key row [kv_heads * head_dim] written at
/// `position`: `dev` is the RoPE allowance per element (0 outside the rotary
/// dimensions: those must be stored exactly); `err` adds what a rounding the
/// deviation flips can cost: two units of roundoff of the format at the
/// element (fp8: four, as the block scale may also be one power of two
/// larger) plus the format's smallest spacing, on every element of a block
/// (fp8: 32 elements; else one) that holds a rotated element.
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
  key_err = key_dev;
  const double uf = model::encoding_unit_roundoff(enc);
  const std::int64_t block = enc == model::Encoding::kFp8 ? model::kFp8ScaleBlock : 1;
  for (std::int64_t b0 = 0; b0 < width; b0 += block) {
    const std::int64_t b1 = std::min(width, b0 + block);
    bool rotated = false;
    for (std::int64_t e = b0; e < b1; ++e) rotated = rotated || key_dev[static_cast<std::size_t>(e)] > 0;
    if (!rotated) continue;
    const double tiny =
        enc == model::Encoding::kFp8
            ? std::ldexp(1.0, encoded.scale_exponents[static_cast<std::size_t>(b0 / block)] + 1 - 9)
            : (enc == model::Encoding::kBf16 ? 0x1.0p-133
                                             : (enc == model::Encoding::kF32 ? 0x1.0p-149 : 0x1.0p-1074));
    for (std::int64_t e = b0; e < b1; ++e) {
      const auto i = static_cast<std::size_t>(e);
      const double a = std::fabs(model::to_double(exact_k[i])) + key_dev[i];
      key_err[i] += (enc == model::Encoding::kFp8 ? 4.0 : 2.0) * uf * a + tiny;
    }
  }
}

/// One visible key as the tolerance sees it: the reference-encoded values
/// and the error allowed per element (key_deviations' `err`).
struct KeyBounds {
  const std::vector<double>* values = nullptr;  ///< [kv_heads * head_dim]
  const std::vector<double>* err = nullptr;     ///< [kv_heads * head_dim]
};

/// The output tolerance of one query (exact rotated `query`, at `position`)
/// over `keys` (see model::attention_output_tolerance): the logits' size,
/// and the score and value changes that the RoPE deviations of the query and
/// of each key can cause. `value_max`: largest |value element| visible.
template <class R>
model::OutputTolerance query_tolerance(const model::Row<R>& query, const std::vector<KeyBounds>& keys,
                                       const model::Heads& heads, double scale, std::int64_t position,
                                       const model::Rope& rope, double accum_u, double value_max) {
  const std::int32_t d = heads.head_dim;
  const std::int32_t group = heads.q_heads / heads.kv_heads;
  double score_abs = 0, rope_score = 0, rope_value = 0;
  std::vector<double> q_dev, q_abs(static_cast<std::size_t>(d));
  for (std::int32_t h = 0; h < heads.q_heads; ++h) {
    const model::Row<R> head = model::head_slice(query, h, d);
    model::rope_element_deviation(head, position, rope, accum_u, &q_dev);
    for (std::int32_t e = 0; e < d; ++e) {
      q_abs[static_cast<std::size_t>(e)] = std::fabs(model::to_double(head[static_cast<std::size_t>(e)]));
    }
    const std::size_t off = static_cast<std::size_t>(h / group) * static_cast<std::size_t>(d);
    for (const KeyBounds& key : keys) {
      double dot = 0, moved = 0;
      for (std::size_t e = 0; e < static_cast<std::size_t>(d); ++e) {
        const double k = std::fabs((*key.values)[off + e]);
        const double dk = (*key.err)[off + e];
        dot += q_abs[e] * k;
        moved += q_abs[e] * dk + q_dev[e] * (k + dk);
      }
      score_abs = std::max(score_abs, scale * dot);
      rope_score = std::max(rope_score, scale * moved);
    }
  }
  if (heads.shared_row) {
    for (const KeyBounds& key : keys) {
      for (double x : *key.err) rope_value = std::max(rope_value, x);
    }
  }
  return model::attention_output_tolerance(accum_u, static_cast<std::int64_t>(keys.size()), d, score_abs,
                                           value_max, rope_score, rope_value);
}

}  // namespace kvcheck::properties
