// Scenario types: one saved, replayable run of the ring-addressed pool.
//
// A scenario is the cache configuration, the requests (each bound to a state
// id), the step list of docs/semantics.md "Steps", where row values come from, and optional
// expectations that replay checks. It is a plain value: JSON I/O lives in
// scenarios/scenario_json.hpp, and neither the model nor the implementations
// see these types (properties/ translates them).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "scenarios/step_kinds.hpp"
#include "support/formats.hpp"

namespace kvcheck::scenarios {

/// Stored row format: the one format type of support/formats.hpp, whose
/// table gives its names, row bytes and unit roundoff.
using Format = ElementFormat;
/// Window convention ("keys", "left", "off-by-one"), see model/visible.hpp.
enum class Convention : std::uint8_t { kKeys, kLeft, kOffByOne };
/// RoPE pairing ("none", "neox", "interleaved").
enum class RopeStyle : std::uint8_t { kNone, kNeox, kInterleaved };
// Order and StepKind: scenarios/step_kinds.hpp, the table of step kinds.

struct Rope {
  RopeStyle style = RopeStyle::kNone;
  std::int32_t rotary_dims = 0;  ///< even, <= head_dim
  double base = 10000.0;
  bool operator==(const Rope&) const = default;
};

/// One layer's own window, as Gemma-style interleaved models have them
/// (sliding layers and global, full-attention layers).
struct LayerWindow {
  std::optional<std::int64_t> window;  ///< window parameter; nullopt: a global layer (every position)
  Convention convention = Convention::kKeys;
  bool operator==(const LayerWindow&) const = default;
};

/// The pool configuration, one per layer: every layer has the same one but
/// its window, which `layer_windows` may give per layer.
struct CacheConfig {
  std::int64_t window = 8;  ///< window parameter, read with `convention`
  Convention convention = Convention::kKeys;
  std::int64_t ring_rows = 8;  ///< S, rows per state block
  std::int64_t states = 1;
  std::int32_t q_heads = 1;
  std::int32_t kv_heads = 1;
  std::int32_t head_dim = 4;
  bool shared_row = false;  ///< MLA-style shared key/value row
  Format format = Format::kF64;
  Rope rope;
  std::int32_t layers = 1;
  std::optional<double> softmax_scale;  ///< default 1/sqrt(head_dim)
  std::optional<double> sink_logit;     ///< attention-sink logit, if any
  /// Empty: every layer has `window` and `convention`. Else one entry per
  /// layer (JSON `layer_windows`; an entry without a window takes `window`,
  /// without a convention `window_convention`).
  std::vector<LayerWindow> layer_windows;
  /// A paged cache's pool in blocks per layer (JSON `pool_blocks`, written by
  /// `sweep` below a paged cache's minimum); absent: the pool kvcheck
  /// derives from ring_rows (engines::paged_pool_blocks). Other caches ignore it.
  std::optional<std::int64_t> pool_blocks;
  bool operator==(const CacheConfig&) const = default;
};

/// A shared prefix: a request starts from the first `positions` positions
/// of another request (live or finished) instead of writing them itself.
/// Its rows there are that request's rows as they were when it began (shared
/// with it, not rewritten); its length starts at `positions`.
struct Prefix {
  std::int64_t request = 0;    ///< the request whose rows it starts from
  std::int64_t positions = 0;  ///< n: positions 0 .. n-1 (1 <= n <= that request's committed length)
  bool operator==(const Prefix&) const = default;
};

/// A request and the state id it occupies while active.
struct Request {
  Request() = default;
  Request(std::int64_t id_, std::int64_t state_, std::optional<Prefix> prefix_ = std::nullopt)
      : id(id_), state(state_), prefix(prefix_) {}
  std::int64_t id = 0;
  std::int64_t state = 0;
  std::optional<Prefix> prefix;  ///< JSON "prefix", omitted when none
  bool operator==(const Request&) const = default;
};

/// One step. Which fields matter depends on `kind` (its StepFields in
/// scenarios/step_kinds.hpp): prefill: rows, order; verify: drafts; accept:
/// accepted; trim: positions.
struct Step {
  StepKind kind = StepKind::kDecode;
  std::int64_t request = 0;
  std::int64_t rows = 0;  ///< prefill chunk length (>= 1)
  Order order = Order::kLoadThenStore;
  std::int64_t drafts = 0;    ///< verify k (>= 0): k + 1 rows
  std::int64_t accepted = 0;  ///< accept a (0 <= a <= k of the pending verify)
  std::int64_t positions = 0;  ///< trim n (1 <= n <= the committed length)
  bool operator==(const Step&) const = default;
};

/// Explicit row values for one (layer, request, position), optionally for the
/// one step that writes them; any row not given is drawn from Data::seed.
/// k, v: [kv_heads * head_dim] (v empty for shared rows); q: [q_heads * head_dim].
/// A row with a step gives the content that step writes at the position (a
/// position written again after a rejected draft or a reset gets one row per
/// step); a row without one stands for every step that writes the position
/// and has no row of its own.
struct ExplicitRow {
  std::int32_t layer = 0;
  std::int64_t request = 0;
  std::int64_t position = 0;
  std::vector<double> k, v, q;
  std::optional<std::int64_t> step;  ///< index into Scenario::steps; nullopt: any step
  bool operator==(const ExplicitRow&) const = default;
};

/// How rows without explicit values are drawn from the seed
/// (properties/value_profiles.hpp): "uniform" elements in [-1, 1), or the
/// profiles where numerics break.
enum class ValueProfile : std::uint8_t {
  kUniform,      ///< k, v, q uniform in [-1, 1)
  kLargeLogits,  ///< q and k scaled so logits reach ~1e3 and their peak moves with the position
  kFp8Outliers,  ///< one outlier element per 32-element block, and whole outlier rows
  kPositionCode,  ///< q = 0 and values coding each row's position and write (properties/position_code.hpp)
};

struct Data {
  std::uint64_t seed = 0;
  ValueProfile profile = ValueProfile::kUniform;  ///< JSON "profile", omitted when uniform
  std::vector<ExplicitRow> rows;
  bool operator==(const Data&) const = default;
};

/// Expected per-query overwritten-visible-row counts of one step.
struct OverwriteExpectation {
  std::int64_t step = 0;             ///< index into Scenario::steps
  std::vector<std::int64_t> counts;  ///< one per query of that step
  bool operator==(const OverwriteExpectation&) const = default;
};

/// What replay checks. Without an `expect` block a scenario expects no lost
/// row, no collision and outputs within the format's tolerance.
struct Expectations {
  std::vector<OverwriteExpectation> overwritten;
  std::optional<std::int64_t> collisions;  ///< total slot collisions
  std::optional<double> output_tolerance;  ///< max abs output difference allowed
  bool operator==(const Expectations&) const = default;
};

struct Scenario {
  static constexpr int kSchemaVersion = 1;
  std::string name;
  std::string description;
  CacheConfig cache;
  Data data;
  std::vector<Request> requests;
  std::vector<Step> steps;
  std::optional<Expectations> expect;
  bool operator==(const Scenario&) const = default;
};

/// Keys a query sees under the cache's window convention, itself included
/// (keys: W; left and off-by-one: W + 1). The reference model derives the
/// same number on its own (model/visible.hpp).
constexpr std::int64_t declared_window_keys(const CacheConfig& c) noexcept {
  return c.convention == Convention::kKeys ? c.window : c.window + 1;
}

/// Keys a query of a global layer sees, standing for "every position": no
/// position reaches it (positions are below kMaxRows, scenario_json.hpp), and
/// arithmetic on it (keys + a step's rows) cannot overflow.
inline constexpr std::int64_t kGlobalWindowKeys = std::int64_t{1} << 41;

/// Keys a query of `layer` sees, itself included: its own window when the
/// cache lists layer windows, else the cache's (kGlobalWindowKeys for a
/// global layer). The reference model derives the same on its own.
constexpr std::int64_t layer_window_keys(const CacheConfig& c, std::int32_t layer) noexcept {
  if (c.layer_windows.empty() || layer < 0 || static_cast<std::size_t>(layer) >= c.layer_windows.size())
    return declared_window_keys(c);
  const LayerWindow& w = c.layer_windows[static_cast<std::size_t>(layer)];
  if (!w.window) return kGlobalWindowKeys;
  return w.convention == Convention::kKeys ? *w.window : *w.window + 1;
}

/// Whether any layer of the cache is global (attends to every position).
constexpr bool has_global_layer(const CacheConfig& c) noexcept {
  for (const LayerWindow& w : c.layer_windows)
    if (!w.window) return true;
  return false;
}

/// The widest window of a sliding layer, in keys (the cache's window when it
/// lists none; kGlobalWindowKeys only when every layer is global).
constexpr std::int64_t widest_sliding_window_keys(const CacheConfig& c) noexcept {
  if (c.layer_windows.empty()) return declared_window_keys(c);
  std::int64_t widest = 0;
  for (std::int32_t l = 0; l < static_cast<std::int32_t>(c.layer_windows.size()); ++l) {
    if (c.layer_windows[static_cast<std::size_t>(l)].window) widest = std::max(widest, layer_window_keys(c, l));
  }
  return widest > 0 ? widest : kGlobalWindowKeys;
}

/// Rows a step writes (and queries it runs): prefill n, decode 1, verify k+1, else 0.
constexpr std::int64_t step_rows(const Step& s) noexcept { return step_kind_rows(s.kind, s.rows, s.drafts); }

}  // namespace kvcheck::scenarios
