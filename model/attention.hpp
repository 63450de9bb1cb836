// Scaled dot-product attention, RoPE and head layouts at high precision.
//
// Everything is templated on the real type R (model/real.hpp). Rows are plain
// std::vector<R>; the model owns its layouts and never sees impl/ structs.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <vector>

#include "model/real.hpp"
#include "support/assert.hpp"

namespace kvcheck::model {

template <class R>
using Row = std::vector<R>;

/// Numerically stable softmax-weighted mixture of `values` for one query.
/// scores_j = scale * q . k_j; the maximum score is subtracted before exp so
/// the largest term is exp(0) = 1 and no term overflows. An optional sink
/// logit joins the normaliser but contributes no value row.
/// Returns the output row (width of the values) and, if asked, the weights.
template <class R>
Row<R> attend(const Row<R>& query, const std::vector<Row<R>>& keys, const std::vector<Row<R>>& values,
              const R& scale, const std::optional<std::type_identity_t<R>>& sink = std::nullopt,
              std::vector<R>* weights_out = nullptr) {
  using std::exp;
  KVCHECK_ASSERT(!keys.empty() && keys.size() == values.size());
  std::vector<R> scores(keys.size());
  R peak = sink ? *sink : R(0);
  bool have_peak = sink.has_value();
  for (std::size_t j = 0; j < keys.size(); ++j) {
    KVCHECK_ASSERT(keys[j].size() == query.size());
    R dot = 0;
    for (std::size_t d = 0; d < query.size(); ++d) dot += query[d] * keys[j][d];
    scores[j] = dot * scale;
    if (!have_peak || scores[j] > peak) {
      peak = scores[j];
      have_peak = true;
    }
  }
  R total = sink ? R(exp(*sink - peak)) : R(0);
  for (auto& s : scores) {
    s = exp(s - peak);
    total += s;
  }
  Row<R> out(values[0].size(), R(0));
  for (std::size_t j = 0; j < keys.size(); ++j) {
    const R w = scores[j] / total;
    for (std::size_t d = 0; d < out.size(); ++d) out[d] += w * values[j][d];
    if (weights_out) scores[j] = w;
  }
  if (weights_out) *weights_out = std::move(scores);
  return out;
}

/// RoPE pairing.
enum class RopeStyle : std::uint8_t { kNone, kNeox, kInterleaved };

/// RoPE configuration: rotate the first `rotary_dims` elements of each head.
struct Rope {
  RopeStyle style = RopeStyle::kNone;
  std::int32_t rotary_dims = 0;  ///< even, <= head_dim; 0 = no rotation
  double base = 10000.0;
};

/// Rotates one head row in place at absolute `position`. Pair i (of
/// rotary_dims / 2) turns by position * base^(-2i / rotary_dims); neox pairs
/// (i, i + rotary_dims/2), interleaved pairs (2i, 2i + 1). The angle is formed
/// in R, so positions in the millions keep full precision.
template <class R>
void rope_rotate(Row<R>& head, std::int64_t position, const Rope& rope) {
  using std::cos;
  using std::pow;
  using std::sin;
  if (rope.style == RopeStyle::kNone || rope.rotary_dims == 0) return;
  KVCHECK_ASSERT(rope.rotary_dims % 2 == 0 && static_cast<std::size_t>(rope.rotary_dims) <= head.size());
  const std::int32_t half = rope.rotary_dims / 2;
  for (std::int32_t i = 0; i < half; ++i) {
    const R theta = pow(R(rope.base), R(-2 * i) / R(rope.rotary_dims));
    const R angle = R(position) * theta;
    const R c = cos(angle);
    const R s = sin(angle);
    const std::size_t a =
        rope.style == RopeStyle::kNeox ? static_cast<std::size_t>(i) : static_cast<std::size_t>(2 * i);
    const std::size_t b = rope.style == RopeStyle::kNeox ? static_cast<std::size_t>(i + half)
                                                         : static_cast<std::size_t>(2 * i + 1);
    const R x = head[a];
    const R y = head[b];
    head[a] = x * c - y * s;
    head[b] = x * s + y * c;
  }
}

/// Head layout: MHA (kv == q), GQA (q % kv == 0), MQA (kv == 1) and the
/// shared-row layout (one latent row per position used as key and value).
struct Heads {
  std::int32_t q_heads = 1;
  std::int32_t kv_heads = 1;
  std::int32_t head_dim = 1;
  bool shared_row = false;  ///< requires kv_heads == 1
};

/// Slice of head h from a flattened [heads, head_dim] row.
template <class R>
Row<R> head_slice(const Row<R>& flat, std::int32_t h, std::int32_t head_dim) {
  const auto first = flat.begin() + static_cast<std::ptrdiff_t>(h) * head_dim;
  return Row<R>(first, first + head_dim);
}

/// One position's projected rows: q [q_heads*head_dim], k and v
/// [kv_heads*head_dim]. Keys are already rotated; v is empty for shared rows.
template <class R>
struct Projected {
  Row<R> q, k, v;
};

/// Multi-head attention of one query over retained rows. Query head h reads
/// KV head h / (q_heads / kv_heads). Output: [q_heads * head_dim].
template <class R>
Row<R> attend_heads(const Row<R>& q, const std::vector<const Projected<R>*>& rows, const Heads& heads,
                    const R& scale, const std::optional<std::type_identity_t<R>>& sink = std::nullopt) {
  KVCHECK_ASSERT(heads.kv_heads > 0 && heads.q_heads % heads.kv_heads == 0);
  KVCHECK_ASSERT(!heads.shared_row || heads.kv_heads == 1);
  const std::int32_t group = heads.q_heads / heads.kv_heads;
  Row<R> out;
  out.reserve(static_cast<std::size_t>(heads.q_heads) * heads.head_dim);
  std::vector<Row<R>> keys(rows.size()), values(rows.size());
  for (std::int32_t h = 0; h < heads.q_heads; ++h) {
    const std::int32_t kvh = h / group;
    for (std::size_t j = 0; j < rows.size(); ++j) {
      keys[j] = head_slice(rows[j]->k, kvh, heads.head_dim);
      values[j] = heads.shared_row ? keys[j] : head_slice(rows[j]->v, kvh, heads.head_dim);
    }
    const Row<R> o = attend(head_slice(q, h, heads.head_dim), keys, values, scale, sink);
    out.insert(out.end(), o.begin(), o.end());
  }
  return out;
}

}  // namespace kvcheck::model
