#include "properties/runner.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>

#include "engines/factory.hpp"
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
  std::optional<scenarios::Prefix> prefix;  ///< the shared prefix it begins from, if any
  bool begun = false;
  bool after_reset = false;  ///< the request's last step was a reset
  bool finished = false;     ///< the request finished
  /// Preempted and not yet resumed: its next step begins it again from its
  /// own committed rows (docs/semantics.md "Preemption").
  bool preempted = false;
  scenarios::RequestProgress progress;
};

}  // namespace

namespace {
template <class Real>
RunObservation run_with(const Scenario& sc, const RunOptions& options, engines::CacheProvider& provider);
}  // namespace

std::unique_ptr<engines::CacheProvider> make_provider(const RunOptions& options) {
  engines::ExecOptions exec;
  exec.step_timeout_seconds = options.step_timeout_seconds;
  exec.encoding = options.exec_encoding;
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

std::string observed_name(const engines::Capabilities& caps) {
  if (!caps.computes_outputs) return "slots";
  if (caps.reports_written_slots && caps.reports_read_slots) return "slots+outputs";
  return caps.reports_written_slots ? "written-slots+outputs" : "outputs";
}

std::int64_t window_keys(const scenarios::CacheConfig& cache) {
  const model::Window w{cache.window, to_model(cache.convention)};
  return *w.keys();
}

namespace {

/// The reference's window of each layer, from the scenario's own words (a
/// global layer is plain causal): the model's view, not the cache's.
std::vector<model::Window> layer_model_windows(const scenarios::CacheConfig& cache) {
  std::vector<model::Window> out;
  for (std::int32_t l = 0; l < cache.layers; ++l) {
    if (cache.layer_windows.empty()) {
      out.push_back({cache.window, to_model(cache.convention)});
    } else {
      const scenarios::LayerWindow& w = cache.layer_windows[static_cast<std::size_t>(l)];
      out.push_back({w.window, to_model(w.convention)});
    }
  }
  return out;
}

/// Keys a query of each layer sees (scenarios::kGlobalWindowKeys for a global layer).
std::vector<std::int64_t> layer_keys(const scenarios::CacheConfig& cache) {
  std::vector<std::int64_t> out;
  for (const model::Window& w : layer_model_windows(cache)) out.push_back(w.keys().value_or(scenarios::kGlobalWindowKeys));
  return out;
}

}  // namespace

engines::CacheSpec cache_spec(const Scenario& scenario) {
  engines::CacheSpec spec;
  spec.cache = scenario.cache;
  spec.window_keys = window_keys(scenario.cache);
  spec.pool_blocks = scenario.cache.pool_blocks.value_or(0);  // 0: derived from the capacity
  if (!scenario.cache.layer_windows.empty()) spec.layer_window_keys = layer_keys(scenario.cache);
  std::int64_t most = 1;
  for (const auto& s : scenario.steps) most = std::max(most, scenarios::step_rows(s));
  spec.max_step_rows = most;
  // The most rows a begin carries: a shared prefix, or a resume's committed
  // length (docs/semantics.md "Recompute in a step" sizes the pool by it).
  for (const auto& r : scenario.requests)
    if (r.prefix) spec.max_begin_rows = std::max(spec.max_begin_rows, r.prefix->positions);
  std::map<std::int64_t, scenarios::RequestProgress> progress = scenarios::start_progress(scenario.requests);
  for (const auto& s : scenario.steps) {
    scenarios::advance(progress[s.request], s);
    if (s.kind == StepKind::kPreempt)
      spec.max_begin_rows = std::max(spec.max_begin_rows, progress[s.request].length);
  }
  spec.softmax_scale =
      scenario.cache.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(scenario.cache.head_dim)));
  return spec;
}

namespace {

/// The output judge of one run: the model's rows of every layer and, for
/// each query a cache answered, the reference output, the difference and
/// the tolerance the cache is held to (README "Tolerances"). It sees the
/// cache only through its answers; for a bookkeeping-only engine it also
/// computes the outputs over the rows the reads resolve to.
template <class Real>
class OutputJudge {
 public:
  OutputJudge(const Scenario& sc, const RunOptions& options, const engines::Capabilities& caps)
      : sc_(sc),
        cache_(sc.cache),
        options_(options),
        caps_(caps),
        windows_(layer_model_windows(cache_)),
        heads_{cache_.q_heads, cache_.kv_heads, cache_.head_dim, cache_.shared_row},
        rope_{to_model(cache_.rope.style), cache_.rope.rotary_dims, cache_.rope.base},
        scale_(softmax_scale(cache_)),
        scale_d_(model::to_double(scale_)),
        kv_width_(static_cast<std::int64_t>(cache_.kv_heads) * cache_.head_dim),
        q_width_(static_cast<std::int64_t>(cache_.q_heads) * cache_.head_dim),
        format_eps_(format_unit_roundoff(cache_.format)),
        rope_eps_(caps.rope_unit_roundoff > 0 ? caps.rope_unit_roundoff
                                              : accumulation_epsilon(cache_.format)),
        ref_rows_{cache_,
                  kv_width_,
                  q_width_,
                  cache_.q_heads / cache_.kv_heads,
                  heads_,
                  rope_,
                  scale_,
                  cache_.sink_logit ? std::optional<Real>(Real(*cache_.sink_logit)) : std::nullopt,
                  cache_.format,
                  rope_eps_,
                  {},
                  0},
        rows_(static_cast<std::size_t>(cache_.layers)),
        read_rows_(caps.computes_outputs ? 0 : static_cast<std::size_t>(cache_.layers)) {
    arith_.u = caps.accumulation_epsilon(cache_.format);  // as the cache declares it computes
    arith_.prob_u = caps.probability_epsilon();
    arith_.rope_u = rope_eps_;  // the RoPE allowance: the cache's declared RoPE precision
    arith_.output = caps.output_format;  // its rounding term where narrower than the accumulation
    // The certified reference (model/certified.hpp): double-double balls that
    // contain MPFR's values; MPFR only where a ball does not pin a figure.
    Certifier<Real>& cert = ref_rows_.cert;
    cert.on = !std::is_same_v<Real, double> && options.reference == Reference::kCertified;
    if (cert.on) {
      cert.um = std::ldexp(1.0, -model::real_bits<Real>());
      cert.set_rope(rope_);
      cert.scale = model::certified::from_real(scale_);
      if (cache_.sink_logit) cert.sink = *cache_.sink_logit;
    }
  }

  /// A new step: the RoPE factors of the last one's positions are dropped.
  void begin_step() { ref_rows_.cert.factors.clear(); }

  /// Remembers the step's new rows (exact and reference-encoded) and judges
  /// the rows the cache says it stored; for a bookkeeping-only engine also
  /// the rows as written numbers, before `shadow` sees the step.
  void write_rows(std::int32_t layer, std::int64_t request, std::int64_t first, std::int64_t n,
                  const RowSet& in, const engines::StepAnswer& answer, const ShadowMap& shadow,
                  StepObservation* obs) {
    auto& rows = rows_[static_cast<std::size_t>(layer)];
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t p = first + i;
      const double* k_row = in.k.data() + i * kv_width_;
      const double* v_row = cache_.shared_row ? nullptr : in.v.data() + i * kv_width_;
      rows[{request, p}] = ref_rows_.written_row(p, k_row, v_row, answer, i, obs);
    }
    // Bookkeeping-only: the rows as written numbers, and the slots' old rows.
    replaced_seqs_.clear();
    seq_base_ = shadow.write_count();
    if (caps_.computes_outputs) return;
    ReadRows& rr = read_rows_[static_cast<std::size_t>(layer)];
    for (std::int64_t i = 0; i < n; ++i) {
      const TruthRow<Real>& row = rows.at({request, first + i});
      rr.remember(seq_base_ + static_cast<std::uint64_t>(i) + 1, row.key_encoding.values,
                  cache_.shared_row ? std::vector<double>{} : row.value_encoding.values);
      replaced_seqs_.push_back(shadow.at(answer.written[static_cast<std::size_t>(i)]).write_seq);
    }
  }

  /// Judges the outputs of the step's `n` queries (their reads already in
  /// `obs`); a bookkeeping-only engine's outputs are computed into `answer`
  /// first.
  void judge_outputs(std::int32_t layer, std::int64_t request, std::int64_t first, std::int64_t n,
                     const RowSet& in, engines::StepAnswer& answer, StepObservation* obs) {
    for (std::int64_t i = 0; i < n && options_.check_outputs; ++i) {
      QueryObservation& q = obs->queries[static_cast<std::size_t>(i)];
      judge_query(layer, request, first + i, in.q.data() + i * q_width_, answer.out.data() + i * q_width_,
                  &q);
      if (options_.on_query_judged) options_.on_query_judged(q.position - q.visible_first + 1);
    }
  }

