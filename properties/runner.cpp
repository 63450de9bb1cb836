#include "properties/runner.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <utility>

#include "engines/factory.hpp"
#include "engines/ring_pool_cache.hpp"
#include "model/attention.hpp"
#include "model/certified.hpp"
#include "model/encoding.hpp"
#include "model/error_bounds.hpp"
#include "model/real.hpp"
#include "model/visible.hpp"
#include "properties/bookkeeping_outputs.hpp"
#include "properties/position_code.hpp"
#include "properties/probes.hpp"
#include "properties/reference_rows.hpp"
#include "properties/rows.hpp"
#include "properties/shadow.hpp"
#include "properties/stored_rows.hpp"
#include "properties/tolerance.hpp"
#include "properties/verdict.hpp"
#include "scenarios/scenario_json.hpp"
#include "scenarios/step_semantics.hpp"
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

model::RopeStyle to_model(scenarios::RopeStyle s) {
  switch (s) {
    case scenarios::RopeStyle::kNone: return model::RopeStyle::kNone;
    case scenarios::RopeStyle::kNeox: return model::RopeStyle::kNeox;
    case scenarios::RopeStyle::kInterleaved: return model::RopeStyle::kInterleaved;
  }
  return model::RopeStyle::kNone;
}

struct RequestState {
  std::int64_t state = 0;
  bool begun = false;
  bool after_reset = false;  ///< the request's last step was a reset
  scenarios::RequestProgress progress;
};

model::Encoding model_encoding(scenarios::Format f) {
  switch (f) {
    case scenarios::Format::kF64: return model::Encoding::kF64;
    case scenarios::Format::kF32: return model::Encoding::kF32;
    case scenarios::Format::kBf16: return model::Encoding::kBf16;
    case scenarios::Format::kFp8: return model::Encoding::kFp8;
  }
  return model::Encoding::kF64;
}

}  // namespace

namespace {
template <class Real>
RunObservation run_with(const Scenario& sc, const RunOptions& options, engines::CacheProvider& provider);
}  // namespace

std::unique_ptr<engines::CacheProvider> make_provider(const RunOptions& options) {
  engines::ExecOptions exec;
  exec.step_timeout_seconds = options.step_timeout_seconds;
  return engines::make_provider(options.backend, options.fault, exec);
}

RunObservation run_scenario(const Scenario& sc, const RunOptions& options) {
  std::unique_ptr<engines::CacheProvider> owned;
  engines::CacheProvider* provider = options.provider;
  if (provider == nullptr) {
    owned = make_provider(options);
    provider = owned.get();
  }
  switch (options.precision_bits) {
    case 53: return run_with<double>(sc, options, *provider);
    case 113: return run_with<model::Real>(sc, options, *provider);
    case 169: return run_with<model::Real50>(sc, options, *provider);
    default:
      throw Error(
          ErrorId::kUsage, "--precision",
          "reference precision must be 53, 113 or 169 bits, got " + std::to_string(options.precision_bits));
  }
}

int reference_significand_bits(int precision_requested) {
  // The types properties::run_scenario picks for each --precision.
  switch (precision_requested) {
    case 53: return model::real_bits<double>();
    case 113: return model::real_bits<model::Real>();
    case 169: return model::real_bits<model::Real50>();
    default: return precision_requested;
  }
}

std::int64_t window_keys(const scenarios::CacheConfig& cache) {
  const model::Window w{cache.window, to_model(cache.convention)};
  return *w.keys();
}

engines::CacheSpec cache_spec(const Scenario& scenario) {
  engines::CacheSpec spec;
  spec.cache = scenario.cache;
  spec.window_keys = window_keys(scenario.cache);
  std::int64_t most = 1;
  for (const auto& s : scenario.steps) most = std::max(most, scenarios::step_rows(s));
  spec.max_step_rows = most;
  spec.softmax_scale =
      scenario.cache.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(scenario.cache.head_dim)));
  return spec;
}

