#include "engines/trace_cache.hpp"

#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "scenarios/scenario_json.hpp"
#include "scenarios/step_semantics.hpp"
#include "support/error.hpp"

namespace kvcheck::engines {

namespace {

using scenarios::TraceKind;
using scenarios::TraceRun;
using scenarios::TraceStep;

std::string in_source(const TraceRun& run) {
  return run.source.empty() ? "" : " (in " + run.source + ")";
}

std::string line_path(std::int64_t line, const std::string& path) {
  return "line " + std::to_string(line) + (path.empty() ? "" : ": " + path);
}

Refusal parse_refusal(const std::string& text) {
  const auto colon = text.find(": ");
  if (colon == std::string::npos) return Refusal{text, ""};
  return Refusal{text.substr(0, colon), text.substr(colon + 2)};
}

std::string refusal_text(const Refusal& r) {
  return r.code + (r.detail.empty() ? "" : ": " + r.detail);
}

// ---- replaying a trace ------------------------------------------------------------------

class TraceCache final : public CacheUnderTest {
 public:
  TraceCache(std::shared_ptr<const TraceRun> run, const CacheSpec& spec) : run_(std::move(run)), spec_(spec) {
    for (const TraceStep& s : run_->steps) index_[{s.step, s.layer, s.kind == TraceKind::kBegin}] = &s;
  }

  StepStatus call(const StepCall& c, StepAnswer* answer) override {
    if (answer) answer->clear();
    const bool begin = c.op == StepCall::Op::kBegin;
    const auto it = index_.find({c.step_index, c.layer, begin});
    if (it == index_.end()) {
      if (begin) return std::nullopt;  // begin records are optional
      throw Error(ErrorId::kJsonValue,
                  "step " + std::to_string(c.step_index) + " layer " + std::to_string(c.layer),
                  "the trace '" + run_->header.name + "' has no record for this call" + in_source(*run_));
    }
    const TraceStep& rec = *it->second;
    const auto agree = [&](bool same, const char* path, const std::string& recorded,
                           const std::string& called) {
      if (!same) {
        throw Error(ErrorId::kJsonValue, line_path(rec.line, path),
                    std::string(path) + " " + recorded + " recorded, but the call of step " +
                        std::to_string(c.step_index) + " layer " + std::to_string(c.layer) + " has " +
                        called + in_source(*run_));
      }
    };
    agree(rec.request == c.step.request, "request", std::to_string(rec.request),
          std::to_string(c.step.request));
    agree(rec.state == c.state, "state", std::to_string(rec.state), std::to_string(c.state));
    if (!begin) {
      const TraceKind kind = scenarios::trace_kind(c.step.kind);
      agree(rec.kind == kind, "kind", "'" + std::string(scenarios::trace_kind_name(rec.kind)) + "'",
            "'" + std::string(scenarios::trace_kind_name(kind)) + "'");
      if (scenarios::trace_kind_writes(kind)) {
        agree(rec.position == c.position, "position", std::to_string(rec.position),
              std::to_string(c.position));
        agree(rec.rows == c.rows, "rows", std::to_string(rec.rows), std::to_string(c.rows));
        if (scenarios::step_kind_fields(c.step.kind) == scenarios::StepFields::kRowsOrder) {
          agree(rec.order == c.step.order, "order", "'" + std::string(scenarios::order_name(rec.order)) + "'",
                "'" + std::string(scenarios::order_name(c.step.order)) + "'");
        }
      }
      if (scenarios::step_kind_fields(c.step.kind) == scenarios::StepFields::kAccepted) {
        agree(rec.accepted == c.step.accepted, "accepted", std::to_string(rec.accepted),
              std::to_string(c.step.accepted));
      }
      if (scenarios::step_kind_fields(c.step.kind) == scenarios::StepFields::kPositions) {
        agree(rec.positions == c.step.positions, "positions", std::to_string(rec.positions),
              std::to_string(c.step.positions));
      }
    }
    if (begin && c.prefix_positions > 0) {
      // A begin from a shared prefix: the recorded prefix, and where the
      // cache stored rows again (no written: every row shared).
      const auto text = [](std::int64_t r, std::int64_t n) {
        return "{request " + std::to_string(r) + ", positions " + std::to_string(n) + "}";
      };
      agree(rec.prefix && rec.prefix->request == c.prefix_request && rec.prefix->positions == c.prefix_positions,
            "prefix", rec.prefix ? text(rec.prefix->request, rec.prefix->positions) : std::string("none"),
            text(c.prefix_request, c.prefix_positions));
      if (!rec.refused && answer != nullptr && !rec.written.empty()) {
        answer->has_written = true;
        answer->written = rec.written;
      }
      if (!rec.refused && answer != nullptr) answer->recompute = rec.recompute;
    }
    if (rec.refused) return parse_refusal(*rec.refused);
    if (answer == nullptr) return std::nullopt;
    // Slot events of any record, a begin's included.
    answer->padded = rec.padded;
    answer->moved = rec.moved;
    answer->freed = rec.freed;
    answer->cached = rec.cached;
    if (begin || !scenarios::trace_kind_writes(rec.kind)) return std::nullopt;
    answer->recomputed = rec.recomputed;

    const std::int64_t n = rec.rows;
    const auto q_width =
        static_cast<std::size_t>(spec_.cache.q_heads) * static_cast<std::size_t>(spec_.cache.head_dim);
    bool have_out = static_cast<std::int64_t>(rec.out.size()) == n;
    for (const auto& row : rec.out) have_out = have_out && row.size() == q_width;
    if (have_out) {
      for (const auto& row : rec.out) answer->out.insert(answer->out.end(), row.begin(), row.end());
    } else {
      answer->out.assign(static_cast<std::size_t>(n) * q_width, 0.0);
    }
    answer->has_written = true;
    answer->written = rec.written;
    answer->has_reads = true;
    answer->read_offsets.push_back(0);
    for (const auto& list : scenarios::trace_read_slots(rec, scenarios::trace_layer_window_keys(run_->header, rec.layer))) {
      answer->read_slots.insert(answer->read_slots.end(), list.begin(), list.end());
      answer->read_offsets.push_back(static_cast<std::int64_t>(answer->read_slots.size()));
    }
    answer->view =
        rec.read_view == scenarios::TraceReadView::kCausal ? ReadView::kCausal : ReadView::kAfterWrites;
    return std::nullopt;
  }