  /// Prefix rows a step recomputed (docs/semantics.md "Recompute in a
  /// step"): the rows its request's begin carried (share_prefix has them);
  /// for a bookkeeping-only engine remembered under their write numbers.
  void recompute_rows(std::int32_t layer, std::int64_t request,
                      std::span<const std::pair<std::int64_t, std::int64_t>> stored,
                      const std::vector<std::uint64_t>& seqs) {
    if (caps_.computes_outputs) return;
    const auto& rows = rows_[static_cast<std::size_t>(layer)];
    for (std::size_t i = 0; i < stored.size(); ++i) {
      const auto it = rows.find({request, stored[i].first});
      if (it == rows.end()) continue;  // before the window of every query to come
      read_rows_[static_cast<std::size_t>(layer)].remember(
          seqs[i], it->second.key_encoding.values,
          cache_.shared_row ? std::vector<double>{} : it->second.value_encoding.values);
    }
  }

  /// Bookkeeping-only, after `shadow` saw the step: rows no slot holds any
  /// more are never read again (the old occupants of the slots written, and
  /// rows of this step a later row of it replaced).
  void settle_reads(std::int32_t layer, std::int64_t n, const engines::StepAnswer& answer,
                    const ShadowMap& shadow) {
    if (caps_.computes_outputs) return;
    ReadRows& rr = read_rows_[static_cast<std::size_t>(layer)];
    // A replaced row another slot still holds (moved or copied there) is read again.
    for (const std::uint64_t seq : replaced_seqs_)
      if (!shadow.held_elsewhere(-1, seq)) rr.forget(seq);
    for (std::int64_t i = 0; i < n; ++i) {
      const std::uint64_t seq = seq_base_ + static_cast<std::uint64_t>(i) + 1;
      if (shadow.at(answer.written[static_cast<std::size_t>(i)]).write_seq != seq) rr.forget(seq);
    }
  }

  /// A begin from a shared prefix on `layer`: the request's rows at 0 .. n-1
  /// are `source`'s rows there (the reference needs no other case). For a
  /// bookkeeping-only engine, the rows the cache stored again (seqs[p] != 0,
  /// its write number) are remembered as written numbers.
  void share_prefix(std::int32_t layer, std::int64_t request, std::int64_t source, std::int64_t n,
                    const std::vector<std::uint64_t>& seqs) {
    auto& rows = rows_[static_cast<std::size_t>(layer)];
    for (std::int64_t p = 0; p < n; ++p) {
      const auto it = rows.find({source, p});
      if (it == rows.end()) continue;  // before the window of every query to come
      const TruthRow<Real>& row = rows.insert_or_assign({request, p}, it->second).first->second;
      if (!caps_.computes_outputs && seqs[static_cast<std::size_t>(p)] != 0) {
        read_rows_[static_cast<std::size_t>(layer)].remember(
            seqs[static_cast<std::size_t>(p)], row.key_encoding.values,
            cache_.shared_row ? std::vector<double>{} : row.value_encoding.values);
      }
    }
  }

  /// Forgets the rows of `request` before `position` in every layer.
  void forget_before(std::int64_t request, std::int64_t position) {
    for (auto& rows : rows_)
      rows.erase(rows.lower_bound({request, 0}), rows.lower_bound({request, position}));
  }

  std::int64_t mpfr_queries() const noexcept { return ref_rows_.mpfr_queries; }

 private:
  static Real softmax_scale(const scenarios::CacheConfig& cache) {
    using std::sqrt;
    return cache.softmax_scale ? Real(*cache.softmax_scale) : Real(1) / sqrt(Real(cache.head_dim));
  }

  /// One query at position `p`: its reference outputs, the difference of
  /// `out` from them, and its tolerance (model::head_output_bound).
  void judge_query(std::int32_t layer, std::int64_t request, std::int64_t p, const double* q_row, double* out,
                   QueryObservation* query_obs) {
    QueryObservation& q = *query_obs;
    auto& rows = rows_[static_cast<std::size_t>(layer)];
    const model::PositionRange visible = model::visible_range(p, windows_[static_cast<std::size_t>(layer)]);
    std::vector<TruthRow<Real>*> visible_rows;
    std::vector<KeyBounds> key_bounds;
    for (std::int64_t j = visible.first; j <= visible.last; ++j) {
      TruthRow<Real>& row = rows.at({request, j});
      visible_rows.push_back(&row);
      key_bounds.push_back({&row.key_encoding.values, &row.key_err,
                            cache_.shared_row ? &row.key_encoding.values : &row.value_encoding.values});
    }
    // The reference outputs and the rotated query as the doubles MPFR's
    // values round to: from balls when they pin them, else from MPFR.
    std::vector<double> ref, ref_exact, query;
    ref_rows_.query_reference(q_row, p, visible, visible_rows, &ref, &ref_exact, &query);
    if (!caps_.computes_outputs) {
      read_rows_[static_cast<std::size_t>(layer)].attend(query, q.reads, heads_, scale_d_, cache_.sink_logit,
                                                         out);
      if (!options_.record_reads) q.reads.clear();
    }
    for (std::int64_t d = 0; d < q_width_; ++d) {
      const double r = ref[static_cast<std::size_t>(d)];
      const double diff = std::fabs(out[d] - r);
      q.reference_max = std::max(q.reference_max, std::fabs(r));
      q.abs_diff = std::max(q.abs_diff, diff);
      q.rel_diff = std::max(q.rel_diff, diff / std::max(std::fabs(r), 1e-30));
      q.quant_abs_diff =
          std::max(q.quant_abs_diff, std::fabs(out[d] - ref_exact[static_cast<std::size_t>(d)]));
      if (!std::isfinite(out[d])) q.abs_diff = std::numeric_limits<double>::infinity();
      // A declared output format is a claim about every element: a value
      // the format cannot hold was not written in it (docs/semantics.md
      // "Output formats"). round_output is exact, so equal bits are a value of it.
      const double in_format = model::round_output(caps_.output_format, out[d]);
      if (std::isfinite(out[d]) && std::bit_cast<std::uint64_t>(in_format) != std::bit_cast<std::uint64_t>(out[d]))
        ++q.outputs_off_format;
    }
    q.eps_units = q.abs_diff / format_eps_;
    // Kernel error bound (model::head_output_bound): this query's own
    // scores, weights and values, with per-key score errors from the
    // accumulation and from the RoPE angle error at the query's and keys'
    // positions (and, for shared rows, the values' deviations).
    const QueryTolerance tol = query_tolerance(query, key_bounds, heads_, scale_d_, cache_.sink_logit, p,
                                               rope_, arith_, ref, &tol_scratch_);
    q.rope_tolerance = tol.parts.rope;
    q.output_rounding_tolerance = tol.parts.output_rounding;
    const bool fixed = sc_.expect && sc_.expect->output_tolerance;
    // A scenario's fixed tolerance is the accumulation's: a declared output
    // format's rounding comes on top of it.
    q.tolerance = fixed ? *sc_.expect->output_tolerance + tol.parts.output_rounding : tol.parts.total();
    const bool reads_correct = properties::reads_correct(q);
    q.output_ok = (!reads_correct || q.abs_diff <= q.tolerance) && q.outputs_off_format == 0;
    // Judged only where the reads were right and a wrong output could
    // fail: a tolerance that reaches the values' size judges nothing.
    q.output_checked = reads_correct && (q.tolerance < tol.value_max || tol.value_max == 0);
  }

  const Scenario& sc_;
  const scenarios::CacheConfig& cache_;
  const RunOptions& options_;
  const engines::Capabilities& caps_;
  const std::vector<model::Window> windows_;  ///< per layer
  const model::Heads heads_;
  const model::Rope rope_;
  const Real scale_;
  const double scale_d_;
  const std::int64_t kv_width_, q_width_;
  const double format_eps_, rope_eps_;
  KernelArithmetic arith_;
  ToleranceScratch tol_scratch_;
  RowReference<Real> ref_rows_;
  std::vector<std::map<RowKey, TruthRow<Real>>> rows_;  // [layers] by (request, position)
  std::vector<ReadRows> read_rows_;                     // [layers] bookkeeping-only engines
  std::vector<std::uint64_t> replaced_seqs_;            // this step's slots' old rows (bookkeeping-only)
  std::uint64_t seq_base_ = 0;                          // write number before this step's rows
};

