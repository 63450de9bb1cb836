// The layer-bound cache fixture of seed 000 (docs/semantics.md "Golden values", last paragraph),
// reconstructed from the rows the seed prints: D = 4, H = 2, d_h = 2,
// Wq = Wk = Wv = I, Wo swaps the two heads' halves, RoPE angle = position
// radians on each 2-wide head, inputs x0 = (1,0,1,0), x1 = (cos 1, -sin 1, 0, 1),
// x2 = (cos 2, -sin 2, 1, 1). The printed rotated keys (head 0 always (1,0);
// head 1 (1,0), (-sin 1, cos 1), rot2(1,1)), unrotated values, and weights
// (0.5/0.5, 0.2138/0.7862, 1/3 each, 0.0547/0.3710/0.5743) are reproduced by
// exactly these choices; tests check the keys, values and weights too.
#pragma once

#include <cstdint>
#include <vector>

#include "model/paths.hpp"
#include "model/real.hpp"

namespace kvcheck::model {

/// A linear multi-head attention layer in the model's own layout.
template <class R>
struct LayerModel {
  std::int32_t model_width = 0;
  Heads heads;
  Rope rope;
  std::vector<Row<R>> wq, wk, wv, wo;  ///< [model_width][model_width], y = W x
  std::vector<Row<R>> inputs;          ///< [positions][model_width]
};

/// Newest-position evidence of one append.
struct LayerStep {
  std::vector<double> cached_output;
  std::vector<double> full_output;
  double max_abs_difference = 0;
  std::vector<std::vector<double>> weights;  ///< [head][retained rows] of the newest query
  std::vector<std::vector<double>> keys;     ///< [head][d_h] rotated key appended
  std::vector<std::vector<double>> values;   ///< [head][d_h] value appended
};

/// All evidence of the three-append fixture.
struct LayerEvidence {
  std::vector<LayerStep> steps;
  std::int64_t full_prefix_rows = 0;  ///< 1 + 2 + 3
  std::int64_t incremental_rows = 0;  ///< 1 + 1 + 1
  std::int64_t reused_rows = 0;       ///< full - incremental
};

/// The reconstructed seed-000 layer.
LayerModel<Real> seed_layer_fixture();

/// Runs full-prefix and incremental paths over the fixture's inputs.
LayerEvidence run_layer_fixture(const LayerModel<Real>& layer);

}  // namespace kvcheck::model