namespace {

template <class Real>
RunObservation run_with(const Scenario& sc, const RunOptions& options, engines::CacheProvider& provider) {
  const auto& cache = sc.cache;
  const engines::CacheSpec spec = cache_spec(sc);
  const std::int64_t keys = spec.window_keys;
  const model::Window window{cache.window, to_model(cache.convention)};
  const model::Heads heads{cache.q_heads, cache.kv_heads, cache.head_dim, cache.shared_row};
  const model::Rope rope{to_model(cache.rope.style), cache.rope.rotary_dims, cache.rope.base};
  using std::sqrt;
  const Real scale = cache.softmax_scale ? Real(*cache.softmax_scale) : Real(1) / sqrt(Real(cache.head_dim));
  const double scale_d = model::to_double(scale);
  const std::optional<Real> sink =
      cache.sink_logit ? std::optional<Real>(Real(*cache.sink_logit)) : std::nullopt;
  const std::int64_t kv_width = static_cast<std::int64_t>(cache.kv_heads) * cache.head_dim;
  const std::int64_t q_width = static_cast<std::int64_t>(cache.q_heads) * cache.head_dim;
  const impl::ElementFormat format = engines::impl_format(cache.format);

  RunObservation run;
  run.scenario_name = sc.name;
  run.backend = options.backend;
  run.fault = std::string(impl::fault_name(options.fault));
  run.window_convention = std::string(model::convention_name(window.convention));
  run.window_keys = keys;
  run.ring_rows = cache.ring_rows;
  run.format = std::string(impl::format_name(format));
  run.precision_bits = model::real_bits<Real>();

  const engines::Capabilities& caps = provider.capabilities();
  run.observed = caps.reports_written_slots && caps.reports_read_slots
                     ? "slots+outputs"
                     : (caps.reports_written_slots ? "written-slots+outputs" : "outputs");
  std::string why;
  if (!caps.supports(sc, &why)) {
    run.skipped = true;
    run.skip_reason = caps.name + " does not support " + why;
    return run;
  }
  engines::Refusal refused;
  std::unique_ptr<engines::CacheUnderTest> cut = provider.open(spec, &refused);
  if (!cut) {
    run.skipped = true;
    run.refused = true;
    run.skip_reason = caps.name + " refused the configuration: " + refusal_text(refused);
    return run;
  }

  const double format_eps = impl::format_epsilon(format);
  const double rope_eps =
      caps.rope_unit_roundoff > 0 ? caps.rope_unit_roundoff : accumulation_epsilon(format);
  KernelArithmetic arith;  // as the cache declares it computes (Capabilities)
  arith.u = caps.accumulation_epsilon(cache.format);
  arith.prob_u = caps.probability_epsilon();
  arith.rope_u = rope_eps;  // the RoPE allowance: the cache's declared RoPE precision
  const std::optional<double> sink_d = cache.sink_logit;
  ToleranceScratch tol_scratch;
  const model::Encoding encoding = model_encoding(cache.format);
  const std::int32_t group = cache.q_heads / cache.kv_heads;

  // The certified reference (model/certified.hpp): double-double balls that
  // contain MPFR's values; MPFR only where a ball does not pin a figure.
  RowReference<Real> ref_rows{cache, kv_width, q_width,  group,    heads, rope,
                              scale, sink,     encoding, rope_eps, {},    0};
  Certifier<Real>& cert = ref_rows.cert;
  cert.on = !std::is_same_v<Real, double> && options.reference == Reference::kCertified;
  if (cert.on) {
    cert.um = std::ldexp(1.0, -model::real_bits<Real>());
    cert.set_rope(rope);
    cert.scale = model::certified::from_real(scale);
    if (cache.sink_logit) cert.sink = *cache.sink_logit;
  }

  std::vector<LayerTruth<Real>> layers(static_cast<std::size_t>(cache.layers));
  // A bookkeeping-only engine: kvcheck computes its outputs over the rows
  // its reads resolve to (properties/bookkeeping_outputs.hpp).
  std::vector<ReadRows> read_rows(caps.computes_outputs ? 0 : static_cast<std::size_t>(cache.layers));
  // A cache that reports no read slots, on position-coded rows: which rows
  // each query read is decoded from its outputs (properties/position_code.hpp).
  std::vector<PositionDecoder> decoders;
  if (sc.data.profile == scenarios::ValueProfile::kPositionCode && !caps.reports_read_slots &&
      position_code_layout(cache).classes > 0) {
    for (std::int32_t l = 0; l < cache.layers; ++l) decoders.emplace_back(cache, l);
    run.observed += "+position-code";
  }
  std::map<std::int64_t, RequestState> requests;
  for (const auto& r : sc.requests) requests[r.id].state = r.state;
  Prober prober{caps, *cut};

  auto fail = [&run](const std::string& why) { mark_failed(&run, why); };
  // A step that ended the run early (a refusal, a probe the cache got wrong):
  // recorded as a failed observation so the verdict and the reports agree.
  auto stop_at = [&](std::size_t step_index, std::int32_t layer, const scenarios::Step& step,
                     const RequestState& req, const std::string& error) {
    StepObservation obs;
    obs.step = static_cast<std::int64_t>(step_index);
    obs.layer = layer;
    obs.kind = std::string(scenarios::step_kind_name(step.kind));
    obs.request = step.request;
    obs.state = req.state;
    obs.first_position = scenarios::step_first_position(req.progress);
    obs.error = error;
    run.steps.push_back(std::move(obs));
  };

  engines::StepAnswer answer;
  for (std::size_t step_index = 0; step_index < sc.steps.size(); ++step_index) {
    const auto& step = sc.steps[step_index];
    RequestState& req = requests.at(step.request);
    cert.factors.clear();
    const std::int64_t n = scenarios::step_rows(step);
    const std::int64_t first = scenarios::step_first_position(req.progress);
    bool stop = false;
    const RowSet rows =
        n > 0 ? make_rows(sc, 0, step.request, first, n, static_cast<std::int64_t>(step_index)) : RowSet{};

    for (std::int32_t l = 0; l < cache.layers && !stop; ++l) {
      LayerTruth<Real>& truth = layers[static_cast<std::size_t>(l)];
      const RowSet layer_rows =
          l == 0 ? RowSet{}
                 : (n > 0 ? make_rows(sc, l, step.request, first, n, static_cast<std::int64_t>(step_index))
                          : RowSet{});
      const RowSet& in = l == 0 ? rows : layer_rows;
      engines::StepCall call;
      call.step = step;
      call.layer = l;
      call.state = req.state;
      call.position = first;
      call.rows = n;
      call.step_index = static_cast<std::int64_t>(step_index);
      if (n > 0) {
        call.k = in.k.data();
        call.v = cache.shared_row ? nullptr : in.v.data();
        call.q = in.q.data();
      }
      if (!req.begun) {
        engines::StepCall begin = call;
        begin.op = engines::StepCall::Op::kBegin;
        if (const auto st = cut->call(begin, nullptr)) {
          const std::string e = "begin refused: " + refusal_text(*st);
          fail("step " + std::to_string(step_index) + ": " + e);
          stop_at(step_index, l, step, req, e);
          stop = true;
          break;
        }
      }
      if (options.probes) {
        // One probe per step and layer, rotating through those that apply
        // (right after a reset, the stale-revision probe first: Prober::choose).
        const auto apply = prober.applicable(step, req.progress);
        if (!apply.empty()) {
          const std::string name =
              prober.choose(apply, static_cast<std::int64_t>(step_index), req.after_reset);
          const std::string problem = prober.run(name, call, req.progress, in.k);
          if (!problem.empty()) {
            fail("step " + std::to_string(step_index) + " (" +
                 std::string(scenarios::step_kind_name(step.kind)) + ") layer " + std::to_string(l) + ": " +
                 problem);
            stop_at(step_index, l, step, req, problem);
            stop = true;
            break;
          }
        }
      }
      if (n == 0) {
        if (const auto st = cut->call(call, nullptr)) {
          const std::string e = "refused: " + refusal_text(*st);
          fail("step " + std::to_string(step_index) + " (" +
               std::string(scenarios::step_kind_name(step.kind)) + "): " + e);
          stop_at(step_index, l, step, req, e);
          stop = true;
        }
        continue;
      }

      const engines::StepStatus st = cut->call(call, &answer);
      StepObservation obs;
      obs.step = static_cast<std::int64_t>(step_index);
      obs.layer = l;
      obs.kind = std::string(scenarios::step_kind_name(step.kind));
      if (step.kind == StepKind::kPrefill) {
        obs.order = scenarios::order_name(step.order);
      }
      obs.request = step.request;
      obs.state = req.state;
      obs.first_position = first;
      if (st) {
        obs.error = refusal_text(*st);
        fail("step " + std::to_string(step_index) + " (" + obs.kind +
             "): implementation refused: " + obs.error);
        run.steps.push_back(std::move(obs));
        stop = true;
        break;
      }
      KVCHECK_ASSERT(static_cast<std::int64_t>(answer.out.size()) == n * q_width);

      // Model: remember each row's exact and cached values.
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t p = first + i;
        const double* k_row = in.k.data() + i * kv_width;
        const double* v_row = cache.shared_row ? nullptr : in.v.data() + i * kv_width;
        truth.rows[{step.request, p}] = ref_rows.written_row(p, k_row, v_row, answer, i, &obs);
      }
      // Bookkeeping-only: the rows as written numbers, and the slots' old rows.
      std::vector<std::uint64_t> replaced_seqs;
      const std::uint64_t seq_base = truth.shadow.write_count();
      if (!caps.computes_outputs) {
        ReadRows& rr = read_rows[static_cast<std::size_t>(l)];
        for (std::int64_t i = 0; i < n; ++i) {
          const TruthRow<Real>& row = truth.rows.at({step.request, first + i});
          rr.remember(seq_base + static_cast<std::uint64_t>(i) + 1, row.key_encoding.values,
                      cache.shared_row ? std::vector<double>{} : row.value_encoding.values);
          replaced_seqs.push_back(truth.shadow.at(answer.written[static_cast<std::size_t>(i)]).write_seq);
        }
      }

      // Slots: everything from what the cache reported, via the shadow map.
      StepFacts facts;
      facts.request = step.request;
      facts.state = req.state;
      facts.first_position = first;
      facts.rows = n;
      facts.window_keys = keys;
      facts.has_written = answer.has_written;
      facts.written = answer.written;
      facts.has_reads = answer.has_reads;
      facts.read_offsets = answer.read_offsets;
      facts.read_slots = answer.read_slots;
      facts.view = answer.view;
      facts.duplicate_slots = answer.duplicate_slots;
      facts.ring = caps.ring_addressing;
      facts.ring_rows = cache.ring_rows;
      facts.record_reads = options.record_reads || !caps.computes_outputs;
      facts.record_ring = options.record_ring;
      truth.shadow.observe(facts, &obs);
      if (!decoders.empty() && !(facts.has_written && facts.has_reads)) {
        PositionDecoder& decoder = decoders[static_cast<std::size_t>(l)];
        decoder.record_writes(step.request, first, n, static_cast<std::int64_t>(step_index));
        for (std::int64_t i = 0; i < n; ++i) {
          decoder.decode(step.request, answer.out.data() + i * q_width,
                         &obs.queries[static_cast<std::size_t>(i)]);
        }
      }

      for (std::int64_t i = 0; i < n && options.check_outputs; ++i) {
        QueryObservation& q = obs.queries[static_cast<std::size_t>(i)];
        const std::int64_t p = first + i;
        const model::PositionRange visible = model::visible_range(p, window);
        std::vector<TruthRow<Real>*> visible_rows;
        std::vector<KeyBounds> key_bounds;
        for (std::int64_t j = visible.first; j <= visible.last; ++j) {
          TruthRow<Real>& row = truth.rows.at({step.request, j});
          visible_rows.push_back(&row);
          key_bounds.push_back({&row.key_encoding.values, &row.key_err,
                                cache.shared_row ? &row.key_encoding.values : &row.value_encoding.values});
        }
        // The reference outputs and the rotated query as the doubles MPFR's
        // values round to: from balls when they pin them, else from MPFR.
        std::vector<double> ref, ref_exact, query;
        ref_rows.query_reference(in.q.data() + i * q_width, p, visible, visible_rows, &ref, &ref_exact,
                                 &query);
        if (!caps.computes_outputs) {
          read_rows[static_cast<std::size_t>(l)].attend(query, q.reads, heads, scale_d, cache.sink_logit,
                                                        answer.out.data() + i * q_width);
          if (!options.record_reads) q.reads.clear();
        }
        const double* out = answer.out.data() + i * q_width;
        for (std::int64_t d = 0; d < q_width; ++d) {
          const double r = ref[static_cast<std::size_t>(d)];
          const double diff = std::fabs(out[d] - r);
          q.reference_max = std::max(q.reference_max, std::fabs(r));
          q.abs_diff = std::max(q.abs_diff, diff);
          q.rel_diff = std::max(q.rel_diff, diff / std::max(std::fabs(r), 1e-30));
          q.quant_abs_diff =
              std::max(q.quant_abs_diff, std::fabs(out[d] - ref_exact[static_cast<std::size_t>(d)]));
          if (!std::isfinite(out[d])) q.abs_diff = std::numeric_limits<double>::infinity();
        }
        q.eps_units = q.abs_diff / format_eps;
        // Kernel error bound (model::head_output_bound): this query's own
        // scores, weights and values, with per-key score errors from the
        // accumulation and from the RoPE angle error at the query's and keys'
        // positions (and, for shared rows, the values' deviations).
        const QueryTolerance tol =
            query_tolerance(query, key_bounds, heads, scale_d, sink_d, p, rope, arith, ref, &tol_scratch);
        q.rope_tolerance = tol.parts.rope;
        const bool fixed = sc.expect && sc.expect->output_tolerance;
        q.tolerance = fixed ? *sc.expect->output_tolerance : tol.parts.total();
        const bool reads_correct = q.overwritten.empty() && q.missing.empty() && q.extra.empty();
        q.output_ok = !reads_correct || q.abs_diff <= q.tolerance;
        // Judged only where the reads were right and a wrong output could
        // fail: a tolerance that reaches the values' size judges nothing.
        q.output_checked = reads_correct && (q.tolerance < tol.value_max || tol.value_max == 0);
      }
      if (!caps.computes_outputs) {
        // Rows no slot holds any more are never read again: the old
        // occupants of the slots written, and rows of this step a later row
        // of it replaced.
        ReadRows& rr = read_rows[static_cast<std::size_t>(l)];
        for (const std::uint64_t seq : replaced_seqs) rr.forget(seq);
        for (std::int64_t i = 0; i < n; ++i) {
          const std::uint64_t seq = seq_base + static_cast<std::uint64_t>(i) + 1;
          if (truth.shadow.at(answer.written[static_cast<std::size_t>(i)]).write_seq != seq) rr.forget(seq);
        }
      }
      run.steps.push_back(std::move(obs));
    }
    if (stop) break;

    // Rows no later query can see: every later query of this request sits at
    // or after this writing step's first position (an accept keeps at least
    // it; after a reset the positions are written again before they are
    // read), so a window reaches back no further than first - keys + 1.
    // Memory stays with the window, not the schedule's length.
    if (n > 0 && first - keys > 0) {
      for (LayerTruth<Real>& truth : layers) {
        truth.rows.erase(truth.rows.lower_bound({step.request, 0}),
                         truth.rows.lower_bound({step.request, first - keys}));
      }
    }

    // Model bookkeeping shared by all layers (SPEC §3, scenarios/step_semantics.hpp).
    req.begun = true;
    req.after_reset = step.kind == StepKind::kReset;
    const scenarios::StepRefusal refusal = scenarios::advance(req.progress, step);
    KVCHECK_ASSERT(refusal == scenarios::StepRefusal::kNone);  // scenarios are validated
  }
  run.probes = prober.sent;

  run.mpfr_queries = ref_rows.mpfr_queries;
  judge_run(sc, &run);
  return run;
}

}  // namespace

}  // namespace kvcheck::properties