/// The step driver of one run: each step of the schedule, layer by layer,
/// goes to the cache as begin (once per request and layer), a refusal probe,
/// then the call; what the cache answered is observed through the shadow
/// map, and its outputs go to the output judge. The first refusal or probe
/// the cache gets wrong ends the run (stop).
template <class Real>
class StepDriver {
 public:
  StepDriver(const Scenario& sc, const RunOptions& options, const engines::Capabilities& caps,
             engines::CacheUnderTest& cut, OutputJudge<Real>& judge, RunObservation& run)
      : sc_(sc),
        cache_(sc.cache),
        options_(options),
        caps_(caps),
        cut_(cut),
        judge_(judge),
        run_(run),
        layer_keys_(layer_keys(sc.cache)),
        keys_(*std::max_element(layer_keys_.begin(), layer_keys_.end())),
        q_width_(static_cast<std::int64_t>(cache_.q_heads) * cache_.head_dim),
        shadows_(static_cast<std::size_t>(cache_.layers)),
        prober_{caps, cut} {
    // A cache that reports no read slots, on position-coded rows: which rows
    // each query read is decoded from its outputs (properties/position_code.hpp).
    if (sc.data.profile == scenarios::ValueProfile::kPositionCode && !caps.reports_read_slots &&
        position_code_layout(cache_).classes > 0) {
      for (std::int32_t l = 0; l < cache_.layers; ++l) decoders_.emplace_back(cache_, l);
      run_.observed += "+position-code";
    }
    for (const auto& r : sc.requests) {
      RequestState& req = requests_[r.id];
      req.state = r.state;
      if (r.prefix) {
        // It begins at the prefix's length: positions 0 .. n-1 are shared.
        req.prefix = r.prefix;
        req.progress = scenarios::start_progress(r);
        prefix_sources_.insert(r.prefix->request);
      }
    }
    // A preempted request's resume carries its own rows: which step wrote each is kept.
    for (const scenarios::Step& s : sc.steps)
      if (s.kind == StepKind::kPreempt) resumed_.insert(s.request);
    trim_floor_ = trim_floors(sc);
  }

  /// The resident bound in force (engines::resident_limit of the spec the cache was opened with).
  void set_resident_limit(std::int64_t limit) { resident_limit_ = limit; }

  /// The slots the cache declared (a ring's states * capacity, a paged
  /// pool's pool_blocks * block_size per layer): an answer naming a slot at
  /// or past `end` names one the cache does not have. `what` says where
  /// the bound comes from, for the failure line.
  void set_slot_end(std::int64_t end, std::string what) {
    slot_end_ = end;
    slot_end_text_ = std::move(what);
  }

  /// Per step, the lowest length a later trim of the step's request leaves
  /// it at (INT64_MAX when no later trim): rows from there back a window
  /// are read again after the trim.
  static std::vector<std::int64_t> trim_floors(const Scenario& sc) {
    constexpr std::int64_t kNone = std::numeric_limits<std::int64_t>::max();
    std::vector<std::int64_t> after(sc.steps.size(), kNone);
    std::map<std::int64_t, scenarios::RequestProgress> progress = scenarios::start_progress(sc.requests);
    for (std::size_t i = 0; i < sc.steps.size(); ++i) {
      scenarios::advance(progress[sc.steps[i].request], sc.steps[i]);
      if (sc.steps[i].kind == StepKind::kTrim) after[i] = progress[sc.steps[i].request].length;
    }
    std::vector<std::int64_t> floors(sc.steps.size(), kNone);
    std::map<std::int64_t, std::int64_t> lowest;  // request -> lowest trimmed length from step i + 1 on
    for (std::size_t i = sc.steps.size(); i-- > 0;) {
      const auto it = lowest.find(sc.steps[i].request);
      floors[i] = it == lowest.end() ? kNone : it->second;
      if (after[i] != kNone) lowest[sc.steps[i].request] = std::min(floors[i], after[i]);
    }
    return floors;
  }

  /// Runs every step until the schedule ends or the run stops.
  void run() {
    for (std::size_t step_index = 0; step_index < sc_.steps.size(); ++step_index) {
      if (!run_step(step_index)) break;
    }
    run_.probes = prober_.sent;
  }

  /// Ends the run at the step and layer under way, which the cache crashed
  /// in (`what`: the crash's message, with an adapter's stderr tail).
  void crashed(const std::string& what) {
    run_.probes = prober_.sent;
    run_.crashed = true;
    const scenarios::Step& step = sc_.steps[current_step_];
    const std::string heading = "step " + std::to_string(current_step_) + " (" +
                                std::string(scenarios::step_kind_name(step.kind)) + ") layer " +
                                std::to_string(current_layer_);
    stop(observed(current_step_, current_layer_, "the cache crashed: " + what), heading, "");
  }

 private:
  /// One step on every layer, then the model's bookkeeping; false: stopped.
  bool run_step(std::size_t step_index) {
    const scenarios::Step& step = sc_.steps[step_index];
    RequestState& req = requests_.at(step.request);
    judge_.begin_step();
    const std::int64_t n = scenarios::step_rows(step);
    const std::int64_t first = scenarios::step_first_position(req.progress);
    const auto index = static_cast<std::int64_t>(step_index);
    const RowSet rows = n > 0 ? make_rows(sc_, 0, step.request, first, n, index) : RowSet{};
    for (std::int32_t l = 0; l < cache_.layers; ++l) {
      const RowSet layer_rows =
          l == 0 ? RowSet{} : (n > 0 ? make_rows(sc_, l, step.request, first, n, index) : RowSet{});
      if (!run_layer(step_index, l, l == 0 ? rows : layer_rows)) return false;
    }
    // Rows no later query can see: every later query of this request sits at
    // or after this writing step's first position (an accept keeps at least
    // it; after a reset the positions are written again before they are
    // read), so a window reaches back no further than first - keys + 1.
    // Memory stays with the window, not the schedule's length.
    // A later trim takes the request back below `first`: its next query
    // reads rows from before the trim, which are kept (trim_floor_).
    const std::int64_t keep_from = std::min(first, trim_floor_[step_index]);
    // A request others start from keeps its rows: a later begin shares them.
    if (n > 0 && keep_from - keys_ > 0 && !prefix_sources_.contains(step.request))
      judge_.forget_before(step.request, keep_from - keys_);
    if (!prefix_sources_.empty() || resumed_.contains(step.request)) {
      // Which step wrote each position (a begin's rows are re-drawn from it).
      for (std::int64_t i = 0; i < n; ++i) writer_[{step.request, first + i}] = Writer{step.request, index};
    }

    // Model bookkeeping shared by all layers (scenarios/step_semantics.hpp).
    // A preempted request is begun again by its next step (a resume).
    req.begun = step.kind != StepKind::kPreempt;
    req.preempted = step.kind == StepKind::kPreempt;
    req.after_reset = step.kind == StepKind::kReset;
    req.finished = step.kind == StepKind::kFinish;
    const scenarios::StepRefusal refusal = scenarios::advance(req.progress, step);
    KVCHECK_ASSERT(refusal == scenarios::StepRefusal::kNone);  // scenarios are validated
    return true;
  }

  /// Begin, probe and call for one layer of a step; false: stopped.
  bool run_layer(std::size_t step_index, std::int32_t l, const RowSet& in) {
    current_step_ = step_index;
    current_layer_ = l;
    const scenarios::Step& step = sc_.steps[step_index];
    const RequestState& req = requests_.at(step.request);
    const std::int64_t n = scenarios::step_rows(step);
    engines::StepCall call;
    call.step = step;
    call.layer = l;
    call.state = req.state;
    call.position = scenarios::step_first_position(req.progress);
    call.rows = n;
    call.step_index = static_cast<std::int64_t>(step_index);
    if (n > 0) {
      call.k = in.k.data();
      call.v = cache_.shared_row ? nullptr : in.v.data();
      call.q = in.q.data();
    }
    begun_events_ = BeginEvents{};
    if (!req.begun) {
      engines::StepCall begin = call;
      begin.op = engines::StepCall::Op::kBegin;
      // A resume (a preempted request with committed rows) begins from its
      // own rows; a first begin from its shared prefix, if any.
      const bool from_rows = req.preempted ? req.progress.length > 0 : req.prefix.has_value();
      if (from_rows && !begin_from_prefix(step_index, begin)) return false;
      if (!from_rows) {
        if (const auto st = cut_.call(begin, &answer_)) {
          return stop(observed(step_index, l, "begin refused: " + refusal_text(*st)),
                      "step " + std::to_string(step_index), "");
        }
        if (!slots_possible(step_index, l, "begin", false)) return false;
        if (!answer_.recompute.empty()) {
          return stop(
              observed(step_index, l, "answer.recompute: a begin with no prefix has no rows to recompute"),
              "step " + std::to_string(step_index) + " (begin) layer " + std::to_string(l), "");
        }
        shadows_[static_cast<std::size_t>(l)].move(answer_.moved);
      }
      settle_begin(step_index, l);
    }
    return call_after_begin(step_index, call, in);
  }

