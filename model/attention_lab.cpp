#include "model/attention_lab.hpp"

#include <boost/multiprecision/mpfr.hpp>

namespace kvcheck::model {

std::vector<std::pair<std::int64_t, std::int64_t>> lab_inputs() {
  return {{1, 0}, {0, 1}, {1, 1}, {2, 0}, {0, 2}};
}

LabRun run_attention_lab(std::optional<std::int64_t> window_keys) {
  const auto inputs = lab_inputs();
  const Projector<Real> project = [&inputs](std::int64_t p) {
    const auto [a, b] = inputs[static_cast<std::size_t>(p)];
    Projected<Real> row;
    row.q = {Real(a), Real(b)};
    row.k = {Real(a - b), Real(a + b)};
    row.v = {Real(a + 2 * b), Real(2 * a - b)};
    return row;
  };
  const Heads heads{1, 1, 2, false};
  const Window window{window_keys, WindowConvention::kKeys};
  const Real scale = 1 / sqrt(Real(2));
  const auto n = static_cast<std::int64_t>(inputs.size());
  const auto full = full_prefix_path<Real>(n, project, heads, window, scale);
  const auto inc = incremental_path<Real>(n, project, heads, window, scale);
  LabRun run;
  run.recompute = full.counts;
  run.cache = inc.counts;
  for (const Real& x : inc.outputs.back().back()) run.last_output.push_back(to_double(x));
  const auto [abs_diff, rel_diff] = newest_output_difference(inc, full);
  run.max_abs_difference = to_double(abs_diff);
  run.max_rel_difference = to_double(rel_diff);
  return run;
}

}  // namespace kvcheck::model
