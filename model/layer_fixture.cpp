#include "model/layer_fixture.hpp"

namespace kvcheck::model {

namespace {

Row<Real> apply(const std::vector<Row<Real>>& w, const Row<Real>& x) {
  Row<Real> y(w.size(), Real(0));
  for (std::size_t i = 0; i < w.size(); ++i) {
    for (std::size_t j = 0; j < x.size(); ++j) y[i] += w[i][j] * x[j];
  }
  return y;
}

Row<Real> rotate_heads(Row<Real> flat, const LayerModel<Real>& layer, std::int64_t position) {
  Row<Real> out;
  for (std::int32_t h = 0; h < layer.heads.q_heads; ++h) {
    Row<Real> head = head_slice(flat, h, layer.heads.head_dim);
    rope_rotate(head, position, layer.rope);
    out.insert(out.end(), head.begin(), head.end());
  }
  return out;
}

std::vector<double> to_doubles(const Row<Real>& row) {
  std::vector<double> out;
  for (const Real& x : row) out.push_back(to_double(x));
  return out;
}

}  // namespace

LayerModel<Real> seed_layer_fixture() {
  LayerModel<Real> layer;
  layer.model_width = 4;
  layer.heads = Heads{2, 2, 2, false};
  layer.rope = Rope{RopeStyle::kInterleaved, 2, 10000.0};
  const auto identity = [] {
    std::vector<Row<Real>> m(4, Row<Real>(4, Real(0)));
    for (std::size_t i = 0; i < 4; ++i) m[i][i] = 1;
    return m;
  }();
  layer.wq = layer.wk = layer.wv = identity;
  layer.wo = std::vector<Row<Real>>(4, Row<Real>(4, Real(0)));
  layer.wo[0][2] = layer.wo[1][3] = layer.wo[2][0] = layer.wo[3][1] = 1;
  layer.inputs = {
      {Real(1), Real(0), Real(1), Real(0)},
      {cos(Real(1)), -sin(Real(1)), Real(0), Real(1)},
      {cos(Real(2)), -sin(Real(2)), Real(1), Real(1)},
  };
  return layer;
}

LayerEvidence run_layer_fixture(const LayerModel<Real>& layer) {
  const Projector<Real> project = [&layer](std::int64_t p) {
    const Row<Real>& x = layer.inputs[static_cast<std::size_t>(p)];
    Projected<Real> row;
    row.q = rotate_heads(apply(layer.wq, x), layer, p);
    row.k = rotate_heads(apply(layer.wk, x), layer, p);
    row.v = apply(layer.wv, x);
    return row;
  };
  const Window causal{};
  const Real scale = 1 / sqrt(Real(layer.heads.head_dim));
  const auto n = static_cast<std::int64_t>(layer.inputs.size());
  const auto full = full_prefix_path<Real>(n, project, layer.heads, causal, scale);
  const auto inc = incremental_path<Real>(n, project, layer.heads, causal, scale);

  LayerEvidence evidence;
  evidence.full_prefix_rows = full.counts.projected_rows;
  evidence.incremental_rows = inc.counts.projected_rows;
  evidence.reused_rows = full.counts.projected_rows - inc.counts.projected_rows;
  std::vector<Projected<Real>> rows;
  for (std::int64_t t = 0; t < n; ++t) {
    rows.push_back(project(t));
    LayerStep step;
    const Row<Real> cached = apply(layer.wo, inc.outputs[static_cast<std::size_t>(t)].back());
    const Row<Real> recomputed = apply(layer.wo, full.outputs[static_cast<std::size_t>(t)].back());
    step.cached_output = to_doubles(cached);
    step.full_output = to_doubles(recomputed);
    for (std::size_t d = 0; d < cached.size(); ++d) {
      step.max_abs_difference =
          std::max(step.max_abs_difference, to_double(Real(abs(cached[d] - recomputed[d]))));
    }
    for (std::int32_t h = 0; h < layer.heads.q_heads; ++h) {
      std::vector<Row<Real>> keys, values;
      for (const auto& r : rows) {
        keys.push_back(head_slice(r.k, h, layer.heads.head_dim));
        values.push_back(head_slice(r.v, h, layer.heads.head_dim));
      }
      std::vector<Real> weights;
      attend(head_slice(rows.back().q, h, layer.heads.head_dim), keys, values, scale, std::nullopt, &weights);
      step.weights.push_back(to_doubles(weights));
      step.keys.push_back(to_doubles(keys.back()));
      step.values.push_back(to_doubles(values.back()));
    }
    evidence.steps.push_back(std::move(step));
  }
  return evidence;
}

}  // namespace kvcheck::model