  /// What a begin's answer did besides binding its request: its padding and
  /// frees, applied to the shadow map at once (its moves and stored rows
  /// already are), and counted with the step that follows it on the layer
  /// (the begin is part of that step: one observation per step and layer).
  struct BeginEvents {
    std::int64_t padded = 0;
    std::int64_t moved = 0;
    std::int64_t freed = 0;
    std::int64_t cached = 0;
    std::int64_t evicted = 0;  ///< cached rows the begin's stored-again rows took over
    std::int64_t freed_visible = 0;
    std::string freed_detail;
    std::int64_t other_layer = 0;  ///< other-layer collisions of its writes (a pool shared by the layers)
    std::string other_layer_detail;
  };

  /// The begin's padding and frees on layer `l`, judged as any step's: a
  /// row freed while a query still to run may read it (the step the begin
  /// starts included) is a freed visible row.
  void settle_begin(std::size_t step_index, std::int32_t l) {
    ShadowMap& shadow = shadows_[static_cast<std::size_t>(l)];
    const std::int64_t request = sc_.steps[step_index].request;
    shadow.pad(answer_.padded, request);
    claim_shared(step_index, l, &begun_events_.other_layer, &begun_events_.other_layer_detail,
                 &begun_events_.evicted);
    begun_events_.padded = static_cast<std::int64_t>(answer_.padded.size());
    begun_events_.moved = static_cast<std::int64_t>(answer_.moved.size());
    begun_events_.freed = static_cast<std::int64_t>(answer_.freed.size());
    begun_events_.cached = static_cast<std::int64_t>(answer_.cached.size());
    note_released(l);
    if (answer_.freed.empty() && answer_.cached.empty()) return;
    // A prefix row the begin stored again keeps it (as a step's own written slots).
    const std::span<const std::int64_t> keep =
        answer_.has_written ? std::span<const std::int64_t>(answer_.written) : std::span<const std::int64_t>();
    std::vector<std::int64_t> lost_slots;
    const Visibility visible = visibility_at(step_index, l, false);
    std::vector<ShadowRow> lost = shadow.release(answer_.freed, keep, visible, &lost_slots);
    // Cached slots keep their rows for a later prefix begin; one still
    // visible is lost all the same (docs/semantics.md "Cached rows").
    const std::vector<ShadowRow> lost_cached =
        shadow.release(answer_.cached, keep, visible, &lost_slots, true);
    lost.insert(lost.end(), lost_cached.begin(), lost_cached.end());
    begun_events_.freed_visible = static_cast<std::int64_t>(lost.size());
    if (!lost.empty()) begun_events_.freed_detail = freed_text(lost_slots.front(), lost.front()) + " (freed by the begin)";
  }

  static std::string freed_text(std::int64_t slot, const ShadowRow& row) {
    return "slot " + std::to_string(slot) + " holding request " + std::to_string(row.request) + " position " +
           std::to_string(row.position);
  }

  /// Whether every slot the answer in answer_ names is one the cache has:
  /// not negative (but -1 where the protocol gives it a meaning: a read to
  /// ignore, a prefix row a begin keeps sharing), and a written or read
  /// slot below slot_end_. A well-formed
  /// answer naming any other slot (a free list's sentinel, a block past the
  /// pool) is a failure of the cache, not bad input: the run stops at the
  /// step, naming the layer and the answer's field. false: stopped.
  bool slots_possible(std::size_t step_index, std::int32_t l, const std::string& op, bool prefix_begin) {
    std::string field;  // the first impossible slot's path in the answer (built only for it)
    std::int64_t value = 0;
    // Rows of tokens are written and read in the pool; padding, moves and
    // frees may also use slots of the cache's own past it (a scratch area:
    // PROTOCOL.md "Padding, moves and frees"), so only a negative one is
    // impossible there.
    bool in_pool = true;
    const auto bad = [&](std::int64_t slot, bool minus_one) {
      return field.empty() && !(minus_one && slot == -1) && !(slot >= 0 && (!in_pool || slot < slot_end_));
    };
    const auto index = [](std::size_t i) { return "[" + std::to_string(i) + "]"; };
    const auto list = [&](const std::vector<std::int64_t>& slots, const char* name, bool minus_one) {
      for (std::size_t i = 0; i < slots.size() && field.empty(); ++i) {
        if (bad(slots[i], minus_one)) {
          field = name + index(i);
          value = slots[i];
        }
      }
    };
    list(answer_.written, "written", prefix_begin);
    for (std::size_t i = 0; i < answer_.recomputed.size() && field.empty(); ++i) {
      if (bad(answer_.recomputed[i].second, false)) {
        field = "recomputed" + index(i) + "[1]";
        value = answer_.recomputed[i].second;
      }
    }
    for (std::size_t q = 0; q + 1 < answer_.read_offsets.size() && field.empty(); ++q) {
      for (auto i = answer_.read_offsets[q]; i < answer_.read_offsets[q + 1] && field.empty(); ++i) {
        const std::int64_t slot = answer_.read_slots[static_cast<std::size_t>(i)];
        if (bad(slot, true)) {
          field = "read" + index(q) + index(static_cast<std::size_t>(i - answer_.read_offsets[q]));
          value = slot;
        }
      }
    }
    in_pool = false;
    list(answer_.padded, "padded", false);
    list(answer_.freed, "freed", false);
    list(answer_.cached, "cached", false);
    for (std::size_t i = 0; i < answer_.moved.size() && field.empty(); ++i) {
      const auto [from, to] = answer_.moved[i];
      if (bad(from, false)) {
        field = "moved" + index(i) + "[0]";
        value = from;
      }
      if (bad(to, false)) {
        field = "moved" + index(i) + "[1]";
        value = to;
      }
    }
    if (field.empty()) return true;
    const std::string range =
        slot_end_ == std::numeric_limits<std::int64_t>::max()
            ? std::string("slots are 0 or more")
            : "the cache's slots are 0 .. " + std::to_string(slot_end_ - 1) + ", " + slot_end_text_;
    return stop(observed(step_index, l, "answer." + field + ": slot " + std::to_string(value) +
                                             " is not a slot of the cache (" + range + ")"),
                "step " + std::to_string(step_index) + " (" + op + ") layer " + std::to_string(l), "");
  }

  /// A begin from a shared prefix on one layer; false: stopped. The begin
  /// carries the other request's rows at 0 .. n-1 (as the steps that wrote
  /// them drew them); the cache answers where it stored any of them again.
  /// A resume (docs/semantics.md "Preemption") is such a begin whose source
  /// is the request itself, carrying its committed rows 0 .. L-1.
  bool begin_from_prefix(std::size_t step_index, engines::StepCall begin) {
    const RequestState& req = requests_.at(begin.step.request);
    const bool resume = req.preempted;
    const std::int64_t source = resume ? begin.step.request : req.prefix->request;
    const std::int64_t n = resume ? req.progress.length : req.prefix->positions;
    const std::int32_t l = begin.layer;
    RowSet rows;
    for (std::int64_t p = 0; p < n; ++p) {
      const Writer& w = writer_.at({source, p});
      const RowSet one = make_rows(sc_, l, w.request, p, 1, w.step);
      rows.k.insert(rows.k.end(), one.k.begin(), one.k.end());
      rows.v.insert(rows.v.end(), one.v.begin(), one.v.end());
    }
    begin.prefix_request = source;
    begin.prefix_positions = n;
    begin.rows = 0;
    begin.k = rows.k.data();
    begin.v = cache_.shared_row ? nullptr : rows.v.data();
    begin.q = nullptr;
    if (const auto st = cut_.call(begin, &answer_)) {
      return stop(observed(step_index, l, "begin refused: " + refusal_text(*st)), "step " + std::to_string(step_index), "");
    }
    if (!slots_possible(step_index, l, "begin", true)) return false;
    if (!recompute_possible(step_index, l, n)) return false;
    // Moves first (a copy before the rows are stored), as in any step.
    shadows_[static_cast<std::size_t>(l)].move(answer_.moved);
    // The first position the begun request's queries see on this layer: a
    // cached row it shares from there on is held again.
    const std::int64_t visible_from =
        std::max<std::int64_t>(0, n - layer_keys_[static_cast<std::size_t>(l)] + 1);
    ShadowMap::PrefixTally tally;
    const std::vector<std::uint64_t> seqs = shadows_[static_cast<std::size_t>(l)].begin_prefix(
        begin.step.request, source, n,
        answer_.has_written ? std::span<const std::int64_t>(answer_.written)
                            : std::span<const std::int64_t>(),
        visible_from, &tally, caps_.block_size, answer_.recompute);
    begun_events_.evicted = tally.evicted_rows;
    // Left to the request's next writing step on this layer (docs/semantics.md
    // "Recompute in a step"), sorted: each is looked up once.
    if (!answer_.recompute.empty()) {
      std::vector<std::int64_t>& left = recompute_pending_[{l, begin.step.request}];
      left = answer_.recompute;
      std::sort(left.begin(), left.end());
    }
    judge_.share_prefix(l, begin.step.request, source, n, seqs);
    if (!decoders_.empty())
      decoders_[static_cast<std::size_t>(l)].share_prefix(begin.step.request, source, n);
    if (l == 0 && resume) {
      ++run_.resumes;
      if (tally.held_positions > 0) ++run_.resumes_with_hits;
    }
    if (l == 0 && !resume) {
      for (std::int64_t p = 0; p < n; ++p) writer_[{begin.step.request, p}] = writer_.at({req.prefix->request, p});
      PrefixObservation began;
      began.request = begin.step.request;
      began.source = req.prefix->request;
      began.positions = n;
      if (answer_.has_written) {
        began.stored_again = std::count_if(answer_.written.begin(), answer_.written.end(),
                                           [](std::int64_t slot) { return slot >= 0; });
      }
      began.evicted_positions = tally.evicted_positions;
      began.recomputed_in_step = static_cast<std::int64_t>(answer_.recompute.size());
      began.begin_step = static_cast<std::int64_t>(step_index);
      run_.prefixes.push_back(began);
    }
    return true;
  }

