#include "engines/layer_cache.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "impl/cpu/layer_kv_cache.hpp"
#include "support/assert.hpp"

namespace kvcheck::engines {

namespace {

using impl::cpu::AttentionLayer;
using impl::cpu::LayerCacheError;
using impl::cpu::LayerKvCache;
using scenarios::StepKind;

Refusal refusal(LayerCacheError e) {
  return Refusal{std::string(impl::cpu::layer_cache_error_name(e)), "layer-bound cache refused the call"};
}

/// One layer: its AttentionLayer (selection projections) and its cache.
struct Bound {
  std::unique_ptr<AttentionLayer> layer;
  std::unique_ptr<LayerKvCache> cache;
  /// Inputs appended since the last reset, in order (the seed's "reset and
  /// replay": a cache rebuilt for an updated layer is refilled from them).
  std::vector<double> history;
  /// A stale-revision probe bumped the layer's parameter revision: the next
  /// call rebuilds the cache and replays `history` first.
  bool rebind = false;
};

class LayerCache final : public CacheUnderTest {
 public:
  LayerCache(const CacheSpec& spec, std::vector<Bound> layers) : spec_(spec), layers_(std::move(layers)) {
    const auto& c = spec_.cache;
    hd_ = static_cast<std::int64_t>(c.q_heads) * c.head_dim;
    model_width_ = 3 * hd_;
    input_.resize(static_cast<std::size_t>(model_width_));
    out_.resize(static_cast<std::size_t>(model_width_));
  }

  StepStatus call(const StepCall& c, StepAnswer* answer) override {
    Bound& b = layers_[static_cast<std::size_t>(c.layer)];
    if (answer) answer->clear();
    if (b.rebind) {
      if (auto st = rebind(b)) return st;
    }
    if (c.op == StepCall::Op::kBegin) {
      // One request at a time on the single batch row: begin starts it at 0.
      b.cache->reset();
      b.history.clear();
      return {};
    }
    switch (c.step.kind) {
      case StepKind::kReset:
        b.cache->reset();
        b.history.clear();
        return {};
      case StepKind::kFinish: return {};
      case StepKind::kDecode: break;
      default: return Refusal{"unsupported", "the layer-bound cache appends one token per call"};
    }
    const std::int64_t position = b.cache->length();
    fill_input(c.k, c.v, c.q);
    const std::int64_t shape[3] = {1, 1, model_width_};
    const LayerCacheError e = b.cache->append(*b.layer, input_, shape, out_);
    if (e != LayerCacheError::kOk) return refusal(e);
    b.history.insert(b.history.end(), input_.begin(), input_.end());
    if (answer == nullptr) return {};
    answer->out.assign(out_.begin(), out_.begin() + hd_);
    answer->has_written = true;
    answer->written.push_back(position);
    answer->has_reads = true;
    answer->read_offsets = {0, position + 1};
    for (std::int64_t s = 0; s <= position; ++s) answer->read_slots.push_back(s);
    return {};
  }

