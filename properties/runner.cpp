#include "properties/runner.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <utility>

#include "impl/ring_pool.hpp"
#include "model/address.hpp"
#include "model/attention.hpp"
#include "model/real.hpp"
#include "model/visible.hpp"
#include "properties/rows.hpp"
#include "support/assert.hpp"
#include "support/error.hpp"

namespace kvcheck::properties {

namespace {

using scenarios::Scenario;
using scenarios::StepKind;

model::WindowConvention to_model(scenarios::Convention c) {
  switch (c) {
    case scenarios::Convention::kKeys: return model::WindowConvention::kKeys;
    case scenarios::Convention::kLeft: return model::WindowConvention::kLeft;
    case scenarios::Convention::kOffByOne: return model::WindowConvention::kOffByOne;
  }
  return model::WindowConvention::kKeys;
}

impl::ElementFormat to_impl(scenarios::Format f) {
  switch (f) {
    case scenarios::Format::kF64: return impl::ElementFormat::kF64;
    case scenarios::Format::kF32: return impl::ElementFormat::kF32;
    case scenarios::Format::kBf16: return impl::ElementFormat::kBf16;
    case scenarios::Format::kFp8: return impl::ElementFormat::kFp8E4m3;
  }
  return impl::ElementFormat::kF64;
}

impl::RopeStyle to_impl(scenarios::RopeStyle s) {
  switch (s) {
    case scenarios::RopeStyle::kNone: return impl::RopeStyle::kNone;
    case scenarios::RopeStyle::kNeox: return impl::RopeStyle::kNeox;
    case scenarios::RopeStyle::kInterleaved: return impl::RopeStyle::kInterleaved;
  }
  return impl::RopeStyle::kNone;
}

model::RopeStyle to_model(scenarios::RopeStyle s) {
  switch (s) {
    case scenarios::RopeStyle::kNone: return model::RopeStyle::kNone;
    case scenarios::RopeStyle::kNeox: return model::RopeStyle::kNeox;
    case scenarios::RopeStyle::kInterleaved: return model::RopeStyle::kInterleaved;
  }
  return model::RopeStyle::kNone;
}

const char* kind_name(StepKind kind) {
  switch (kind) {
    case StepKind::kPrefill: return "prefill";
    case StepKind::kDecode: return "decode";
    case StepKind::kVerify: return "verify";
    case StepKind::kAccept: return "accept";
    case StepKind::kFinish: return "finish";
    case StepKind::kReset: return "reset";
  }
  return "?";
}

/// The model's truth for one written row: exact rotated key and value, and
/// the same rows rounded through the element format (what the cache holds).
template <class R>
struct TruthRow {
  model::Projected<R> exact;
  model::Projected<R> dequantized;
};

using RowKey = std::pair<std::int64_t, std::int64_t>;  // (request, position)

/// Everything the model keeps for one layer.
template <class R>
struct LayerTruth {
  explicit LayerTruth(const model::Ring& ring) : oracle(ring) {}
  model::SlotOracle oracle;
  std::map<RowKey, TruthRow<R>> rows;
  std::map<RowKey, std::uint64_t> latest_seq;
  std::unique_ptr<impl::RingPool> pool;
};

struct RequestState {
  std::int64_t state = 0;
  bool begun = false;
  bool finished = false;
  std::int64_t length = 0;
  std::int64_t pending_first = -1;  // logical length when the pending verify ran
};

/// Accumulation precision of the production kernels per format.
double accumulation_epsilon(impl::ElementFormat f) {
  return f == impl::ElementFormat::kF64 ? 0x1.0p-53 : 0x1.0p-24;
}

template <class R>
model::Row<R> to_real(const double* x, std::int64_t n) {
  model::Row<R> r;
  r.reserve(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) r.emplace_back(x[i]);
  return r;
}

template <class R>
void rotate_heads(model::Row<R>& flat, std::int32_t heads, std::int32_t head_dim,
                  std::int64_t position, const model::Rope& rope) {
  for (std::int32_t h = 0; h < heads; ++h) {
    model::Row<R> slice = model::head_slice(flat, h, head_dim);
    model::rope_rotate(slice, position, rope);
    std::copy(slice.begin(), slice.end(), flat.begin() + static_cast<std::ptrdiff_t>(h) * head_dim);
  }
}

std::string fmt_g(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}

template <class R>
model::Row<R> round_trip(impl::ElementFormat f, const model::Row<R>& row) {
  std::vector<double> in, out(row.size());
  in.reserve(row.size());
  for (const R& x : row) in.push_back(model::to_double(x));
  impl::format_round_trip(f, in.data(), out.data(), static_cast<std::int64_t>(in.size()));
  return to_real<R>(out.data(), static_cast<std::int64_t>(out.size()));
}

}  // namespace

namespace {
template <class Real>
RunObservation run_with(const Scenario& sc, const RunOptions& options);
}  // namespace

RunObservation run_scenario(const Scenario& sc, const RunOptions& options) {
  switch (options.precision_bits) {
    case 53: return run_with<double>(sc, options);
    case 113: return run_with<model::Real>(sc, options);
    case 169: return run_with<model::Real50>(sc, options);
    default:
      throw Error(ErrorId::kUsage, "--precision",
                  "reference precision must be 53, 113 or 169 bits, got " +
                      std::to_string(options.precision_bits));
  }
}

std::int64_t window_keys(const scenarios::CacheConfig& cache) {
  const model::Window w{cache.window, to_model(cache.convention)};
  return *w.keys();
}

impl::PoolSpec pool_spec(const Scenario& scenario, impl::Fault fault) {
  const auto& c = scenario.cache;
  impl::PoolSpec spec;
  spec.states = c.states;
  spec.ring_rows = c.ring_rows;
  spec.window_rows = window_keys(c);
  spec.q_heads = c.q_heads;
  spec.kv_heads = c.kv_heads;
  spec.head_dim = c.head_dim;
  spec.shared_row = c.shared_row;
  spec.format = to_impl(c.format);
  spec.rope_style = to_impl(c.rope.style);
  spec.rope_dims = c.rope.rotary_dims;
  spec.rope_base = c.rope.base;
  spec.softmax_scale = c.softmax_scale.value_or(0.0);
  spec.has_sink = c.sink_logit.has_value();
  spec.sink_logit = c.sink_logit.value_or(0.0);
  std::int64_t most = 1;
  for (const auto& s : scenario.steps) most = std::max(most, scenarios::step_rows(s));
  spec.max_step_rows = most;
  spec.track_tags = true;
  spec.fault = fault;
  return spec;
}

namespace {

template <class Real>
RunObservation run_with(const Scenario& sc, const RunOptions& options) {
  const auto& cache = sc.cache;
  const impl::PoolSpec spec = pool_spec(sc, options.fault);
  const std::int64_t keys = spec.window_rows;
  const model::Window window{cache.window, to_model(cache.convention)};
  const model::Ring ring{cache.states, cache.ring_rows, keys};
  const model::Heads heads{cache.q_heads, cache.kv_heads, cache.head_dim, cache.shared_row};
  const model::Rope rope{to_model(cache.rope.style), cache.rope.rotary_dims, cache.rope.base};
  using std::sqrt;
  const Real scale = cache.softmax_scale ? Real(*cache.softmax_scale)
                                         : Real(1) / sqrt(Real(cache.head_dim));
  const std::optional<Real> sink =
      cache.sink_logit ? std::optional<Real>(Real(*cache.sink_logit)) : std::nullopt;
  const std::int64_t kv_width = static_cast<std::int64_t>(cache.kv_heads) * cache.head_dim;
  const std::int64_t q_width = static_cast<std::int64_t>(cache.q_heads) * cache.head_dim;

  RunObservation run;
  run.scenario_name = sc.name;
  run.backend = options.backend;
  run.fault = std::string(impl::fault_name(options.fault));
  run.window_convention = std::string(model::convention_name(window.convention));
  run.window_keys = keys;
  run.ring_rows = cache.ring_rows;
  run.format = std::string(impl::format_name(spec.format));
  run.precision_bits = model::real_bits<Real>();

  const double format_eps = impl::format_epsilon(spec.format);
  const double accum_eps = accumulation_epsilon(spec.format);

  std::vector<LayerTruth<Real>> layers;
  layers.reserve(static_cast<std::size_t>(cache.layers));
  for (std::int32_t l = 0; l < cache.layers; ++l) {
    LayerTruth<Real>& truth = layers.emplace_back(ring);
    std::string why;
    auto backend = impl::make_backend(options.backend, &why);
    if (!backend) throw Error(ErrorId::kDevice, "--impl", why);
    const impl::Status st = impl::RingPool::create(std::move(backend), spec, &truth.pool);
    if (!st.ok()) {
      const ErrorId id = st.code == impl::CacheError::kNoDevice ? ErrorId::kDevice : ErrorId::kSize;
      throw Error(id, st.code == impl::CacheError::kNoDevice ? "--impl" : "cache",
                  std::string(impl::cache_error_name(st.code)) + ": " + st.detail);
    }
  }

  std::map<std::int64_t, RequestState> requests;
  for (const auto& r : sc.requests) requests[r.id].state = r.state;

  auto fail = [&run](const std::string& why) {
    if (run.passed) run.first_failure = why;
    run.passed = false;
  };

  for (std::size_t step_index = 0; step_index < sc.steps.size(); ++step_index) {
    const auto& step = sc.steps[step_index];
    RequestState& req = requests.at(step.request);
    const std::int64_t n = scenarios::step_rows(step);
    bool stop = false;

    for (std::int32_t l = 0; l < cache.layers && !stop; ++l) {
      LayerTruth<Real>& truth = layers[static_cast<std::size_t>(l)];
      impl::RingPool& pool = *truth.pool;
      if (!req.begun) {
        const impl::Status st = pool.begin(req.state, step.request);
        if (!st.ok()) {
          fail("step " + std::to_string(step_index) + ": begin refused: " + st.detail);
          stop = true;
          break;
        }
      }
      if (n == 0) {
        impl::Status st;
        if (step.kind == StepKind::kAccept) st = pool.accept(req.state, step.accepted);
        if (step.kind == StepKind::kFinish) st = pool.finish(req.state);
        if (step.kind == StepKind::kReset) st = pool.reset(req.state);
        if (!st.ok()) {
          fail("step " + std::to_string(step_index) + " (" + kind_name(step.kind) +
               "): refused: " + std::string(impl::cache_error_name(st.code)) + " " + st.detail);
          stop = true;
        }
        continue;
      }

      // Rows of this step (the same on model and implementation).
      const RowSet rows = make_rows(sc, l, step.request, req.length, n, static_cast<std::int64_t>(step_index));
      impl::StepRows in{rows.k.data(), cache.shared_row ? nullptr : rows.v.data(), rows.q.data()};
      impl::StepResult result;
      impl::Status st;
      switch (step.kind) {
        case StepKind::kPrefill:
          st = pool.prefill(req.state, n, in,
                            step.order == scenarios::Order::kLoadThenStore
                                ? impl::PrefillOrder::kLoadThenStore
                                : impl::PrefillOrder::kStoreThenLoad,
                            &result);
          break;
        case StepKind::kDecode: st = pool.decode(req.state, in, &result); break;
        case StepKind::kVerify: st = pool.verify(req.state, step.drafts, in, &result); break;
        default: break;
      }

      StepObservation obs;
      obs.step = static_cast<std::int64_t>(step_index);
      obs.layer = l;
      obs.kind = kind_name(step.kind);
      if (step.kind == StepKind::kPrefill) {
        obs.order = step.order == scenarios::Order::kLoadThenStore ? "load_then_store"
                                                                   : "store_then_load";
      }
      obs.request = step.request;
      obs.state = req.state;
      obs.first_position = req.length;
      if (!st.ok()) {
        obs.error = std::string(impl::cache_error_name(st.code)) + ": " + st.detail;
        fail("step " + std::to_string(step_index) + " (" + obs.kind + "): implementation refused: " +
             obs.error);
        run.steps.push_back(std::move(obs));
        stop = true;
        break;
      }

      // Model: apply the writes, remember each row's exact and cached values.
      const std::int64_t first = req.length;
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t p = first + i;
        truth.oracle.write(req.state, step.request, p);
        const std::int64_t slot = model::slot_of(req.state, p, cache.ring_rows);
        truth.latest_seq[{step.request, p}] = truth.oracle.at(slot).write_seq;
        TruthRow<Real> row;
        row.exact.k = to_real<Real>(rows.k.data() + i * kv_width, kv_width);
        rotate_heads(row.exact.k, cache.kv_heads, cache.head_dim, p, rope);
        if (!cache.shared_row) row.exact.v = to_real<Real>(rows.v.data() + i * kv_width, kv_width);
        row.dequantized.k = round_trip(spec.format, row.exact.k);
        if (!cache.shared_row) row.dequantized.v = round_trip(spec.format, row.exact.v);
        truth.rows[{step.request, p}] = std::move(row);
      }

      // Collisions, from the implementation's own write records.
      const std::int64_t block_first = req.state * cache.ring_rows;
      std::map<std::int64_t, int> written;
      for (const auto& w : result.writes) {
        obs.written_slots.push_back(w.slot);
        if (++written[w.slot] == 2) ++obs.collisions.same_step;
        if (w.slot < block_first || w.slot >= block_first + cache.ring_rows) {
          ++obs.collisions.outside_block;
        }
        if (result.source == impl::KvSource::kPool && w.replaced.request == step.request &&
            w.replaced.position < first) {
          const auto live = truth.latest_seq.find({step.request, w.replaced.position});
          const bool is_live = live != truth.latest_seq.end() && live->second == w.replaced.write_seq;
          bool needed = false;
          for (std::int64_t i = 0; i < n && !needed; ++i) {
            needed = model::visible_range(first + i, window).contains(w.replaced.position);
          }
          if (is_live && needed) ++obs.collisions.replaced_needed;
        }
      }
      obs.collisions.same_step = std::max(obs.collisions.same_step, result.duplicate_slots);

      // Reads and outputs, query by query.
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t p = first + i;
        const model::PositionRange visible = model::visible_range(p, window);
        QueryObservation q;
        q.position = p;
        q.visible_first = visible.first;
        std::vector<ReadTag> reads;
        for (std::int64_t c = 0; c < result.width; ++c) {
          const std::int64_t slot = result.read_slots[static_cast<std::size_t>(i * result.width + c)];
          if (slot < 0) continue;
          const impl::Tag& t = result.read_tags[static_cast<std::size_t>(i * result.width + c)];
          reads.push_back(ReadTag{slot, t.request, t.position, t.write_seq});
        }
        std::vector<bool> used(reads.size(), false);
        auto claim = [&](auto&& match) {
          for (std::size_t c = 0; c < reads.size(); ++c) {
            if (!used[c] && match(reads[c])) {
              used[c] = true;
              return true;
            }
          }
          return false;
        };
        std::vector<std::int64_t> unmatched;
        for (std::int64_t j = visible.first; j <= visible.last; ++j) {
          const std::uint64_t seq = truth.latest_seq.at({step.request, j});
          const bool ok = claim([&](const ReadTag& r) {
            return r.request == step.request && r.position == j && r.write_seq == seq;
          });
          if (!ok) unmatched.push_back(j);
        }
        for (const std::int64_t j : unmatched) {
          const std::int64_t slot = model::slot_of(req.state, j, cache.ring_rows);
          const bool stale = claim([&](const ReadTag& r) {
            return r.request == step.request && r.position == j;
          });
          if (stale || claim([&](const ReadTag& r) { return r.slot == slot; })) {
            q.overwritten.push_back(j);
          } else {
            q.missing.push_back(j);
          }
        }
        for (std::size_t c = 0; c < reads.size(); ++c) {
          if (!used[c]) q.extra.push_back(reads[c]);
        }
        if (options.record_reads) q.reads = std::move(reads);

        if (options.check_outputs) {
          model::Row<Real> query = to_real<Real>(rows.q.data() + i * q_width, q_width);
          rotate_heads(query, cache.q_heads, cache.head_dim, p, rope);
          std::vector<const model::Projected<Real>*> exact, deq;
          double vmax = 0;
          for (std::int64_t j = visible.first; j <= visible.last; ++j) {
            const TruthRow<Real>& row = truth.rows.at({step.request, j});
            exact.push_back(&row.exact);
            deq.push_back(&row.dequantized);
            for (const Real& x : cache.shared_row ? row.dequantized.k : row.dequantized.v) {
              vmax = std::max(vmax, std::fabs(model::to_double(x)));
            }
          }
          const auto ref = model::attend_heads(query, deq, heads, scale, sink);
          const auto ref_exact = model::attend_heads(query, exact, heads, scale, sink);
          const double* out = result.out.data() + i * q_width;
          for (std::int64_t d = 0; d < q_width; ++d) {
            const double r = model::to_double(ref[static_cast<std::size_t>(d)]);
            const double diff = std::fabs(out[d] - r);
            q.abs_diff = std::max(q.abs_diff, diff);
            q.rel_diff = std::max(q.rel_diff, diff / std::max(std::fabs(r), 1e-30));
            q.quant_abs_diff = std::max(
                q.quant_abs_diff,
                std::fabs(out[d] - model::to_double(ref_exact[static_cast<std::size_t>(d)])));
            if (!std::isfinite(out[d])) q.abs_diff = std::numeric_limits<double>::infinity();
          }
          q.eps_units = q.abs_diff / format_eps;
          // Kernel error bound: accumulation rounding over the visible rows and
          // the head width, scaled by the largest value the mixture can reach.
          q.tolerance = sc.expect && sc.expect->output_tolerance
                            ? *sc.expect->output_tolerance
                            : 16.0 * accum_eps * static_cast<double>(keys + cache.head_dim) *
                                  std::max(1.0, vmax);
          const bool reads_correct = q.overwritten.empty() && q.missing.empty() && q.extra.empty();
          q.output_ok = !reads_correct || q.abs_diff <= q.tolerance;
        }
        obs.queries.push_back(std::move(q));
      }

      if (options.record_ring) {
        const std::int64_t rows_per_state = pool.spec().ring_rows;
        const std::int64_t states = pool.spec().states;
        if (rows_per_state <= 512 && req.state < states) {
          for (std::int64_t s = 0; s < rows_per_state; ++s) {
            const impl::Tag t = pool.backend().slot_tag(req.state * rows_per_state + s);
            obs.ring_positions.push_back(t.empty() ? -1 : (t.request == step.request ? t.position : -2));
          }
        }
      }
      run.steps.push_back(std::move(obs));
    }
    if (stop) break;