  /// A prefix begin's `recompute` (docs/semantics.md "Recompute in a
  /// step"): from a cache that declared it, prefix positions below n, each
  /// once, none stored at the begin; false: stopped. (The exec protocol's
  /// reader already refuses a malformed list; a C++ cache is held to the
  /// same rules here.)
  bool recompute_possible(std::size_t step_index, std::int32_t l, std::int64_t n) {
    std::string problem;
    std::vector<bool> seen(static_cast<std::size_t>(n), false);
    for (std::size_t i = 0; i < answer_.recompute.size() && problem.empty(); ++i) {
      const std::int64_t p = answer_.recompute[i];
      const std::string at = "answer.recompute[" + std::to_string(i) + "]: position " + std::to_string(p);
      if (!caps_.recompute_in_step) {
        problem =
            "answer.recompute: prefix rows left to a step by a cache that did not declare recompute_in_step";
      } else if (p < 0 || p >= n) {
        problem = at + " is not a prefix position (0 .. " + std::to_string(n - 1) + ")";
      } else if (seen[static_cast<std::size_t>(p)]) {
        problem = at + " listed twice";
      } else if (answer_.has_written && answer_.written[static_cast<std::size_t>(p)] >= 0) {
        problem = at + " is also stored at the begin";
      } else {
        seen[static_cast<std::size_t>(p)] = true;
      }
    }
    if (problem.empty()) return true;
    return stop(observed(step_index, l, problem),
                "step " + std::to_string(step_index) + " (begin) layer " + std::to_string(l), "");
  }

  /// The prefix rows a writing step recomputed (docs/semantics.md
  /// "Recompute in a step"), stored in the shadow map before the step's own
  /// rows: each a position its request's begin left to this step on this
  /// layer, once. A position left and not stored stays absent (missing
  /// where a query needs it). Two of them in one slot, or one in a slot a
  /// row of the step also writes, is a same-step collision. false: stopped.
  bool store_recomputed(std::size_t step_index, const engines::StepCall& call, StepObservation* obs) {
    const std::int64_t request = call.step.request;
    const auto pending = recompute_pending_.find({call.layer, request});
    std::vector<std::int64_t> left;
    if (pending != recompute_pending_.end()) {
      left = std::move(pending->second);
      recompute_pending_.erase(pending);
    }
    if (answer_.recomputed.empty()) return true;
    std::string problem;
    std::vector<bool> stored(left.size(), false);  // `left` is sorted (begin_from_prefix)
    for (std::size_t i = 0; i < answer_.recomputed.size() && problem.empty(); ++i) {
      const std::int64_t p = answer_.recomputed[i].first;
      const auto it = std::lower_bound(left.begin(), left.end(), p);
      const auto k = static_cast<std::size_t>(it - left.begin());
      if (it == left.end() || *it != p || stored[k]) {
        const bool earlier = it != left.end() && *it == p;  // left, and stored already
        problem =
            "answer.recomputed[" + std::to_string(i) + "]: position " + std::to_string(p) +
            (earlier
                 ? " stored twice"
                 : " was not left to this step by the request's begin on this layer (its recompute list)");
      }
      if (problem.empty()) stored[k] = true;
    }
    if (!problem.empty()) {
      obs->error = problem;
      return stop(
          std::move(*obs),
          "step " + std::to_string(step_index) + " (" + obs->kind + ") layer " + std::to_string(call.layer),
          "");
    }
    ShadowMap& shadow = shadows_[static_cast<std::size_t>(call.layer)];
    const std::vector<std::uint64_t> seqs = shadow.recompute(request, answer_.recomputed, &obs->evicted_rows);
    judge_.recompute_rows(call.layer, request, answer_.recomputed, seqs);
    obs->recomputed_rows = static_cast<std::int64_t>(answer_.recomputed.size());
    // Same-step collisions: a slot two recomputed rows, or one and a row of the step, write.
    std::map<std::int64_t, int> times;
    for (const auto& [p, slot] : answer_.recomputed) ++times[slot];
    if (answer_.has_written)
      for (const std::int64_t slot : answer_.written)
        if (times.contains(slot)) ++times[slot];
    for (const auto& [slot, count] : times) obs->collisions.same_step += count - 1;
    if (call.layer == 0) ++run_.steps_recomputing;
    return true;
  }

  /// The probe and the call of one layer of a step (after any begin); false: stopped.
  bool call_after_begin(std::size_t step_index, const engines::StepCall& call, const RowSet& in) {
    const scenarios::Step& step = sc_.steps[step_index];
    const RequestState& req = requests_.at(step.request);
    const std::int64_t n = scenarios::step_rows(step);
    const std::int32_t l = call.layer;
    const std::string heading = "step " + std::to_string(step_index);
    const std::string kind(scenarios::step_kind_name(step.kind));
    if (options_.probes) {
      // One probe per step and layer, rotating through those that apply
      // (right after a reset, the stale-revision probe first: Prober::choose).
      const auto apply = prober_.applicable(step, req.progress);
      if (!apply.empty()) {
        const std::string name = prober_.choose(apply, call.step_index, req.after_reset);
        const std::string problem = prober_.run(name, call, req.progress, in.k);
        if (!problem.empty()) {
          return stop(observed(step_index, l, problem),
                      heading + " (" + kind + ") layer " + std::to_string(l), "");
        }
      }
    }
    if (n > 0) return call_with_rows(step_index, call, in);
    if (const auto st = cut_.call(call, &answer_)) {
      return stop(observed(step_index, l, "refused: " + refusal_text(*st)), heading + " (" + kind + ")", "");
    }
    if (!slots_possible(step_index, l, kind, false)) return false;
    if (!answer_.recomputed.empty()) {
      return stop(observed(step_index, l,
                           "answer.recomputed: a " + kind +
                               " writes no rows, so it stores no recomputed prefix rows"),
                  heading + " (" + kind + ") layer " + std::to_string(l), "");
    }
    // Positions its begin left and no writing step stored stay absent.
    recompute_pending_.erase({l, step.request});
    // A step that writes no rows (accept, finish, reset) is observed too,
    // with no error: every step kind appears in the reports. Its answer may
    // still move, pad and free slots.
    StepObservation obs = observed(step_index, l, "");
    ShadowMap& shadow = shadows_[static_cast<std::size_t>(l)];
    shadow.move(answer_.moved);
    shadow.pad(answer_.padded, step.request);
    claim_shared(step_index, l, &obs.collisions.other_layer, &obs.other_layer_detail, &obs.evicted_rows);
    settle_resident(step_index, l, &obs);
    run_.steps.push_back(std::move(obs));
    if (options_.record_resident)
      run_.steps.back().resident = shadows_[static_cast<std::size_t>(l)].resident();
    return true;
  }