  StepStatus probe(const std::string& name, const StepCall& c) override {
    Bound& b = layers_[static_cast<std::size_t>(c.layer)];
    fill_input(c.k, c.v, c.q);
    std::int64_t shape[3] = {1, 1, model_width_};
    LayerCacheError e = LayerCacheError::kOk;
    if (name == "rebuilt-layer") {
      // Same weights, new parameter nodes: a layer rebuilt from a checkpoint.
      AttentionLayer rebuilt(b.layer->model_width(), b.layer->heads(), b.layer->rope(),
                             b.layer->parameter(0).values, b.layer->parameter(1).values,
                             b.layer->parameter(2).values, b.layer->parameter(3).values);
      e = b.cache->append(rebuilt, input_, shape, out_);
    } else if (name == "rope-mismatch") {
      impl::cpu::LayerRope rope = b.layer->rope();
      rope.base = rope.base * 2;
      e = b.cache->append(b.layer->with_rope(rope), input_, shape, out_);
    } else if (name == "wrong-width") {
      std::vector<double> wide(input_.size() + 1, 0.0);
      const std::int64_t bad[3] = {1, 1, model_width_ + 1};
      e = b.cache->append(*b.layer, wide, bad, out_);
    } else if (name == "two-tokens") {
      std::vector<double> two(2 * input_.size(), 0.0);
      const std::int64_t bad[3] = {1, 2, model_width_};
      e = b.cache->append(*b.layer, two, bad, out_);
    } else if (name == "stale-revision") {
      // An optimizer step updates one parameter in place (same values, next
      // revision): the bound cache must refuse, unchanged. Successive probes
      // rotate over Wq, Wk, Wv and Wo from a start the capacity picks, so a
      // cache that checks only some revisions fails (also in cases with one
      // probe). Afterwards the adapter rebuilds the cache for the updated
      // layer and replays its inputs (checked against the old rows at the next call).
      const int parameter = static_cast<int>((stale_probes_++ + spec_.cache.ring_rows) % 4);
      b.layer->update_parameter(parameter, b.layer->parameter(parameter).values);
      e = b.cache->append(*b.layer, input_, shape, out_);
      b.rebind = true;
      if (e != LayerCacheError::kOk) {
        static constexpr const char* kNames[4] = {"Wq", "Wk", "Wv", "Wo"};
        Refusal r = refusal(e);
        r.detail += " (after an in-place update of " + std::string(kNames[parameter]) + ")";
        return r;
      }
    } else if (name == "late-overflow") {
      // Finite input whose projections are finite (q and k of 1e200) but
      // whose own attention score q.k overflows to +inf, so the softmax and
      // the output are NaN: the append fails after its projections, RoPE and
      // scores were computed, and must still leave length and storage as
      // they were. (Both q and k turn by the same angle at the new position,
      // so RoPE keeps their dot product +inf.)
      for (std::int64_t i = 0; i < hd_; ++i) {
        input_[static_cast<std::size_t>(i)] = 1e200;
        input_[static_cast<std::size_t>(hd_ + i)] = 1e200;
      }
      e = b.cache->append(*b.layer, input_, shape, out_);
    } else if (name == "non-finite-row") {
      input_[static_cast<std::size_t>(hd_)] = std::numeric_limits<double>::quiet_NaN();
      e = b.cache->append(*b.layer, input_, shape, out_);
    } else {
      return CacheUnderTest::probe(name, c);
    }
    if (e == LayerCacheError::kOk) return std::nullopt;
    return refusal(e);
  }

  std::optional<std::uint64_t> fingerprint(std::int32_t layer) const override {
    const Bound& b = layers_[static_cast<std::size_t>(layer)];
    std::uint64_t h = fnv1a(b.cache->keys().data(), b.cache->keys().size_bytes());
    h = fnv1a(b.cache->values().data(), b.cache->values().size_bytes(), h);
    const std::int64_t length = b.cache->length();
    return fnv1a(&length, sizeof length, h);
  }

 private:
  void fill_input(const double* k, const double* v, const double* q) {
    // [q | k | v]; a shared row is both key and value.
    for (std::int64_t i = 0; i < hd_; ++i) {
      input_[static_cast<std::size_t>(i)] = q[i];
      input_[static_cast<std::size_t>(hd_ + i)] = k[i];
      input_[static_cast<std::size_t>(2 * hd_ + i)] = v ? v[i] : k[i];
    }
  }

  /// Rebuilds b's cache for its (updated) layer, replays the inputs since
  /// the last reset, and checks the replayed rows equal the old cache's live
  /// rows byte for byte; the new cache then serves the run.
  StepStatus rebind(Bound& b) {
    b.rebind = false;
    std::unique_ptr<LayerKvCache> fresh;
    const LayerCacheError e = LayerKvCache::create(*b.layer, 1, b.cache->capacity(), &fresh);
    if (e != LayerCacheError::kOk) return refusal(e);
    const std::int64_t shape[3] = {1, 1, model_width_};
    const auto width = static_cast<std::size_t>(model_width_);
    for (std::size_t at = 0; at < b.history.size(); at += width) {
      const LayerCacheError r =
          fresh->append(*b.layer, std::span<const double>(b.history.data() + at, width), shape, out_);
      if (r != LayerCacheError::kOk)
        return Refusal{"replay-refused", std::string(impl::cpu::layer_cache_error_name(r))};
    }
    if (fresh->length() != b.cache->length() || !same_live_rows(*fresh, *b.cache)) {
      return Refusal{"replay-mismatch",
                     "a cache rebuilt for the updated layer and replayed holds other rows"};
    }
    b.cache = std::move(fresh);
    return {};
  }

