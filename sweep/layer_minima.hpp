// Per-layer minima: for a scenario whose layers have their own windows
// (cache.layer_windows), the smallest capacity at which its sliding layers
// lose no visible row, and the smallest at which its global layers lose
// none, found apart, as an iSWA cache sizes its two caches (llama.cpp keeps
// one cache for the sliding layers and one for the full-attention layers).
//
// Found by running the scenario at each capacity through the one judge
// (properties::run_scenario, the composition `check` and `replay` run) on
// the cache named by the options, and reading each layer's lost rows; the
// formulas are reported beside the minima, never used to find them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "properties/runner.hpp"
#include "scenarios/scenario.hpp"

namespace kvcheck::sweep {

/// What `layer_minima` found for one scenario.
struct LayerMinima {
  std::string scenario;
  std::vector<std::int32_t> sliding_layers;  ///< layer indices
  std::vector<std::int32_t> global_layers;
  /// Smallest capacity from which on (up to `searched_to`) no layer of the
  /// class loses a row; 0: the class has no layer; -1: none up to searched_to.
  std::int64_t sliding_min = 0, global_min = 0;
  /// The safe capacity formulas: max over the sliding layers' windows W of
  /// max(W + k, W + C - 1) (store_then_load chunks C) or max(W + k, C)
  /// (load_then_store), k the most drafts of a verify; a global layer needs
  /// H, the highest position written plus one.
  std::int64_t sliding_formula = 0, global_formula = 0;
  std::int64_t searched_to = 0;  ///< capacities 1 .. searched_to were run
  std::int64_t runs = 0;
};

/// Runs `scenario` at every capacity 1 .. 2 * max(formulas) + 2 (its
/// ring_rows replaced) on the cache of `options`; throws kvcheck::Error
/// (kUsage, "--layers-of") when the scenario lists no layer windows.
LayerMinima layer_minima(const scenarios::Scenario& scenario, const properties::RunOptions& options);

/// Two lines, one per class: layers, minimum, formula, agreement.
std::string layer_minima_text(const LayerMinima& minima);

}  // namespace kvcheck::sweep