  /// A step that writes rows: the call, the slots it reported, the outputs
  /// judged; false: the cache refused it (stopped).
  bool call_with_rows(std::size_t step_index, const engines::StepCall& call, const RowSet& in) {
    const scenarios::Step& step = sc_.steps[step_index];
    const std::int64_t n = call.rows;
    const engines::StepStatus st = cut_.call(call, &answer_);
    StepObservation obs = observed(step_index, call.layer, "");
    if (step.kind == StepKind::kPrefill) obs.order = scenarios::order_name(step.order);
    if (st) {
      obs.error = refusal_text(*st);
      const std::string heading = "step " + std::to_string(step_index) + " (" + obs.kind + ")";
      return stop(std::move(obs), heading, "implementation refused: ");
    }
    if (!slots_possible(step_index, call.layer, obs.kind, false)) return false;
    KVCHECK_ASSERT(static_cast<std::int64_t>(answer_.out.size()) == n * q_width_);
    if (!store_recomputed(step_index, call, &obs)) return false;
    const ShadowMap& shadow = shadows_[static_cast<std::size_t>(call.layer)];
    judge_.write_rows(call.layer, step.request, call.position, n, in, answer_, shadow, &obs);
    observe_slots(call, &obs);
    claim_shared(step_index, call.layer, &obs.collisions.other_layer, &obs.other_layer_detail,
                 &obs.evicted_rows);
    judge_.judge_outputs(call.layer, step.request, call.position, n, in, answer_, &obs);
    judge_.settle_reads(call.layer, n, answer_, shadow);
    if (options_.record_outputs) {
      for (std::int64_t i = 0; i < n; ++i) {
        const double* out = answer_.out.data() + i * q_width_;
        obs.queries[static_cast<std::size_t>(i)].out.assign(out, out + q_width_);
      }
    }
    settle_resident(step_index, call.layer, &obs);
    if (options_.record_resident) obs.resident = shadow.resident();
    run_.steps.push_back(std::move(obs));
    return true;
  }

  /// After a step's answer is observed: its frees (a row still visible
  /// freed is counted), then the resident set against the declared bound,
  /// for a cache that reports frees or declares a bound.
  void settle_resident(std::size_t step_index, std::int32_t layer, StepObservation* obs) {
    ShadowMap& shadow = shadows_[static_cast<std::size_t>(layer)];
    // The begin that started the step's request on this layer, if any, first.
    obs->padded_slots = begun_events_.padded + static_cast<std::int64_t>(answer_.padded.size());
    obs->moved_rows = begun_events_.moved + static_cast<std::int64_t>(answer_.moved.size());
    obs->freed_slots = begun_events_.freed + static_cast<std::int64_t>(answer_.freed.size());
    obs->cached_slots = begun_events_.cached + static_cast<std::int64_t>(answer_.cached.size());
    obs->evicted_rows += begun_events_.evicted;
    obs->freed_visible = begun_events_.freed_visible;
    obs->freed_detail = begun_events_.freed_detail;
    obs->collisions.other_layer += begun_events_.other_layer;
    if (!begun_events_.other_layer_detail.empty())
      obs->other_layer_detail = begun_events_.other_layer_detail;  // it came first
    begun_events_ = BeginEvents{};
    // Built once for the step's frees and its per-request counts.
    std::optional<Visibility> visibility;
    const auto visible = [&]() -> const Visibility& {
      if (!visibility) visibility = visibility_at(step_index, layer, true);
      return *visibility;
    };
    note_released(layer);
    // The step's own slots: its rows', and the prefix rows it recomputed.
    std::vector<std::int64_t> keep;
    if (answer_.has_written) keep = answer_.written;
    for (const auto& [position, slot] : answer_.recomputed) keep.push_back(slot);
    // Frees empty their slots; cached slots keep their rows for a later
    // prefix begin (docs/semantics.md "Cached rows"). Either, of a row still
    // visible, loses it.
    for (const bool cache : {false, true}) {
      const std::vector<std::int64_t>& slots = cache ? answer_.cached : answer_.freed;
      if (slots.empty()) continue;
      std::vector<std::int64_t> lost_slots;
      const std::vector<ShadowRow> lost = shadow.release(slots, keep, visible(), &lost_slots, cache);
      obs->freed_visible += static_cast<std::int64_t>(lost.size());
      if (!lost.empty() && obs->freed_detail.empty())
        obs->freed_detail = freed_text(lost_slots.front(), lost.front()) + (cache ? " (cached)" : "");
    }
    if (caps_.reports_frees && caps_.free_deferral_steps)
      judge_free_deadline(step_index, layer, visible(), obs);
    if (!caps_.reports_frees && !caps_.resident_bound.declared() && !caps_.reports_cached) return;
    // Per request, a shared row counts for the requests that still see it
    // (a request's table drops a block its window left, while a sharer's
    // keeps it): the visibility after this step decides.
    const ShadowMap::Resident r =
        caps_.resident_bound.declared() && caps_.resident_bound.per_request
            ? shadow.resident_counts(caps_.block_size, std::cref(visible()),
                                     [&v = visible()](std::int64_t request) { return v.live(request); })
            : shadow.resident_totals(caps_.block_size);
    obs->resident_rows = r.rows;
    obs->resident_blocks = caps_.block_size > 0 ? r.blocks : -1;
    if (caps_.reports_cached) {
      obs->cached_rows = r.cached_rows;
      obs->cached_blocks = caps_.block_size > 0 ? r.cached_blocks : -1;
    }
    const engines::ResidentBound& bound = caps_.resident_bound;
    if (!bound.declared()) return;
    const bool blocks = bound.unit == engines::ResidentBound::Unit::kBlocks;
    obs->bound_limit = resident_limit_;
    obs->bound_unit = std::string(blocks ? "blocks" : "rows") + (bound.per_request ? " per request" : " in all");
    obs->bound_held = blocks ? (bound.per_request ? r.request_blocks : r.blocks)
                             : (bound.per_request ? r.request_rows : r.rows);
    if (caps_.shared_pool && cache_.layers > 1) {
      obs->bound_unit += " across layers";
      obs->bound_held = held_across_layers(step_index, layer, visible());
    }
  }

  /// Which rows are still visible once a step is done: per live request
  /// (begun, not finished), the positions [first - keys + 1, end) of its range.
  struct Visibility {
    std::map<std::int64_t, std::pair<std::int64_t, std::int64_t>> range;  // request -> [next, written)
    std::int64_t keys = 1;
    bool operator()(const ShadowRow& row) const {
      const auto it = range.find(row.request);
      return it != range.end() && row.position >= it->second.first - keys + 1 && row.position < it->second.second;
    }
    /// Whether `request` is still live once the step is done.
    bool live(std::int64_t request) const { return range.contains(request); }
  };

  /// Whether a row is still visible once step `step_index` is done
  /// (`after_step`; else before it runs: at its begin): a row of a live
  /// request that a query still to run may read (from the first position
  /// the next query sees, or a later trim takes it back to, back a window
  /// of `layer`, up to the written length).
  Visibility visibility_at(std::size_t step_index, std::int32_t layer, bool after_step) const {
    const scenarios::Step& step = sc_.steps[step_index];
    Visibility v;
    v.keys = layer_keys_[static_cast<std::size_t>(layer)];
    auto& range = v.range;
    std::map<std::int64_t, scenarios::RequestProgress> ahead;             // request -> its progress
    for (const auto& [id, r] : requests_) {
      if (r.finished || (!r.begun && id != step.request)) continue;
      if (after_step && id == step.request && step.kind == StepKind::kFinish) continue;
      // A preempted request needs none of its rows until its resume stores
      // them again (docs/semantics.md "Preemption"): none is visible.
      if (after_step && id == step.request && step.kind == StepKind::kPreempt) continue;
      scenarios::RequestProgress p = r.progress;
      if (after_step && id == step.request) scenarios::advance(p, step);
      range[id] = {p.next_query_first(), p.speculative_length()};
      ahead[id] = p;
    }
    // A later trim takes a request back: its rows from there are read again
    // (until a finish or reset, after which its positions are written anew).
    for (std::size_t i = step_index + (after_step ? 1 : 0); i < sc_.steps.size() && !ahead.empty(); ++i) {
      const scenarios::Step& later = sc_.steps[i];
      const auto it = ahead.find(later.request);
      if (it == ahead.end()) continue;
      if (later.kind == StepKind::kFinish || later.kind == StepKind::kReset) {
        ahead.erase(it);
        continue;
      }
      scenarios::advance(it->second, later);
      auto& first = range[later.request].first;
      if (later.kind == StepKind::kTrim) first = std::min(first, it->second.length);
    }
    return v;
  }

