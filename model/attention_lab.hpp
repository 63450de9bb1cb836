// The seed's attention lab (docs/semantics.md "Golden values"): five 2-vectors, query (a,b), key
// (a-b, a+b), value (a+2b, 2a-b), scale 1/sqrt(2), run through the
// full-prefix and incremental paths with and without a window.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "model/paths.hpp"
#include "model/real.hpp"

namespace kvcheck::model {

/// One lab run: counts of both paths and the newest outputs.
struct LabRun {
  PathCounts recompute;
  PathCounts cache;
  std::vector<double> last_output;  ///< newest output of the full sequence (cached path)
  double max_abs_difference = 0;    ///< cached vs recomputed, newest query of every prefix
  double max_rel_difference = 0;
};

/// The lab's five inputs.
std::vector<std::pair<std::int64_t, std::int64_t>> lab_inputs();

/// Runs the lab at the default precision; `window_keys` nullopt = full causal.
LabRun run_attention_lab(std::optional<std::int64_t> window_keys);

}  // namespace kvcheck::model