 private:
  std::shared_ptr<const TraceRun> run_;
  CacheSpec spec_;
  std::map<std::tuple<std::int64_t, std::int32_t, bool>, const TraceStep*> index_;
};

class TraceProvider final : public CacheProvider {
 public:
  explicit TraceProvider(const TraceRun& run) : run_(std::make_shared<const TraceRun>(run)) {
    caps_.name = "trace:" + run.header.name;
    caps_.ring_addressing = run.header.addressing == scenarios::Addressing::kRing;
    caps_.block_size = run.header.block_size;  // a recorded paged cache's blocks
    caps_.per_layer_windows = !run.header.layer_windows.empty();  // the recording's own windows
    for (const TraceStep& s : run.steps) caps_.prefix_sharing = caps_.prefix_sharing || s.prefix.has_value();
    // A recording that preempted (docs/semantics.md "Preemption"): its resumes are self-prefix begins.
    for (const TraceStep& s : run.steps)
      caps_.preempt = caps_.preempt || s.kind == scenarios::trace_kind(scenarios::StepKind::kPreempt);
    caps_.reports_written_slots = true;
    caps_.reports_read_slots = true;
    // A recording that answered cached slots (docs/semantics.md "Cached rows").
    for (const TraceStep& s : run.steps) caps_.reports_cached = caps_.reports_cached || !s.cached.empty();
    // A recording that recomputed prefix rows in a step (docs/semantics.md "Recompute in a step").
    for (const TraceStep& s : run.steps)
      caps_.recompute_in_step = caps_.recompute_in_step || !s.recompute.empty() || !s.recomputed.empty();
    if (const auto& b = run.header.resident_bound) {  // judged as the recorded cache's own bound
      caps_.resident_bound.unit = b->blocks ? ResidentBound::Unit::kBlocks : ResidentBound::Unit::kRows;
      caps_.resident_bound.per_request = b->per_request;
      caps_.resident_bound.limit = b->limit;
    }
  }
  const Capabilities& capabilities() override { return caps_; }
  std::unique_ptr<CacheUnderTest> open(const CacheSpec& spec, Refusal*) override {
    return std::make_unique<TraceCache>(run_, spec);
  }
  std::string name() const override { return "trace"; }

