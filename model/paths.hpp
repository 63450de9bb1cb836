// Two ways to compute the same outputs, so the model itself can show the
// docs/semantics.md's row and pair counts: the full-prefix path recomputes every prefix
// from scratch (the recompute baseline), the incremental path projects one
// new row per position and retains keys and values (the cache).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "model/attention.hpp"
#include "model/visible.hpp"

namespace kvcheck::model {

/// Work counted by one path.
struct PathCounts {
  std::int64_t projected_rows = 0;  ///< input rows projected (per Q, K or V projection)
  std::int64_t pairs = 0;           ///< query/key position pairs scored
  std::int64_t retained_rows = 0;   ///< K/V rows held after the last position
};

/// Outputs of every query of every prefix: outputs[n - 1][i] is query i's
/// output in the prefix of length n (the incremental path fills only the
/// newest query of each prefix: outputs[n - 1] has one row, for i = n - 1).
template <class R>
struct PathResult {
  std::vector<std::vector<Row<R>>> outputs;
  PathCounts counts;
};

/// Projects input position p (query, rotated key, value). Must be a pure
/// function of p: both paths call it.
template <class R>
using Projector = std::function<Projected<R>(std::int64_t position)>;

/// Full-prefix (recompute) path over positions 0..n-1.
template <class R>
PathResult<R> full_prefix_path(std::int64_t n, const Projector<R>& project, const Heads& heads,
                               const Window& window, const R& scale,
                               const std::optional<std::type_identity_t<R>>& sink = std::nullopt) {
  PathResult<R> result;
  for (std::int64_t len = 1; len <= n; ++len) {
    std::vector<Projected<R>> rows;
    rows.reserve(static_cast<std::size_t>(len));
    for (std::int64_t p = 0; p < len; ++p) rows.push_back(project(p));
    result.counts.projected_rows += len;
    auto& outs = result.outputs.emplace_back();
    for (std::int64_t i = 0; i < len; ++i) {
      const PositionRange visible = visible_range(i, window);
      std::vector<const Projected<R>*> seen;
      for (std::int64_t j = visible.first; j <= visible.last; ++j) {
        seen.push_back(&rows[static_cast<std::size_t>(j)]);
      }
      result.counts.pairs += visible.count();
      outs.push_back(attend_heads(rows[static_cast<std::size_t>(i)].q, seen, heads, scale, sink));
    }
    result.counts.retained_rows = len;
  }
  return result;
}

/// Incremental (cached) path: one projection per position; keys and values
/// retained, trimmed to the window's last W rows as the seed's lab does.
template <class R>
PathResult<R> incremental_path(std::int64_t n, const Projector<R>& project, const Heads& heads,
                               const Window& window, const R& scale,
                               const std::optional<std::type_identity_t<R>>& sink = std::nullopt) {
  PathResult<R> result;
  std::vector<Projected<R>> cache;
  const auto keys = window.keys();
  for (std::int64_t p = 0; p < n; ++p) {
    cache.push_back(project(p));
    result.counts.projected_rows += 1;
    if (keys && static_cast<std::int64_t>(cache.size()) > *keys) cache.erase(cache.begin());
    std::vector<const Projected<R>*> seen;
    for (const auto& row : cache) seen.push_back(&row);
    result.counts.pairs += static_cast<std::int64_t>(cache.size());
    result.outputs.push_back({attend_heads(cache.back().q, seen, heads, scale, sink)});
  }
  result.counts.retained_rows = static_cast<std::int64_t>(cache.size());
  return result;
}

/// Largest |a - b| / max(|b|, tiny) and largest |a - b| over the newest
/// query of every prefix, comparing an incremental against a full-prefix result.
template <class R>
std::pair<R, R> newest_output_difference(const PathResult<R>& incremental, const PathResult<R>& full) {
  using std::abs;
  R max_abs = 0;
  R max_rel = 0;
  for (std::size_t n = 0; n < full.outputs.size(); ++n) {
    const Row<R>& a = incremental.outputs[n].back();
    const Row<R>& b = full.outputs[n].back();
    for (std::size_t d = 0; d < a.size(); ++d) {
      const R diff = abs(a[d] - b[d]);
      if (diff > max_abs) max_abs = diff;
      const R mag = abs(b[d]);
      if (mag > 0 && diff / mag > max_rel) max_rel = diff / mag;
    }
  }
  return {max_abs, max_rel};
}

}  // namespace kvcheck::model
