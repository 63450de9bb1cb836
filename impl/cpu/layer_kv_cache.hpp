// The layer-bound KV cache of seed 000 (docs/semantics.md "Golden values", last paragraph): a fixed
// capacity cache bound to one AttentionLayer. Physical layout
// [batch, heads, capacity, head_width] for keys and values, a logical length,
// one appended row per call. Construction captures each parameter's identity
// and value revision and the exact RoPE configuration; every append checks
// input shape, the binding and capacity in the seed's order, then prepares the
// whole calculation (projection, RoPE at the old length, stable softmax,
// value mix, output projection) into preallocated buffers, and only then
// commits the rotated key and unrotated value. A rejected append returns a
// typed error and leaves length and storage byte-identical. reset() keeps the
// allocation, the stored values and the captured binding.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace kvcheck::impl::cpu {

/// Typed refusals of the layer-bound cache, in the seed's vocabulary.
enum class LayerCacheError : std::uint8_t {
  kOk,
  kZeroBatch,                 ///< batch size 0 at construction
  kZeroCapacity,              ///< capacity 0 at construction
  kCapacityExceedsPositions,  ///< capacity > RoPE position capacity
  kElementCountOverflow,      ///< batch * heads * capacity * head_width overflows
  kAllocationFailed,          ///< storage could not be allocated
  kInputRank,                 ///< input is not [batch, tokens, width]
  kSingleTokenRequired,       ///< tokens != 1
  kInputBatchMismatch,        ///< input batch != cache batch
  kInputWidthMismatch,        ///< input width != layer model width
  kModelWidthMismatch,        ///< cache model width != layer model width
  kHeadCountMismatch,         ///< cache heads != layer heads
  kHeadWidthMismatch,         ///< cache head width != layer head width
  kLayerMismatch,             ///< parameter identities differ (a rebuilt layer)
  kRevisionMismatch,          ///< a parameter was updated in place since capture
  kRopeMismatch,              ///< RoPE width, position capacity or base differ
  kFull,                      ///< length == capacity
  kNonFinite,                 ///< non-finite input, projection, score or output
};

/// Stable name of a LayerCacheError ("revision-mismatch", ...).
std::string_view layer_cache_error_name(LayerCacheError error) noexcept;

/// RoPE of a layer: pairs (i, i + feature_width/2) of each head turn by
/// position * base^(-2i / feature_width).
struct LayerRope {
  std::int32_t feature_width = 0;  ///< rotated width per head (even, <= head width)
  std::int64_t max_positions = 0;  ///< position capacity
  double base = 10000.0;
};

/// One parameter node: values plus an identity and a value revision.
struct LayerParameter {
  std::uint64_t id = 0;        ///< unique per node, assigned at creation
  std::uint64_t revision = 0;  ///< bumped by every in-place update
  std::vector<double> values;  ///< [model_width, model_width], y = W x
};

/// A linear multi-head attention layer: Wq, Wk, Wv, Wo (model_width square)
/// and RoPE. Layers built from the same nodes (with_rope) share identities.
class AttentionLayer {
 public:
  /// Builds a layer with four new parameter nodes (new identities).
  AttentionLayer(std::int32_t model_width, std::int32_t heads, LayerRope rope, std::vector<double> wq,
                 std::vector<double> wk, std::vector<double> wv, std::vector<double> wo);
  /// The same parameter nodes under another RoPE configuration.
  AttentionLayer with_rope(LayerRope rope) const;

  std::int32_t model_width() const noexcept { return model_width_; }
  std::int32_t heads() const noexcept { return heads_; }
  std::int32_t head_width() const noexcept { return model_width_ / heads_; }
  const LayerRope& rope() const noexcept { return rope_; }
  /// Parameter i (0 = Wq, 1 = Wk, 2 = Wv, 3 = Wo).
  const LayerParameter& parameter(int i) const { return *params_[static_cast<std::size_t>(i)]; }
  /// Updates parameter i in place (same identity, next revision), as an
  /// optimizer step does.
  void update_parameter(int i, std::span<const double> values);

 private:
  std::int32_t model_width_;
  std::int32_t heads_;
  LayerRope rope_;
  std::shared_ptr<LayerParameter> params_[4];
};

/// Fixed-capacity layer-bound cache (seed 000).
class LayerKvCache {
 public:
  /// Builds a cache for `layer` or returns a typed error (out untouched).
  static LayerCacheError create(const AttentionLayer& layer, std::int64_t batch, std::int64_t capacity,
                                std::unique_ptr<LayerKvCache>* out);

  /// Appends one row: input [batch, 1, model_width] with `shape` its
  /// dimensions; out [batch, model_width] receives the newest position's
  /// attention output. RoPE position = the old logical length. On error
  /// nothing changes (out is not written).
  LayerCacheError append(const AttentionLayer& layer, std::span<const double> input,
                         std::span<const std::int64_t> shape, std::span<double> out);
  /// Logical length back to 0; allocation, stored values and binding kept.
  void reset() noexcept { length_ = 0; }

  std::int64_t length() const noexcept { return length_; }
  std::int64_t capacity() const noexcept { return capacity_; }
  std::int64_t batch() const noexcept { return batch_; }
  /// Physical key storage [batch, heads, capacity, head_width].
  std::span<const double> keys() const noexcept { return keys_; }
  /// Physical value storage [batch, heads, capacity, head_width].
  std::span<const double> values() const noexcept { return values_; }

 private:
  LayerKvCache() = default;
  LayerCacheError check(const AttentionLayer& layer, std::span<const double> input,
                        std::span<const std::int64_t> shape) const;
  LayerCacheError prepare(const AttentionLayer& layer, std::span<const double> input);

  std::int64_t batch_ = 0, capacity_ = 0, length_ = 0;
  std::int32_t model_width_ = 0, heads_ = 0, head_width_ = 0;
  std::uint64_t ids_[4] = {}, revisions_[4] = {};
  std::int32_t rope_feature_width_ = 0;
  std::int64_t rope_max_positions_ = 0;
  double rope_base_ = 0;
  std::vector<double> keys_;    // [batch, heads, capacity, head_width]
  std::vector<double> values_;  // [batch, heads, capacity, head_width]
  // Prepared (uncommitted) step, preallocated at construction.
  std::vector<double> q_, k_, v_;  // [batch, model_width] (q, k rotated)
  std::vector<double> mixed_;      // [batch, model_width] merged heads
  std::vector<double> out_;        // [batch, model_width]
  std::vector<double> weights_;    // [capacity] one head's softmax
};

}  // namespace kvcheck::impl::cpu