 private:
  std::shared_ptr<const TraceRun> run_;
  Capabilities caps_;
};

// ---- recording a cache ------------------------------------------------------------------

std::vector<std::vector<double>> rows_of(const double* data, std::int64_t n, std::int64_t width) {
  std::vector<std::vector<double>> out;
  if (data == nullptr) return out;
  for (std::int64_t i = 0; i < n; ++i) out.emplace_back(data + i * width, data + (i + 1) * width);
  return out;
}

bool all_finite(const double* data, std::int64_t count) {
  if (data == nullptr) return true;
  for (std::int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(data[i])) return false;
  }
  return true;
}

class RecordingCache final : public CacheUnderTest {
 public:
  RecordingCache(std::unique_ptr<CacheUnderTest> inner, std::shared_ptr<scenarios::TraceWriter> writer,
                 const scenarios::TraceHeader& header, const CacheSpec& spec, bool computes_outputs)
      : inner_(std::move(inner)),
        writer_(std::move(writer)),
        spec_(spec),
        computes_outputs_(computes_outputs),
        buffer_(scenarios::trace_header_line(header)) {}

  ~RecordingCache() override {
    try {
      writer_->append(buffer_);
    } catch (...) {
      // Reported by TraceWriter::check(): a destructor must not throw.
    }
  }

  StepStatus call(const StepCall& c, StepAnswer* answer) override {
    if (is_probe(c)) return inner_->call(c, answer);
    const StepStatus st = inner_->call(c, answer);
    record(c, answer, st);
    if (!st) track(c);
    return st;
  }

  StepStatus probe(const std::string& name, const StepCall& context) override {
    return inner_->probe(name, context);
  }
  std::optional<std::uint64_t> fingerprint(std::int32_t layer) const override {
    return inner_->fingerprint(layer);
  }

 private:

  std::int64_t kv_width() const { return std::int64_t{spec_.cache.kv_heads} * spec_.cache.head_dim; }
  std::int64_t q_width() const { return std::int64_t{spec_.cache.q_heads} * spec_.cache.head_dim; }

  /// A refusal probe: a call no valid schedule makes (docs/semantics.md "Steps" step
  /// semantics, one active request per state, finite rows).
  bool is_probe(const StepCall& c) const {
    const auto it = layers_.find(c.layer);
    static const scenarios::RequestLifecycle kNone;
    const scenarios::RequestLifecycle& life = it == layers_.end() ? kNone : it->second;
    if (c.op == StepCall::Op::kBegin) {
      // Begins twice; but the begin that resumes a preempted request (docs/semantics.md "Preemption").
      if (life.phase(c.step.request) == scenarios::RequestLifecycle::Phase::kActive)
        return !preempted_.contains({c.layer, c.step.request});
      return !life.may_hold(c.step.request, c.state);                                              // a busy state
    }
    const std::int64_t n = c.rows;
    if (!all_finite(c.k, n * kv_width()) || !all_finite(c.v, n * kv_width()) ||
        !all_finite(c.q, n * q_width())) {
      return true;
    }
    scenarios::RequestProgress progress = life.progress(c.step.request);
    return scenarios::advance(progress, c.step) != scenarios::StepRefusal::kNone;
  }