  /// Rows [0, length) of every head of keys and values, compared bytewise
  /// (storage is [batch = 1, heads, capacity, head_width]; rows past the
  /// length are stale and need not match).
  bool same_live_rows(const LayerKvCache& a, const LayerKvCache& b) const {
    const auto heads = static_cast<std::size_t>(3 * spec_.cache.q_heads);
    const auto width = static_cast<std::size_t>(spec_.cache.head_dim);
    const auto cap = static_cast<std::size_t>(a.capacity());
    const auto len = static_cast<std::size_t>(a.length());
    for (const bool keys : {true, false}) {
      const std::span<const double> x = keys ? a.keys() : a.values();
      const std::span<const double> y = keys ? b.keys() : b.values();
      for (std::size_t h = 0; h < heads; ++h) {
        const std::size_t first = h * cap * width;
        if (std::memcmp(x.data() + first, y.data() + first, len * width * sizeof(double)) != 0) return false;
      }
    }
    return true;
  }

  CacheSpec spec_;
  std::vector<Bound> layers_;
  std::int64_t hd_ = 0, model_width_ = 0;
  std::int64_t stale_probes_ = 0;  ///< stale-revision probes sent (which parameter the next one updates)
  std::vector<double> input_, out_;
};

class LayerCacheProvider final : public CacheProvider {
 public:
  LayerCacheProvider() {
    caps_.name = "layer-kv-cache";
    caps_.prefill_load_then_store = caps_.prefill_store_then_load = false;
    caps_.verify = caps_.trim = false;
    caps_.formats = {scenarios::Format::kF64};
    caps_.rope_styles = {scenarios::RopeStyle::kNone, scenarios::RopeStyle::kNeox};
    caps_.gqa = caps_.shared_row = caps_.sink = caps_.softmax_scale = false;
    caps_.full_window_only = true;
    caps_.max_states = 1;
    caps_.max_step_rows = 1;
    caps_.ring_addressing = false;
    caps_.probes = {"rebuilt-layer", "rope-mismatch",  "stale-revision", "wrong-width",
                    "two-tokens",    "non-finite-row", "late-overflow"};
  }
  const Capabilities& capabilities() override { return caps_; }
  std::string name() const override { return "layer"; }

  std::unique_ptr<CacheUnderTest> open(const CacheSpec& spec, Refusal* refused) override {
    std::string why;
    if (!caps_.supports(spec.cache, spec.max_step_rows, &why)) {
      *refused = Refusal{"unsupported", why};
      return nullptr;
    }
    const auto& c = spec.cache;
    const std::int32_t h = c.q_heads, d = c.head_dim;
    const std::int32_t hd = h * d, m = 3 * hd;
    auto select = [m, hd](std::int32_t from) {
      std::vector<double> w(static_cast<std::size_t>(m) * static_cast<std::size_t>(m), 0.0);
      for (std::int32_t i = 0; i < hd; ++i)
        w[static_cast<std::size_t>(i) * m + static_cast<std::size_t>(from + i)] = 1.0;
      return w;
    };
    std::vector<double> identity(static_cast<std::size_t>(m) * static_cast<std::size_t>(m), 0.0);
    for (std::int32_t i = 0; i < m; ++i)
      identity[static_cast<std::size_t>(i) * m + static_cast<std::size_t>(i)] = 1.0;
    impl::cpu::LayerRope rope;
    rope.feature_width = c.rope.style == scenarios::RopeStyle::kNone ? 0 : c.rope.rotary_dims;
    rope.max_positions = c.ring_rows;
    rope.base = c.rope.base;
    std::vector<Bound> layers;
    for (std::int32_t l = 0; l < c.layers; ++l) {
      Bound b;
      b.layer =
          std::make_unique<AttentionLayer>(m, 3 * h, rope, select(0), select(hd), select(2 * hd), identity);
      const LayerCacheError e = LayerKvCache::create(*b.layer, 1, c.ring_rows, &b.cache);
      if (e != LayerCacheError::kOk) {
        *refused = refusal(e);
        return nullptr;
      }
      layers.push_back(std::move(b));
    }
    return std::make_unique<LayerCache>(spec, std::move(layers));
  }

 private:
  Capabilities caps_;
};

}  // namespace

std::unique_ptr<CacheProvider> make_layer_cache_provider() {
  return std::make_unique<LayerCacheProvider>();
}

}  // namespace kvcheck::engines
