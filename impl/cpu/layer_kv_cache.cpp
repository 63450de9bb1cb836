// LayerKvCache: check, prepare, commit (seed 000).
#include "impl/cpu/layer_kv_cache.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <new>

#include "support/assert.hpp"

namespace kvcheck::impl::cpu {

namespace {

std::uint64_t next_parameter_id() {
  static std::atomic<std::uint64_t> counter{0};
  return ++counter;
}

bool rope_bits_equal(double a, double b) {
  // The seed compares the base's bit pattern, not its value.
  std::uint64_t x, y;
  static_assert(sizeof x == sizeof a);
  __builtin_memcpy(&x, &a, sizeof x);
  __builtin_memcpy(&y, &b, sizeof y);
  return x == y;
}

}  // namespace

std::string_view layer_cache_error_name(LayerCacheError error) noexcept {
  switch (error) {
    case LayerCacheError::kOk: return "ok";
    case LayerCacheError::kZeroBatch: return "zero-batch";
    case LayerCacheError::kZeroCapacity: return "zero-capacity";
    case LayerCacheError::kCapacityExceedsPositions: return "capacity-exceeds-positions";
    case LayerCacheError::kElementCountOverflow: return "element-count-overflow";
    case LayerCacheError::kAllocationFailed: return "allocation-failed";
    case LayerCacheError::kInputRank: return "input-rank";
    case LayerCacheError::kSingleTokenRequired: return "single-token-required";
    case LayerCacheError::kInputBatchMismatch: return "input-batch-mismatch";
    case LayerCacheError::kInputWidthMismatch: return "input-width-mismatch";
    case LayerCacheError::kModelWidthMismatch: return "model-width-mismatch";
    case LayerCacheError::kHeadCountMismatch: return "head-count-mismatch";
    case LayerCacheError::kHeadWidthMismatch: return "head-width-mismatch";
    case LayerCacheError::kLayerMismatch: return "layer-mismatch";
    case LayerCacheError::kRevisionMismatch: return "revision-mismatch";
    case LayerCacheError::kRopeMismatch: return "rope-mismatch";
    case LayerCacheError::kFull: return "full";
    case LayerCacheError::kNonFinite: return "non-finite";
  }
  return "?";
}

AttentionLayer::AttentionLayer(std::int32_t model_width, std::int32_t heads, LayerRope rope,
                               std::vector<double> wq, std::vector<double> wk, std::vector<double> wv,
                               std::vector<double> wo)
    : model_width_(model_width), heads_(heads), rope_(rope) {
  KVCHECK_ASSERT(model_width > 0 && heads > 0 && model_width % heads == 0);
  KVCHECK_ASSERT(rope.feature_width >= 0 && rope.feature_width % 2 == 0 &&
                 rope.feature_width <= model_width / heads);
  std::vector<double>* w[4] = {&wq, &wk, &wv, &wo};
  for (int i = 0; i < 4; ++i) {
    KVCHECK_ASSERT(w[i]->size() ==
                   static_cast<std::size_t>(model_width) * static_cast<std::size_t>(model_width));
    params_[i] = std::make_shared<LayerParameter>(LayerParameter{next_parameter_id(), 0, std::move(*w[i])});
  }
}

AttentionLayer AttentionLayer::with_rope(LayerRope rope) const {
  AttentionLayer copy = *this;
  copy.rope_ = rope;
  return copy;
}

void AttentionLayer::update_parameter(int i, std::span<const double> values) {
  KVCHECK_ASSERT(i >= 0 && i < 4);
  auto& p = *params_[i];
  KVCHECK_ASSERT(values.size() == p.values.size());
  std::copy(values.begin(), values.end(), p.values.begin());
  ++p.revision;
}

LayerCacheError LayerKvCache::create(const AttentionLayer& layer, std::int64_t batch, std::int64_t capacity,
                                     std::unique_ptr<LayerKvCache>* out) {
  if (batch <= 0) return LayerCacheError::kZeroBatch;
  if (capacity <= 0) return LayerCacheError::kZeroCapacity;
  if (capacity > layer.rope().max_positions) return LayerCacheError::kCapacityExceedsPositions;
  std::int64_t elements = 0;
  if (__builtin_mul_overflow(batch, std::int64_t{layer.heads()}, &elements) ||
      __builtin_mul_overflow(elements, capacity, &elements) ||
      __builtin_mul_overflow(elements, std::int64_t{layer.head_width()}, &elements) ||
      static_cast<std::uint64_t>(elements) > (std::uint64_t{1} << 60) / sizeof(double)) {
    return LayerCacheError::kElementCountOverflow;
  }
  std::unique_ptr<LayerKvCache> c(new LayerKvCache());
  try {
    c->keys_.assign(static_cast<std::size_t>(elements), 0.0);
    c->values_.assign(static_cast<std::size_t>(elements), 0.0);
    const auto row = static_cast<std::size_t>(batch) * static_cast<std::size_t>(layer.model_width());
    c->q_.assign(row, 0.0);
    c->k_.assign(row, 0.0);
    c->v_.assign(row, 0.0);
    c->mixed_.assign(row, 0.0);
    c->out_.assign(row, 0.0);
    c->weights_.assign(static_cast<std::size_t>(capacity), 0.0);
  } catch (const std::bad_alloc&) {
    return LayerCacheError::kAllocationFailed;
  }
  c->batch_ = batch;
  c->capacity_ = capacity;
  c->model_width_ = layer.model_width();
  c->heads_ = layer.heads();
  c->head_width_ = layer.head_width();
  for (int i = 0; i < 4; ++i) {
    c->ids_[i] = layer.parameter(i).id;
    c->revisions_[i] = layer.parameter(i).revision;
  }
  c->rope_feature_width_ = layer.rope().feature_width;
  c->rope_max_positions_ = layer.rope().max_positions;
  c->rope_base_ = layer.rope().base;
  *out = std::move(c);
  return LayerCacheError::kOk;
}

// The seed's order: rank, one token, batch, width; cache model width, heads,
// head width; parameter identities, revisions; RoPE; capacity.
LayerCacheError LayerKvCache::check(const AttentionLayer& layer, std::span<const double> input,
                                    std::span<const std::int64_t> shape) const {
  if (shape.size() != 3) return LayerCacheError::kInputRank;
  if (shape[1] != 1) return LayerCacheError::kSingleTokenRequired;
  if (shape[0] != batch_) return LayerCacheError::kInputBatchMismatch;
  if (shape[2] != layer.model_width()) return LayerCacheError::kInputWidthMismatch;
  if (input.size() != static_cast<std::size_t>(batch_) * static_cast<std::size_t>(layer.model_width())) {
    return LayerCacheError::kInputRank;
  }
  if (model_width_ != layer.model_width()) return LayerCacheError::kModelWidthMismatch;
  if (heads_ != layer.heads()) return LayerCacheError::kHeadCountMismatch;
  if (head_width_ != layer.head_width()) return LayerCacheError::kHeadWidthMismatch;
  for (int i = 0; i < 4; ++i) {
    if (ids_[i] != layer.parameter(i).id) return LayerCacheError::kLayerMismatch;
  }
  for (int i = 0; i < 4; ++i) {
    if (revisions_[i] != layer.parameter(i).revision) return LayerCacheError::kRevisionMismatch;
  }
  if (rope_feature_width_ != layer.rope().feature_width ||
      rope_max_positions_ != layer.rope().max_positions || !rope_bits_equal(rope_base_, layer.rope().base)) {
    return LayerCacheError::kRopeMismatch;
  }
  if (length_ >= capacity_) return LayerCacheError::kFull;
  for (double x : input) {
    if (!std::isfinite(x)) return LayerCacheError::kNonFinite;
  }
  return LayerCacheError::kOk;
}

// Computes the whole step into q_, k_, v_, mixed_, out_ without touching the
// stored rows or the length.
LayerCacheError LayerKvCache::prepare(const AttentionLayer& layer, std::span<const double> input) {
  const std::int64_t d = model_width_, hw = head_width_, position = length_;
  double* proj[3] = {q_.data(), k_.data(), v_.data()};
  for (int m = 0; m < 3; ++m) {
    const auto& w = layer.parameter(m).values;
    for (std::int64_t b = 0; b < batch_; ++b) {
      for (std::int64_t r = 0; r < d; ++r) {
        double s = 0;
        for (std::int64_t c = 0; c < d; ++c)
          s += w[static_cast<std::size_t>(r * d + c)] * input[static_cast<std::size_t>(b * d + c)];
        proj[m][b * d + r] = s;
      }
    }
  }
  // RoPE at the old length on q and k, each head.
  const std::int32_t half = rope_feature_width_ / 2;
  for (std::int32_t i = 0; i < half; ++i) {
    const double angle = static_cast<double>(position) * std::pow(rope_base_, -2.0 * i / rope_feature_width_);
    const double c = std::cos(angle), s = std::sin(angle);
    for (double* x : {q_.data(), k_.data()}) {
      for (std::int64_t bh = 0; bh < batch_ * heads_; ++bh) {
        double* head = x + bh * hw;
        const double a = head[i], e = head[i + half];
        head[i] = a * c - e * s;
        head[i + half] = a * s + e * c;
      }
    }
  }
  for (double* x : {q_.data(), k_.data(), v_.data()}) {
    for (std::int64_t i = 0; i < batch_ * d; ++i) {
      if (!std::isfinite(x[i])) return LayerCacheError::kNonFinite;
    }
  }
  // Stable softmax over the retained rows plus the candidate row.
  const double scale = 1.0 / std::sqrt(static_cast<double>(hw));
  for (std::int64_t b = 0; b < batch_; ++b) {
    for (std::int64_t h = 0; h < heads_; ++h) {
      const double* q = q_.data() + b * d + h * hw;
      const double* kc = k_.data() + b * d + h * hw;
      const double* vc = v_.data() + b * d + h * hw;
      const std::int64_t base = (b * heads_ + h) * capacity_ * hw;  // [b, h, 0, 0]
      auto key = [&](std::int64_t j) { return j < position ? keys_.data() + base + j * hw : kc; };
      auto value = [&](std::int64_t j) { return j < position ? values_.data() + base + j * hw : vc; };
      double peak = -INFINITY;
      for (std::int64_t j = 0; j <= position; ++j) {
        double s = 0;
        for (std::int64_t x = 0; x < hw; ++x) s += q[x] * key(j)[x];
        weights_[static_cast<std::size_t>(j)] = s * scale;
        peak = std::max(peak, s * scale);
      }
      double total = 0;
      for (std::int64_t j = 0; j <= position; ++j) {
        auto& w = weights_[static_cast<std::size_t>(j)];
        w = std::exp(w - peak);
        total += w;
      }
      double* mixed = mixed_.data() + b * d + h * hw;
      for (std::int64_t x = 0; x < hw; ++x) mixed[x] = 0;
      for (std::int64_t j = 0; j <= position; ++j) {
        const double w = weights_[static_cast<std::size_t>(j)] / total;
        for (std::int64_t x = 0; x < hw; ++x) mixed[x] += w * value(j)[x];
      }
    }
  }
  const auto& wo = layer.parameter(3).values;
  for (std::int64_t b = 0; b < batch_; ++b) {
    for (std::int64_t r = 0; r < d; ++r) {
      double s = 0;
      for (std::int64_t c = 0; c < d; ++c)
        s += wo[static_cast<std::size_t>(r * d + c)] * mixed_[static_cast<std::size_t>(b * d + c)];
      if (!std::isfinite(s)) return LayerCacheError::kNonFinite;
      out_[static_cast<std::size_t>(b * d + r)] = s;
    }
  }
  return LayerCacheError::kOk;
}

LayerCacheError LayerKvCache::append(const AttentionLayer& layer, std::span<const double> input,
                                     std::span<const std::int64_t> shape, std::span<double> out) {
  if (auto e = check(layer, input, shape); e != LayerCacheError::kOk) return e;
  if (out.size() != static_cast<std::size_t>(batch_) * static_cast<std::size_t>(model_width_)) {
    return LayerCacheError::kInputWidthMismatch;
  }
  if (auto e = prepare(layer, input); e != LayerCacheError::kOk) return e;
  // Commit: copy the candidate rows into slot `length_` of every [b, h].
  for (std::int64_t b = 0; b < batch_; ++b) {
    for (std::int64_t h = 0; h < heads_; ++h) {
      const std::int64_t dst = ((b * heads_ + h) * capacity_ + length_) * head_width_;
      const std::int64_t src = b * model_width_ + h * head_width_;
      std::copy(k_.begin() + src, k_.begin() + src + head_width_, keys_.begin() + dst);
      std::copy(v_.begin() + src, v_.begin() + src + head_width_, values_.begin() + dst);
    }
  }
  ++length_;
  std::copy(out_.begin(), out_.end(), out.begin());
  return LayerCacheError::kOk;
}

}  // namespace kvcheck::impl::cpu