  /// Keeps each layer's requests (a begin, or the first step, takes the state).
  void track(const StepCall& c) {
    scenarios::RequestLifecycle& life = layers_[c.layer];
    if (c.op == StepCall::Op::kBegin) {
      preempted_.erase({c.layer, c.step.request});
      life.begin(c.step.request, c.state, c.prefix_positions);
    } else {
      life.step(c.step.request, c.state, c.step);
      if (c.step.kind == scenarios::StepKind::kPreempt) preempted_.insert({c.layer, c.step.request});
    }
  }

  void record(const StepCall& c, const StepAnswer* answer, const StepStatus& st) {
    TraceStep s;
    s.step = c.step_index;
    s.layer = c.layer;
    s.kind = c.op == StepCall::Op::kBegin ? TraceKind::kBegin : scenarios::trace_kind(c.step.kind);
    s.request = c.step.request;
    s.state = c.state;
    if (st) s.refused = refusal_text(*st);
    if (c.op == StepCall::Op::kBegin && c.prefix_positions > 0) {
      s.prefix = scenarios::Prefix{c.prefix_request, c.prefix_positions};
      if (!st && answer != nullptr && answer->has_written) s.written = answer->written;
      if (!st && answer != nullptr) s.recompute = answer->recompute;
    }
    if (c.op != StepCall::Op::kBegin && scenarios::step_kind_fields(c.step.kind) == scenarios::StepFields::kAccepted)
      s.accepted = c.step.accepted;
    if (c.op != StepCall::Op::kBegin && scenarios::step_kind_fields(c.step.kind) == scenarios::StepFields::kPositions)
      s.positions = c.step.positions;
    if (!st && answer != nullptr) {
      s.padded = answer->padded;
      s.moved = answer->moved;
      s.freed = answer->freed;
      s.cached = answer->cached;
      s.recomputed = answer->recomputed;
    }
    if (scenarios::trace_kind_writes(s.kind)) {
      s.position = c.position;
      s.rows = c.rows;
      s.order = c.step.order;
      s.drafts = c.step.drafts;
      s.k = rows_of(c.k, c.rows, kv_width());
      if (!spec_.cache.shared_row) s.v = rows_of(c.v, c.rows, kv_width());
      s.q = rows_of(c.q, c.rows, q_width());
      if (!st) {
        if (answer == nullptr || !answer->has_written || !answer->has_reads) {
          throw Error(ErrorId::kUsage, "--record",
                      "step " + std::to_string(c.step_index) + " layer " + std::to_string(c.layer) +
                          ": the cache did not report its written and read slots, which a trace needs");
        }
        s.written = answer->written;
        s.read_form = scenarios::ReadForm::kSlots;
        for (std::size_t i = 0; i + 1 < answer->read_offsets.size(); ++i) {
          const auto lo = static_cast<std::size_t>(answer->read_offsets[i]);
          const auto hi = static_cast<std::size_t>(answer->read_offsets[i + 1]);
          s.read.emplace_back(answer->read_slots.begin() + static_cast<std::ptrdiff_t>(lo),
                              answer->read_slots.begin() + static_cast<std::ptrdiff_t>(hi));
        }
        s.read_view = answer->view == ReadView::kCausal ? scenarios::TraceReadView::kCausal
                                                        : scenarios::TraceReadView::kAfterWrites;
        // A bookkeeping-only engine answers no outputs: its steps carry none,
        // so an audit judges its slots (observed=slots), not zeros.
        if (computes_outputs_) s.out = rows_of(answer->out.data(), c.rows, q_width());
      }
    }
    buffer_ += scenarios::trace_step_line(s);
  }