  /// A pool shared by the layers (docs/semantics.md "One pool across
  /// layers"): what the declared bound counts over every layer together,
  /// once layer `layer` has run step `step_index` (the layers before it have
  /// run it, those after it not yet: the cache's pool at this moment). A
  /// request holds its rows and blocks of every layer.
  std::int64_t held_across_layers(std::size_t step_index, std::int32_t layer, const Visibility& own) const {
    const engines::ResidentBound& bound = caps_.resident_bound;
    const bool blocks = bound.unit == engines::ResidentBound::Unit::kBlocks;
    std::int64_t total = 0;
    std::map<std::int64_t, ShadowMap::RequestHeld> by_request;
    for (std::int32_t m = 0; m < cache_.layers; ++m) {
      const ShadowMap& shadow = shadows_[static_cast<std::size_t>(m)];
      if (!bound.per_request) {
        const ShadowMap::Resident r = shadow.resident_totals(caps_.block_size);
        total += blocks ? r.blocks : r.rows;
        continue;
      }
      const Visibility v = m == layer ? own : visibility_at(step_index, m, m < layer);
      shadow.resident_counts(
          caps_.block_size, std::cref(v), [&v](std::int64_t request) { return v.live(request); },
          &by_request);
    }
    for (const auto& [request, held] : by_request) total = std::max(total, blocks ? held.blocks : held.rows);
    return total;
  }

  /// The slots the answer in answer_ wrote: its rows' (a prefix begin's -1
  /// left out), its padding, its moves' destinations.
  std::vector<std::int64_t> answer_writes() const {
    std::vector<std::int64_t> slots;
    for (const std::int64_t slot : answer_.written)
      if (slot >= 0) slots.push_back(slot);
    for (const auto& [position, slot] : answer_.recomputed) slots.push_back(slot);
    slots.insert(slots.end(), answer_.padded.begin(), answer_.padded.end());
    for (const auto& [from, to] : answer_.moved) slots.push_back(to);
    return slots;
  }

  /// A pool shared by the layers (docs/semantics.md "One pool across
  /// layers"): the slots layer `l`'s answer just wrote hold layer l's rows
  /// now, whatever another layer held there. That row leaves the other
  /// layer's shadow map (a later read of it there finds it overwritten); one
  /// that layer still sees (a query still to run on it may read it) is a
  /// collision (`collisions`, the first in `detail`), a cached one is
  /// evicted (`evicted`). The layers before `l` have run step `step_index`,
  /// the layers after it not yet. Nothing for a cache whose layers have
  /// pools of their own.
  void claim_shared(std::size_t step_index, std::int32_t l, std::int64_t* collisions, std::string* detail,
                    std::int64_t* evicted) {
    if (!caps_.shared_pool || cache_.layers < 2) return;
    const std::vector<std::int64_t> slots = answer_writes();
    if (slots.empty()) return;
    // A slot another layer let go of, taken by this one (coverage class slot_across_layers).
    for (const std::int64_t slot : slots) {
      const auto it = released_by_.find(slot);
      if (it == released_by_.end()) continue;
      if (it->second != l) ++run_.slots_across_layers;
      released_by_.erase(it);
    }
    for (std::int32_t m = 0; m < cache_.layers; ++m) {
      if (m == l) continue;
      ShadowMap& other = shadows_[static_cast<std::size_t>(m)];
      std::optional<Visibility> visibility;
      for (const std::int64_t slot : slots) {
        const ShadowRow row = other.take(slot);
        if (row.request < 0 || row.padding) continue;
        if (row.cached) {
          ++*evicted;
          continue;
        }
        if (!visibility) visibility = visibility_at(step_index, m, m < l);
        // A stale row, or a copy whose row another slot still holds, loses nothing.
        if (!other.is_latest(row) || other.held_elsewhere(slot, row.write_seq) || !(*visibility)(row))
          continue;
        if (++*collisions == 1) {
          *detail = "layer " + std::to_string(l) + " wrote " + freed_text(slot, row) + " on layer " +
                    std::to_string(m) + ", which layer " + std::to_string(m) + " still sees";
        }
      }
    }
  }

  /// A pool shared by the layers: the slots layer `l`'s answer released
  /// (freed or cached), for claim_shared to see which layer a later write
  /// takes them from.
  void note_released(std::int32_t l) {
    if (!caps_.shared_pool || cache_.layers < 2) return;
    for (const std::vector<std::int64_t>* slots : {&answer_.freed, &answer_.cached}) {
      for (const std::int64_t slot : *slots) released_by_[slot] = l;
    }
  }

  /// When a block (a slot, without a block size) left the window: the step
  /// it was first seen to, its request, and how many of that request's
  /// write steps have run since.
  struct LeftBlock {
    std::int64_t step = 0;
    std::int64_t request = 0;
    std::int64_t steps_since = 0;
  };

  /// A cache declaring a free deferral of N steps (docs/semantics.md
  /// "Lookahead slots and deferred frees"): after step `step_index` on
  /// `layer`, every block whose rows have all left the window N or more of
  /// their request's write steps ago must no longer be held. A row has left
  /// once it is below the window of its request's next query by more than
  /// that request's last committed row (position < first - max(keys, 2) + 1:
  /// with one key the last row shares its block with the next one written);
  /// rows of a finished request, rows another request begins from (a prefix
  /// cache keeps them), copies and stale rows above the window never leave.
  void judge_free_deadline(std::size_t step_index, std::int32_t layer, const Visibility& v,
                           StepObservation* obs) {
    const std::int64_t deferral = *caps_.free_deferral_steps;
    const scenarios::Step& step = sc_.steps[step_index];
    const bool counts = scenarios::step_kind_writes_rows(step.kind);
    const std::int64_t unit = caps_.block_size > 0 ? caps_.block_size : 1;
    const std::int64_t reach = std::max<std::int64_t>(v.keys, 2) - 1;
    struct Held {
      bool left = true;
      std::int64_t request = -1;
      std::int64_t slot = -1;  // the lowest slot holding a row, and its row
      ShadowRow row;
    };
    std::map<std::int64_t, Held> blocks;  // block -> what it holds
    shadows_[static_cast<std::size_t>(layer)].for_each_slot([&](std::int64_t slot, const ShadowRow& row) {
      if (row.padding || row.request < 0) return;
      Held& h = blocks[slot / unit];
      if (h.slot < 0 || slot < h.slot) {
        h.slot = slot;
        h.row = row;
      }
      if (h.request >= 0 && h.request != row.request) h.left = false;  // two requests' rows: not judged
      h.request = row.request;
      const auto it = v.range.find(row.request);
      const bool left = !row.copied && it != v.range.end() && !prefix_sources_.contains(row.request) &&
                        row.position < it->second.first - reach;
      if (!left) h.left = false;
    });
    std::map<std::int64_t, LeftBlock>& since = left_blocks_[static_cast<std::size_t>(layer)];
    for (auto it = since.begin(); it != since.end();) {
      const auto h = blocks.find(it->first);
      it = h == blocks.end() || !h->second.left ? since.erase(it) : std::next(it);
    }
    for (const auto& [block, h] : blocks) {
      if (!h.left) continue;
      auto [it, fresh] =
          since.try_emplace(block, LeftBlock{static_cast<std::int64_t>(step_index), h.request, 0});
      if (!fresh && counts && step.request == it->second.request) ++it->second.steps_since;
      if (it->second.steps_since < deferral) continue;
      if (++obs->late_frees == 1) {
        obs->late_detail = freed_text(h.slot, h.row) +
                           (caps_.block_size > 0 ? " (block " + std::to_string(block) + ")" : "") +
                           " still held " + std::to_string(it->second.steps_since) +
                           " write steps of request " + std::to_string(h.request) +
                           " after it left the window at step " + std::to_string(it->second.step) +
                           ": the declared free deferral is " + std::to_string(deferral) + " steps";
      }
    }
  }

  /// Slots: everything from what the cache reported, via the shadow map
  /// (and, without read slots, from position-coded outputs).
  void observe_slots(const engines::StepCall& call, StepObservation* obs) {
    const std::int64_t n = call.rows;
    StepFacts facts;
    facts.request = call.step.request;
    facts.state = call.state;
    facts.first_position = call.position;
    facts.rows = n;
    facts.window_keys = layer_keys_[static_cast<std::size_t>(call.layer)];
    facts.has_written = answer_.has_written;
    facts.written = answer_.written;
    facts.has_reads = answer_.has_reads;
    facts.read_offsets = answer_.read_offsets;
    facts.read_slots = answer_.read_slots;
    facts.view = answer_.view;
    facts.duplicate_slots = answer_.duplicate_slots;
    facts.moved = answer_.moved;
    facts.padded = answer_.padded;
    facts.ring = caps_.ring_addressing;
    facts.ring_rows = cache_.ring_rows;
    facts.record_reads = options_.record_reads || !caps_.computes_outputs;
    facts.record_ring = options_.record_ring;
    shadows_[static_cast<std::size_t>(call.layer)].observe(facts, obs);
    if (decoders_.empty() || (facts.has_written && facts.has_reads)) return;
    PositionDecoder& decoder = decoders_[static_cast<std::size_t>(call.layer)];
    decoder.record_writes(call.step.request, call.position, n, call.step_index);
    for (std::int64_t i = 0; i < n; ++i) {
      decoder.decode(call.step.request, answer_.out.data() + i * q_width_,
                     &obs->queries[static_cast<std::size_t>(i)]);
    }
  }