    // Model bookkeeping shared by all layers.
    req.begun = true;
    switch (step.kind) {
      case StepKind::kPrefill:
      case StepKind::kDecode: req.length += n; break;
      case StepKind::kVerify:
        req.pending_first = req.length;
        req.length += n;
        break;
      case StepKind::kAccept:
        req.length = req.pending_first + 1 + step.accepted;
        req.pending_first = -1;
        break;
      case StepKind::kFinish: req.finished = true; break;
      case StepKind::kReset:
        req.length = 0;
        req.pending_first = -1;
        break;
    }
  }

  // Verdict: expectations first, then the default properties.
  std::map<std::int64_t, const scenarios::OverwriteExpectation*> expected;
  if (sc.expect) {
    for (const auto& e : sc.expect->overwritten) expected[e.step] = &e;
  }
  for (auto& obs : run.steps) {
    const auto it = expected.find(obs.step);
    std::vector<std::int64_t> counts;
    for (const auto& q : obs.queries) {
      counts.push_back(static_cast<std::int64_t>(q.overwritten.size()));
      run.lost_rows += static_cast<std::int64_t>(q.overwritten.size() + q.missing.size());
      run.extra_reads += static_cast<std::int64_t>(q.extra.size());
      // Output errors of queries that read wrong rows are reported per query
      // but not in the run's maxima, which describe the kernel's arithmetic.
      if (q.overwritten.empty() && q.missing.empty() && q.extra.empty()) {
        run.max_abs_diff = std::max(run.max_abs_diff, q.abs_diff);
        run.max_eps_units = std::max(run.max_eps_units, q.eps_units);
        run.max_quant_abs_diff = std::max(run.max_quant_abs_diff, q.quant_abs_diff);
      }
      ++run.queries;
      if (!q.output_ok) {
        ++run.output_failures;
        fail("step " + std::to_string(obs.step) + " layer " + std::to_string(obs.layer) +
             " query " + std::to_string(q.position) + ": output differs by " +
             fmt_g(q.abs_diff) + " (tolerance " + fmt_g(q.tolerance) + ", " + fmt_g(q.eps_units) + " eps)");
      }
    }
    run.collisions += obs.collisions.total();
    auto list = [](const std::vector<std::int64_t>& v) {
      std::string s = "[";
      for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
      return s + "]";
    };
    if (it != expected.end()) {
      if (counts != it->second->counts) {
        obs.expectation_failed = true;
        obs.expectation_detail = "expected overwritten " + list(it->second->counts) + ", observed " + list(counts);
        fail("step " + std::to_string(obs.step) + " layer " + std::to_string(obs.layer) + ": " +
             obs.expectation_detail);
      }
      for (const auto& q : obs.queries) {
        if (!q.missing.empty() || !q.extra.empty()) {
          fail("step " + std::to_string(obs.step) + " query " + std::to_string(q.position) +
               ": " + std::to_string(q.missing.size()) + " missing, " +
               std::to_string(q.extra.size()) + " extra reads");
        }
      }
    } else {
      for (const auto& q : obs.queries) {
        if (!q.overwritten.empty() || !q.missing.empty() || !q.extra.empty()) {
          obs.expectation_failed = true;
          obs.expectation_detail = "query " + std::to_string(q.position) +
                                   " lost or misread rows, and the scenario expects none here";
          fail("step " + std::to_string(obs.step) + " (" + obs.kind + ") layer " +
               std::to_string(obs.layer) + " query " + std::to_string(q.position) + ": overwritten " +
               list(q.overwritten) + ", missing " + list(q.missing) + ", " +
               std::to_string(q.extra.size()) + " extra reads");
          break;
        }
      }
    }
  }
  const std::int64_t allowed = sc.expect && sc.expect->collisions ? *sc.expect->collisions : 0;
  if (run.collisions != allowed) {
    for (const auto& obs : run.steps) {
      if (obs.collisions.total() > 0) {
        fail("step " + std::to_string(obs.step) + " (" + obs.kind + "): " +
             std::to_string(obs.collisions.same_step) + " same-step, " +
             std::to_string(obs.collisions.outside_block) + " outside-block, " +
             std::to_string(obs.collisions.replaced_needed) + " replaced-needed collisions (" +
             std::to_string(run.collisions) + " in all, expected " + std::to_string(allowed) + ")");
        break;
      }
    }
    if (run.passed) fail("expected " + std::to_string(allowed) + " collisions, observed " + std::to_string(run.collisions));
  }
  return run;
}

}  // namespace

}  // namespace kvcheck::properties
