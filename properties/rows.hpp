// Row values of a scenario: explicit rows where the scenario gives them,
// otherwise drawn from the scenario's seed with the project PRNG, one stream
// per (layer, request, position, step), so a position rewritten by a later
// step (after a rejected draft or a reset) gets new content.
#pragma once

#include <cstdint>
#include <vector>

#include "scenarios/scenario.hpp"

namespace kvcheck::properties {

/// Rows of one step: k, v [n, kv_heads * head_dim] (v empty for shared
/// rows), q [n, q_heads * head_dim].
struct RowSet {
  std::vector<double> k, v, q;
};

/// Rows for positions first..first+n-1 of `request` on `layer`, written by
/// step `step_index`.
RowSet make_rows(const scenarios::Scenario& scenario, std::int32_t layer, std::int64_t request,
                 std::int64_t first, std::int64_t n, std::int64_t step_index);

}  // namespace kvcheck::properties