  /// The observation of step `step_index` on `layer` before anything is
  /// judged: which request, state and first position, and `error`.
  StepObservation observed(std::size_t step_index, std::int32_t layer, const std::string& error) const {
    const scenarios::Step& step = sc_.steps[step_index];
    const RequestState& req = requests_.at(step.request);
    StepObservation obs;
    obs.step = static_cast<std::int64_t>(step_index);
    obs.layer = layer;
    obs.kind = std::string(scenarios::step_kind_name(step.kind));
    obs.request = step.request;
    obs.state = req.state;
    obs.first_position = scenarios::step_first_position(req.progress);
    obs.error = error;
    return obs;
  }

  /// Ends the run at a step the cache got wrong (a refusal, a probe): the
  /// failure "HEADING: PREFIX ERROR" and the step recorded as a failed
  /// observation, so the verdict and the reports agree. Returns false.
  bool stop(StepObservation obs, const std::string& heading, const std::string& prefix) {
    mark_failed(&run_, heading + ": " + prefix + obs.error);
    run_.steps.push_back(std::move(obs));
    return false;
  }

  const Scenario& sc_;
  const scenarios::CacheConfig& cache_;
  const RunOptions& options_;
  const engines::Capabilities& caps_;
  engines::CacheUnderTest& cut_;
  OutputJudge<Real>& judge_;
  RunObservation& run_;
  const std::vector<std::int64_t> layer_keys_;  ///< keys a query of each layer sees
  const std::int64_t keys_;                     ///< the widest of them
  const std::int64_t q_width_;
  std::vector<ShadowMap> shadows_;  // [layers] slot -> the row the cache last said it wrote there
  std::vector<PositionDecoder> decoders_;
  std::map<std::int64_t, RequestState> requests_;
  std::vector<std::int64_t> trim_floor_;  // [steps] see trim_floors()
  std::int64_t resident_limit_ = 0;       // the declared resident bound for this run (0: none)
  // [layers] block -> when it left the window (judge_free_deadline)
  std::vector<std::map<std::int64_t, LeftBlock>> left_blocks_ =
      std::vector<std::map<std::int64_t, LeftBlock>>(static_cast<std::size_t>(cache_.layers));
  std::int64_t slot_end_ = std::numeric_limits<std::int64_t>::max();  // one past the highest slot (set_slot_end)
  std::string slot_end_text_;
  BeginEvents begun_events_;  // the begin of the step under way on this layer (settle_begin)
  /// (layer, request) -> prefix positions its begin left to its next
  /// writing step on that layer (docs/semantics.md "Recompute in a step").
  std::map<std::pair<std::int32_t, std::int64_t>, std::vector<std::int64_t>> recompute_pending_;
  std::set<std::int64_t> prefix_sources_;  // requests another request begins from
  std::set<std::int64_t> resumed_;         // requests the schedule preempts (a resume re-sends their rows)
  // A pool shared by the layers: slot -> the layer that last released it (note_released).
  std::unordered_map<std::int64_t, std::int32_t> released_by_;
  struct Writer {
    std::int64_t request;  // whose rows (a shared prefix's: the request it came from)
    std::int64_t step;     // the step that wrote the position
  };
  std::map<std::pair<std::int64_t, std::int64_t>, Writer> writer_;  // (request, position), with prefix sources only
  Prober prober_;
  engines::StepAnswer answer_;    // reused between calls
  std::size_t current_step_ = 0;  // the step and layer under way (crashed())
  std::int32_t current_layer_ = 0;
};

/// What a C++ cache threw, as the crash of the run it threw in: a
/// kvcheck::Error (bad input, a broken provider, a crash already) and an
/// allocation failure pass through unchanged.
[[noreturn]] void rethrow_as_crash(const std::string& where) {
  try {
    throw;
  } catch (const Error&) {
    throw;
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {
    throw engines::CacheCrash(ErrorId::kAdapter, where, std::string("the cache threw: ") + e.what(), false);
  } catch (...) {
    throw engines::CacheCrash(ErrorId::kAdapter, where, "the cache threw something that is not a std::exception",
                              false);
  }
}

/// The cache under test as the driver and the prober call it: whatever a
/// call throws that is not kvcheck's own error becomes a CacheCrash, so
/// only the cache's exceptions (never the checker's) are findings.
class CrashGuard final : public engines::CacheUnderTest {
 public:
  explicit CrashGuard(engines::CacheUnderTest& inner) : inner_(inner) {}
  engines::StepStatus call(const engines::StepCall& c, engines::StepAnswer* answer) override {
    try {
      return inner_.call(c, answer);
    } catch (...) {
      rethrow_as_crash("call");
    }
  }
  engines::StepStatus probe(const std::string& name, const engines::StepCall& context) override {
    try {
      return inner_.probe(name, context);
    } catch (...) {
      rethrow_as_crash("probe " + name);
    }
  }
  std::optional<std::uint64_t> fingerprint(std::int32_t layer) const override {
    try {
      return inner_.fingerprint(layer);
    } catch (...) {
      rethrow_as_crash("fingerprint");
    }
  }

 private:
  engines::CacheUnderTest& inner_;
};

template <class Real>
RunObservation run_with(const Scenario& sc, const RunOptions& options, engines::CacheProvider& provider) {
  const auto& cache = sc.cache;
  const engines::CacheSpec spec = cache_spec(sc);
  RunObservation run;
  run.scenario_name = sc.name;
  run.backend = options.backend;
  run.fault = options.fault;
  run.window_convention = std::string(model::convention_name(to_model(cache.convention)));
  run.window_keys = spec.window_keys;
  run.window = cache.window;
  if (!cache.layer_windows.empty()) {
    for (const std::int64_t keys : layer_keys(cache))
      run.layer_window_keys.push_back(keys == scenarios::kGlobalWindowKeys ? 0 : keys);
  }
  run.ring_rows = cache.ring_rows;
  run.format = std::string(format_name(cache.format));
  run.precision_bits = model::real_bits<Real>();

  const engines::Capabilities& caps = provider.capabilities();
  if (caps.output_format != OutputFormat::kAccumulation && caps.computes_outputs)
    run.output_format = std::string(output_format_name(caps.output_format));
  run.block_size = caps.block_size;
  if (caps.block_size > 0) run.pool_blocks = engines::paged_pool_blocks(spec, caps);
  run.observed = observed_name(caps);
  std::string why;
  if (!caps.supports(sc, &why)) {
    run.skipped = true;
    run.skip_reason = caps.name + " does not support " + why;
    return run;
  }
  engines::Refusal refused;
  std::unique_ptr<engines::CacheUnderTest> cut;
  try {
    try {
      cut = provider.open(spec, &refused);
    } catch (...) {
      rethrow_as_crash("open");
    }
  } catch (const engines::CacheCrash& e) {
    // A crash at open is a finding of the run, as one at a step is.
    run.crashed = true;
    mark_failed(&run, "open: the cache crashed: " + e.rule());
    return run;
  }
  if (!cut) {
    run.skipped = true;
    run.refused = true;
    run.skip_reason = caps.name + " refused the configuration: " + refusal_text(refused);
    return run;
  }
  OutputJudge<Real> judge(sc, options, caps);
  CrashGuard guarded(*cut);
  StepDriver<Real> driver(sc, options, caps, guarded, judge, run);
  driver.set_resident_limit(engines::resident_limit(caps, spec));
  if (caps.slots_in_pool && caps.block_size > 0) {
    driver.set_slot_end(run.pool_blocks * caps.block_size,
                        "the pool it was opened with: pool_blocks " + std::to_string(run.pool_blocks) +
                            " x block_size " + std::to_string(caps.block_size) +
                            (caps.shared_pool ? " shared by the layers" : " per layer"));
  } else if (caps.slots_in_pool && caps.ring_addressing) {
    driver.set_slot_end(std::int64_t{cache.states} * cache.ring_rows,
                        "the ring it was opened with: states " + std::to_string(cache.states) + " x capacity " +
                            std::to_string(cache.ring_rows));
  }
  try {
    driver.run();
  } catch (const engines::CacheCrash& e) {
    driver.crashed(e.rule());
  }
  run.mpfr_queries = judge.mpfr_queries();
  judge_run(sc, &run);
  return run;
}

}  // namespace

}  // namespace kvcheck::properties