  std::unique_ptr<CacheUnderTest> inner_;
  std::shared_ptr<scenarios::TraceWriter> writer_;
  CacheSpec spec_;
  bool computes_outputs_;
  std::string buffer_;
  std::map<std::int32_t, scenarios::RequestLifecycle> layers_;  // layer -> its requests and state holders
  std::set<std::pair<std::int32_t, std::int64_t>> preempted_;   // (layer, request) preempted, not yet resumed
};

class Recorder final : public RecordingProvider {
 public:
  Recorder(std::unique_ptr<CacheProvider> inner, std::shared_ptr<scenarios::TraceWriter> writer,
           std::string name)
      : inner_(std::move(inner)), writer_(std::move(writer)), base_(std::move(name)) {
    const Capabilities& caps = inner_->capabilities();
    if (!caps.reports_written_slots || !caps.reports_read_slots) {
      throw Error(ErrorId::kUsage, "--record",
                  "the cache " + inner_->name() +
                      " does not report both written and read slots, which a trace needs");
    }
  }

  void set_run_name(std::string name) override { run_name_ = std::move(name); }
  void set_scenario(const scenarios::Scenario& scenario) override {
    run_name_ = scenario.name;
    expect_ = scenario.expect;
  }
  const Capabilities& capabilities() override { return inner_->capabilities(); }
  std::string name() const override { return inner_->name(); }

  std::unique_ptr<CacheUnderTest> open(const CacheSpec& spec, Refusal* refused) override {
    std::unique_ptr<CacheUnderTest> cache = inner_->open(spec, refused);
    if (!cache) return nullptr;
    ++runs_;
    scenarios::TraceHeader h;
    h.name = run_name_ ? *run_name_ : (runs_ == 1 ? base_ : base_ + "#" + std::to_string(runs_));
    h.window = spec.cache.window;
    h.convention = spec.cache.convention;
    h.layer_windows = spec.cache.layer_windows;
    h.capacity = spec.cache.ring_rows;
    h.states = spec.cache.states;
    const Capabilities& caps = inner_->capabilities();
    h.addressing = caps.ring_addressing    ? scenarios::Addressing::kRing
                   : caps.block_size > 0 ? scenarios::Addressing::kPaged
                                         : scenarios::Addressing::kOpaque;
    if (caps.block_size > 0) {
      h.block_size = caps.block_size;
      h.pool_blocks = paged_pool_blocks(spec, caps);
    }
    if (caps.resident_bound.declared()) {  // the bound this run was judged by, its limit resolved
      h.resident_bound = scenarios::TraceResidentBound{caps.resident_bound.unit == ResidentBound::Unit::kBlocks,
                                                       caps.resident_bound.per_request, resident_limit(caps, spec)};
    }
    scenarios::TraceCache c;
    c.q_heads = spec.cache.q_heads;
    c.kv_heads = spec.cache.kv_heads;
    c.head_dim = spec.cache.head_dim;
    c.shared_row = spec.cache.shared_row;
    c.format = spec.cache.format;
    c.rope = spec.cache.rope;
    c.layers = spec.cache.layers;
    c.softmax_scale = spec.cache.softmax_scale;
    c.sink_logit = spec.cache.sink_logit;
    h.cache = c;
    h.expect = expect_;
    return std::make_unique<RecordingCache>(std::move(cache), writer_, h, spec, caps.computes_outputs);
  }

 private:
  std::unique_ptr<CacheProvider> inner_;
  std::shared_ptr<scenarios::TraceWriter> writer_;
  std::string base_;
  std::optional<std::string> run_name_;
  std::optional<scenarios::Expectations> expect_;
  std::int64_t runs_ = 0;
};

}  // namespace

std::unique_ptr<CacheProvider> make_trace_provider(const TraceRun& run) {
  return std::make_unique<TraceProvider>(run);
}

std::unique_ptr<RecordingProvider> make_recording_provider(std::unique_ptr<CacheProvider> inner,
                                                           std::shared_ptr<scenarios::TraceWriter> writer,
                                                           std::string name) {
  return std::make_unique<Recorder>(std::move(inner), std::move(writer), std::move(name));
}

}  // namespace kvcheck::engines
