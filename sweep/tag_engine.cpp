// The tag engine of the capacity sweep: a tag-checking driver of the CPU
// backend's kernels (store, load, scratch_store, attend, slot_tag) at ring
// addresses from impl/ring_index.hpp. It runs the worst-case schedules of one configuration
// at one ring size (probe_ring), any schedule of one request
// (run_schedule), and turns an unsafe probe into a counterexample scenario
// (make_counterexample). Why these schedules are the worst cases, and how a
// step's reads are checked in O(W + n), is argued in sweep.hpp.
#include "sweep/sweep.hpp"

#include <algorithm>
#include <memory>
#include <span>

#include "impl/kv_cache.hpp"
#include "impl/ring_index.hpp"
#include "scenarios/step_semantics.hpp"
#include "support/assert.hpp"
#include "support/error.hpp"

namespace kvcheck::sweep {

namespace {

using impl::Tag;
using scenarios::StepKind;

// History (the writes before the probed steps) is stored in chunks of at
// most this many rows; it only sizes the backend's step buffers.
constexpr std::int64_t kHistoryChunkRows = 64;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

std::string step_text(const ProbeStep& s) {
  switch (s.kind) {
    case StepKind::kDecode: return "decode";
    case StepKind::kVerify: return "verify(" + std::to_string(s.drafts) + ")";
    case StepKind::kAccept: return "accept(" + std::to_string(s.accepted) + ")";
    case StepKind::kPrefill:
      return "prefill(" + std::to_string(s.rows) + ", " + order_file_name(s.order) + ")";
    default: return "?";
  }
}

std::string path_text(const std::vector<ProbeStep>& path) {
  std::string t;
  for (const auto& s : path) t += (t.empty() ? "" : ", ") + step_text(s);
  return t;
}

/// One undoable change: a slot's previous tag, or a position's previous live seq.
struct LogEntry {
  bool slot = true;
  std::int64_t index = 0;  ///< slot, or position
  Tag tag;                 ///< previous tag (slot entries)
  std::uint64_t seq = 0;   ///< previous live seq (position entries)
};

/// What the engine knows about one state's request.
struct StateRun {
  std::int64_t request = 0;
  scenarios::RequestProgress progress;  ///< length and pending drafts (scenarios/step_semantics.hpp)
  std::vector<std::uint64_t> live_seq;  ///< [positions] write seq of the live row, 0 = none
  std::vector<LogEntry> log;
  struct Mark {
    std::size_t log_size;
    scenarios::RequestProgress progress;
    std::size_t path_size;
  };
  std::vector<Mark> marks;
  std::vector<ProbeStep> path;  ///< steps since the history, for reports
};

/// Drives one backend pool and checks every read against the live writes.
class TagEngine {
 public:
  TagEngine(const SweepConfig& config, std::int64_t ring_rows, std::int64_t states,
            impl::Fault fault = impl::Fault::kNone)
      : config_(config),
        ring_rows_(ring_rows),
        window_(config.window_keys),
        states_count_(states),
        fault_(fault) {
    std::string why;
    backend_ = impl::make_backend("cpu", &why);
    KVCHECK_ASSERT(backend_ != nullptr);
    impl::PoolSpec spec;
    spec.states = states;
    spec.ring_rows = ring_rows;
    spec.window_keys = config.window_keys;
    spec.q_heads = 1;
    spec.kv_heads = 1;
    spec.head_dim = 1;
    spec.format = impl::ElementFormat::kF32;
    spec.track_tags = true;
    spec.fault = fault;
    max_rows_ = std::max({config.drafts + 1, config.chunk_rows, kHistoryChunkRows});
    spec.max_step_rows = max_rows_;
    const impl::Status st = backend_->configure(spec);
    if (!st.ok()) {
      throw Error(ErrorId::kSize, "--window",
                  "the CPU backend refused W=" + std::to_string(config.window_keys) +
                      ", S=" + std::to_string(ring_rows) + ": " + st.detail);
    }
    states_.resize(static_cast<std::size_t>(states));
    for (std::int64_t b = 0; b < states; ++b) states_[static_cast<std::size_t>(b)].request = b;
    zeros_.assign(static_cast<std::size_t>(std::max(max_rows_, window_) + 1), 0.0);
  }

  StateRun& state(std::int64_t b) { return states_[static_cast<std::size_t>(b)]; }

  /// Writes positions 0..rows-1 of state b in order, without reads (argument 1).
  void history(std::int64_t b, std::int64_t rows) {
    StateRun& s = state(b);
    KVCHECK_ASSERT(s.progress.length == 0);
    const std::int64_t chunk = std::min(max_rows_, ring_rows_);
    for (std::int64_t first = 0; first < rows; first += chunk) {
      const std::int64_t n = std::min(chunk, rows - first);
      compute_meta(b, first, n);
      write_rows(b, first, n, /*log=*/false, nullptr, nullptr);
    }
    s.progress.length = rows;
  }

  void mark(std::int64_t b) {
    StateRun& s = state(b);
    s.marks.push_back({s.log.size(), s.progress, s.path.size()});
  }

  /// Restores state b (pool tags and bookkeeping) to its last mark.
  void undo(std::int64_t b) {
    StateRun& s = state(b);
    KVCHECK_ASSERT(!s.marks.empty());
    const StateRun::Mark m = s.marks.back();
    s.marks.pop_back();
    // Newest first, so a slot written twice ends with its oldest tag.
    restore_slots_.clear();
    restore_tags_.clear();
    for (std::size_t i = s.log.size(); i > m.log_size; --i) {
      const LogEntry& e = s.log[i - 1];
      if (e.slot) {
        restore_slots_.push_back(e.index);
        restore_tags_.push_back(e.tag);
      } else {
        s.live_seq[static_cast<std::size_t>(e.index)] = e.seq;
      }
    }
    for (std::size_t at = 0; at < restore_slots_.size();) {
      const std::size_t n = std::min(restore_slots_.size() - at, static_cast<std::size_t>(max_rows_));
      rope_.assign(n, 0);
      const impl::Status st =
          backend_->store(std::span<const std::int64_t>(restore_slots_.data() + at, n), rope_, zeros_.data(),
                          zeros_.data(), std::span<const Tag>(restore_tags_.data() + at, n), nullptr);
      KVCHECK_ASSERT(st.ok());
      at += n;
    }
    s.log.resize(m.log_size);
    s.progress = m.progress;
    s.path.resize(m.path_size);
  }

  /// Runs one step on state b; returns true when it lost a row or collided.
  bool step(std::int64_t b, const ProbeStep& step, ScheduleStepResult* out) {
    StateRun& s = state(b);
    s.path.push_back(step);
    *out = ScheduleStepResult{};
    scenarios::Step as_step;
    as_step.kind = step.kind;
    as_step.rows = step.rows;
    as_step.drafts = step.drafts;
    as_step.accepted = step.accepted;
    const std::int64_t first = scenarios::step_first_position(s.progress);
    KVCHECK_ASSERT(scenarios::advance(s.progress, as_step) == scenarios::StepRefusal::kNone);
    if (step.kind == StepKind::kAccept) return false;
    const std::int64_t n = scenarios::step_rows(as_step);
    KVCHECK_ASSERT(n >= 1 && n <= max_rows_);
    if (step.kind == StepKind::kPrefill && step.order == SweepOrder::kLoadThenStore) {
      scratch_step(b, first, n, out);
    } else {
      compute_meta(b, first, n);
      write_rows(b, first, n, /*log=*/true, out, /*count_replaced=*/&out->collisions);
      pool_reads(b, first, n, out);
    }
    std::int64_t lost = 0;
    for (auto c : out->overwritten) lost += c;
    return lost > 0 || out->collisions.same_step > 0 || out->collisions.outside_block > 0 ||
           out->extra_reads > 0;
  }

  /// Lost positions (relative to the query) of the first losing query of the last step.
  const std::vector<std::int64_t>& first_lost() const { return first_lost_; }

 private:
  void compute_meta(std::int64_t b, std::int64_t first, std::int64_t n) {
    // The ring's address math on the host (the kernel table takes slots, not addresses).
    meta_.resize(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) {
      meta_[static_cast<std::size_t>(i)] =
          impl::ring_metadata(b, first + i, window_, ring_rows_, states_count_, fault_);
    }
  }

  void expand_index(std::span<const impl::ReadMeta> meta) {
    for (std::size_t i = 0; i < meta.size(); ++i) {
      for (std::int64_t c = 0; c < window_; ++c) {
        index_[i * static_cast<std::size_t>(window_) + static_cast<std::size_t>(c)] =
            impl::ring_index_column(meta[i], c, ring_rows_, fault_);
      }
    }
  }

  void ensure_positions(StateRun& s, std::int64_t end) {
    if (static_cast<std::int64_t>(s.live_seq.size()) < end) {
      s.live_seq.resize(
          static_cast<std::size_t>(std::max(end, 2 * static_cast<std::int64_t>(s.live_seq.size()))), 0);
    }
  }

  /// Stores rows first..first+n-1 of state b at meta_'s write slots.
  void write_rows(std::int64_t b, std::int64_t first, std::int64_t n, bool log, ScheduleStepResult* out,
                  StepCollisions* count_replaced) {
    StateRun& s = state(b);
    ensure_positions(s, first + n);
    const auto un = static_cast<std::size_t>(n);
    slots_.resize(un);
    replaced_.resize(un);
    tags_.resize(un);
    rope_.resize(un);
    for (std::size_t i = 0; i < un; ++i) {
      slots_[i] = meta_[i].write_slot;
      rope_[i] = first + static_cast<std::int64_t>(i);
      tags_[i] = Tag{s.request, first + static_cast<std::int64_t>(i), ++write_seq_};
      if (log || count_replaced) replaced_[i] = backend_->slot_tag(slots_[i]);
    }
    impl::StoreReport report;
    const impl::Status st = backend_->store(slots_, rope_, zeros_.data(), zeros_.data(), tags_, &report);
    KVCHECK_ASSERT(st.ok());
    if (out) {
      // Same-step collisions: the backend's count, cross-checked on the slots.
      sorted_ = slots_;
      std::sort(sorted_.begin(), sorted_.end());
      std::int64_t dup = 0;
      for (std::size_t i = 1; i < un; ++i) {
        if (sorted_[i] == sorted_[i - 1] && (i < 2 || sorted_[i - 1] != sorted_[i - 2])) ++dup;
      }
      out->collisions.same_step = std::max(report.duplicate_slots, dup);
      const std::int64_t block = b * ring_rows_;
      for (std::size_t i = 0; i < un; ++i) {
        if (slots_[i] < block || slots_[i] >= block + ring_rows_) ++out->collisions.outside_block;
      }
    }
    if (count_replaced) {
      // A write over a live row of this request that a query of this step
      // still reads (the union of the step's windows starts at first - W + 1).
      for (std::size_t i = 0; i < un; ++i) {
        const Tag& r = replaced_[i];
        if (r.request == s.request && r.position >= 0 && r.position < first &&
            s.live_seq[static_cast<std::size_t>(r.position)] == r.write_seq &&
            r.position >= first - window_ + 1) {
          ++count_replaced->replaced_needed;
        }
      }
    }
    for (std::size_t i = 0; i < un; ++i) {
      const std::int64_t p = first + static_cast<std::int64_t>(i);
      if (log) {
        s.log.push_back(LogEntry{true, slots_[i], replaced_[i], 0});
        s.log.push_back(LogEntry{false, p, Tag{}, s.live_seq[static_cast<std::size_t>(p)]});
      }
      s.live_seq[static_cast<std::size_t>(p)] = tags_[i].write_seq;
    }
  }

  /// Anchor queries whose windows cover the union of the step's windows.
  void pick_anchors(std::int64_t n) {
    anchors_.clear();
    for (std::int64_t a = 0; a < n; a += window_) anchors_.push_back(a);
    if (anchors_.back() != n - 1) anchors_.push_back(n - 1);
  }

  bool live(const StateRun& s, std::int64_t j, const Tag& t) const {
    return t.request == s.request && t.position == j &&
           t.write_seq == s.live_seq[static_cast<std::size_t>(j)];
  }

  /// Per-query overwritten counts from lost_[] (over positions u0..).
  void count_losses(std::int64_t first, std::int64_t n, std::int64_t u0, ScheduleStepResult* out) {
    const std::size_t u = lost_.size();
    prefix_.assign(u + 1, 0);
    for (std::size_t i = 0; i < u; ++i) prefix_[i + 1] = prefix_[i] + (lost_[i] ? 1 : 0);
    out->overwritten.assign(static_cast<std::size_t>(n), 0);
    first_lost_.clear();
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t p = first + i;
      const std::int64_t lo = std::max<std::int64_t>(0, p - window_ + 1);
      const std::int64_t c =
          prefix_[static_cast<std::size_t>(p - u0 + 1)] - prefix_[static_cast<std::size_t>(lo - u0)];
      out->overwritten[static_cast<std::size_t>(i)] = c;
      if (c > 0 && first_lost_.empty()) {
        for (std::int64_t j = lo; j <= p; ++j) {
          if (lost_[static_cast<std::size_t>(j - u0)]) first_lost_.push_back(j - p);
        }
      }
    }
  }

  /// Reads of a pool-source step (decode, verify, store_then_load prefill).
  void pool_reads(std::int64_t b, std::int64_t first, std::int64_t n, ScheduleStepResult* out) {
    const StateRun& s = state(b);
    const std::int64_t u0 = std::max<std::int64_t>(0, first - window_ + 1);
    const std::int64_t u1 = first + n - 1;
    union_slot_.assign(static_cast<std::size_t>(u1 - u0 + 1), -1);
    pick_anchors(n);
    anchor_meta_.clear();
    for (auto a : anchors_) anchor_meta_.push_back(meta_[static_cast<std::size_t>(a)]);
    index_.resize(anchors_.size() * static_cast<std::size_t>(window_));
    expand_index(anchor_meta_);
    const std::int64_t block = b * ring_rows_;
    for (std::size_t ai = 0; ai < anchors_.size(); ++ai) {
      const std::int64_t p = first + anchors_[ai];
      const std::int64_t len = std::min(p + 1, window_);
      const std::int64_t start = p - len + 1;
      if (anchor_meta_[ai].length != len) ++out->extra_reads;
      const std::int64_t* row = index_.data() + ai * static_cast<std::size_t>(window_);
      for (std::int64_t c = 0; c < window_; ++c) {
        const std::int64_t slot = row[c];
        if (c >= len) {
          if (slot != -1) ++out->extra_reads;  // an unfilled column must not be read
          continue;
        }
        if (slot < block || slot >= block + ring_rows_) {
          ++out->extra_reads;  // another state's block
          continue;
        }
        std::int64_t& u = union_slot_[static_cast<std::size_t>(start + c - u0)];
        if (u == -1) {
          u = slot;
        } else if (u != slot) {
          ++out->extra_reads;  // two anchors read one position from different slots
        }
      }
    }
    // Every query's own metadata must fall on the anchors' slots.
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t p = first + i;
      const std::int64_t len = std::min(p + 1, window_);
      const auto& m = meta_[static_cast<std::size_t>(i)];
      if (m.length != len || m.read_offset != union_slot_[static_cast<std::size_t>(p - len + 1 - u0)]) {
        ++out->extra_reads;
      }
    }
    lost_.assign(union_slot_.size(), 0);
    for (std::size_t x = 0; x < union_slot_.size(); ++x) {
      const std::int64_t j = u0 + static_cast<std::int64_t>(x);
      if (union_slot_[x] < 0) {
        ++out->extra_reads;
        continue;
      }
      lost_[x] = live(s, j, backend_->slot_tag(union_slot_[x])) ? 0 : 1;
    }
    count_losses(first, n, u0, out);
  }

  /// load_then_store prefill: the old window goes to scratch before the store,
  /// the new rows go to scratch too, and anchor queries attend from scratch.
  void scratch_step(std::int64_t b, std::int64_t first, std::int64_t n, ScheduleStepResult* out) {
    const StateRun& s = state(b);
    compute_meta(b, first, 1);
    const impl::ReadMeta m0 = meta_[0];
    const std::int64_t len0 = std::min(first + 1, window_);
    if (m0.length != len0) ++out->extra_reads;
    index_.resize(static_cast<std::size_t>(window_));
    expand_index(std::span<const impl::ReadMeta>(&m0, 1));
    const std::int64_t m = len0 - 1;  // old rows: positions first - m .. first - 1
    impl::Status st =
        backend_->load(std::span<const std::int64_t>(index_.data(), static_cast<std::size_t>(m)), 0);
    KVCHECK_ASSERT(st.ok());
    compute_meta(b, first, n);
    write_rows(b, first, n, /*log=*/true, out, nullptr);
    st = backend_->scratch_store(m, slots_, rope_, zeros_.data(), zeros_.data(), tags_);
    KVCHECK_ASSERT(st.ok());
    const std::int64_t u0 = first - m;
    lost_.assign(static_cast<std::size_t>(first + n - u0), 0);
    seen_.assign(lost_.size(), 0);
    pick_anchors(n);
    const std::size_t na = anchors_.size();
    index_.assign(na * static_cast<std::size_t>(window_), -1);
    anchor_rope_.resize(na);
    for (std::size_t ai = 0; ai < na; ++ai) {
      const std::int64_t p = first + anchors_[ai];
      const std::int64_t len = std::min(p + 1, window_);
      const std::int64_t lo = p - len + 1;
      anchor_rope_[ai] = p;
      for (std::int64_t c = 0; c < len; ++c)
        index_[ai * static_cast<std::size_t>(window_) + static_cast<std::size_t>(c)] = lo + c - u0;
    }
    out_.resize(na);
    read_tags_.resize(na * static_cast<std::size_t>(window_));
    read_slots_.resize(na * static_cast<std::size_t>(window_));
    st = backend_->attend(impl::KvSource::kScratch, anchor_rope_, zeros_.data(), index_, window_, out_.data(),
                          read_tags_.data(), read_slots_.data());
    KVCHECK_ASSERT(st.ok());
    const std::int64_t block = b * ring_rows_;
    for (std::size_t ai = 0; ai < na; ++ai) {
      const std::int64_t p = first + anchors_[ai];
      const std::int64_t len = std::min(p + 1, window_);
      const std::int64_t lo = p - len + 1;
      for (std::int64_t c = 0; c < len; ++c) {
        const std::size_t cell = ai * static_cast<std::size_t>(window_) + static_cast<std::size_t>(c);
        const std::int64_t j = lo + c;
        const std::int64_t slot = read_slots_[cell];
        if (slot < block || slot >= block + ring_rows_) ++out->extra_reads;
        const auto x = static_cast<std::size_t>(j - u0);
        seen_[x] = 1;
        if (!live(s, j, read_tags_[cell])) lost_[x] = 1;
      }
    }
    for (auto v : seen_) {
      if (!v) ++out->extra_reads;
    }
    count_losses(first, n, u0, out);
  }

  SweepConfig config_;
  std::int64_t ring_rows_;
  std::int64_t window_;
  std::int64_t states_count_;
  impl::Fault fault_;
  std::int64_t max_rows_ = 1;
  std::unique_ptr<impl::KvBackend> backend_;
  std::vector<StateRun> states_;
  std::uint64_t write_seq_ = 0;
  // Step buffers, reused.
  std::vector<double> zeros_;
  std::vector<impl::ReadMeta> meta_, anchor_meta_;
  std::vector<std::int64_t> slots_, sorted_, rope_, anchors_, anchor_rope_, index_, union_slot_;
  std::vector<std::int64_t> restore_slots_, prefix_, read_slots_, first_lost_;
  std::vector<Tag> replaced_, tags_, restore_tags_, read_tags_;
  std::vector<std::uint8_t> lost_, seen_;
  std::vector<double> out_;
};

/// One entry of a state's probe program.
struct ProgramOp {
  enum class Kind : std::uint8_t { kMark, kUndo, kStep } kind = Kind::kStep;
  ProbeStep step;
};

/// The worst-case cases of sweep.hpp that state `b` of `states` runs, each
/// from the same history and undone after. The cases are split between the
/// states (decode on one, the chunk on the next, the accept branches dealt
/// round-robin), so more states interleave more without repeating work.
std::vector<ProgramOp> probe_program(const SweepConfig& c, std::int64_t b, std::int64_t states) {
  using K = ProgramOp::Kind;
  const ProbeStep decode{StepKind::kDecode, 0, SweepOrder::kLoadThenStore, 0, 0};
  const ProbeStep chunk{StepKind::kPrefill, c.chunk_rows, c.order, 0, 0};
  const ProbeStep verify{StepKind::kVerify, 0, SweepOrder::kLoadThenStore, c.drafts, 0};
  std::vector<ProgramOp> ops;
  auto single = [&](const ProbeStep& s) {
    ops.push_back({K::kMark, {}});
    ops.push_back({K::kStep, s});
    ops.push_back({K::kUndo, {}});
  };
  if (b == 0) single(decode);          // argument 4: one row
  if (b == 1 % states) single(chunk);  // argument 4: exactly C rows in the configured order
  // Arguments 4 and 5: verify(k) (on every state), then every accept count,
  // then the next step: verify(k) again (its first query reads the window a
  // decode would, after more writes, so it dominates decode) and the chunk.
  ops.push_back({K::kMark, {}});
  ops.push_back({K::kStep, verify});
  for (std::int64_t a = b; a <= c.drafts; a += states) {
    for (const ProbeStep& next : {verify, chunk}) {
      ops.push_back({K::kMark, {}});
      ops.push_back({K::kStep, ProbeStep{StepKind::kAccept, 0, SweepOrder::kLoadThenStore, 0, a}});
      ops.push_back({K::kStep, next});
      ops.push_back({K::kUndo, {}});
    }
  }
  ops.push_back({K::kUndo, {}});
  return ops;
}

/// Runs the programs of `phases.size()` states at once, interleaved op by op.
ProbeResult run_round(const SweepConfig& config, std::int64_t ring_rows,
                      const std::vector<std::int64_t>& phases, impl::Fault fault, ProbeResult result) {
  const auto states = static_cast<std::int64_t>(phases.size());
  TagEngine engine(config, ring_rows, states, fault);
  std::vector<std::vector<ProgramOp>> programs;
  std::size_t longest = 0;
  for (std::int64_t b = 0; b < states; ++b) {
    engine.history(b, history_rows(config.window_keys, ring_rows, phases[static_cast<std::size_t>(b)]));
    programs.push_back(probe_program(config, b, states));
    longest = std::max(longest, programs.back().size());
  }
  ScheduleStepResult step;
  for (std::size_t at = 0; at < longest; ++at) {
    for (std::int64_t b = 0; b < states; ++b) {
      const auto& program = programs[static_cast<std::size_t>(b)];
      if (at >= program.size()) continue;
      const ProgramOp& op = program[at];
      if (op.kind == ProgramOp::Kind::kMark) {
        engine.mark(b);
      } else if (op.kind == ProgramOp::Kind::kUndo) {
        engine.undo(b);
      } else {
        const bool bad = engine.step(b, op.step, &step);
        if (op.step.kind != StepKind::kAccept) ++result.steps_checked;
        if (bad) {
          result.safe = false;
          result.path = engine.state(b).path;
          result.hazard = path_text(result.path);
          result.overwritten = step.overwritten;
          result.first_lost = engine.first_lost();
          result.collisions = step.collisions;
          result.extra_reads = step.extra_reads;
          return result;
        }
      }
    }
  }
  return result;
}

}  // namespace

std::int64_t history_rows(std::int64_t window_keys, std::int64_t ring_rows, std::int64_t phase) {
  const std::int64_t wraps = std::max<std::int64_t>(2, 1 + ceil_div(window_keys, ring_rows));
  return wraps * ring_rows + phase;
}

/// The backend fault `name` names (ProbeOptions::fault).
impl::Fault named_fault(const std::string& name) {
  impl::Fault fault = impl::Fault::kNone;
  if (!impl::parse_fault(name, &fault)) throw Error(ErrorId::kUsage, "fault", "unknown fault '" + name + "'");
  return fault;
}

ProbeResult probe_ring(const SweepConfig& config, std::int64_t ring_rows, const ProbeOptions& options) {
  KVCHECK_ASSERT(ring_rows >= 1 && options.states >= 1);
  ProbeResult result;
  result.ring_rows = ring_rows;
  if (options.all_phases) {
    // Every phase 0..S-1, each on a one-state pool that runs every case.
    for (std::int64_t phase = 0; phase < ring_rows; ++phase) {
      result = run_round(config, ring_rows, {phase}, named_fault(options.fault), result);
      if (!result.safe) return result;
    }
    return result;
  }
  // State 0 starts its steps at slot 0, state 1 straddles the seam (slot
  // S - 1), further states spread over the ring.
  std::vector<std::int64_t> phases;
  for (std::int64_t b = 0; b < options.states; ++b) {
    phases.push_back(b == 0 ? 0 : b == 1 ? ring_rows - 1 : (b * ring_rows) / options.states);
  }
  return run_round(config, ring_rows, phases, named_fault(options.fault), result);
}

std::vector<ScheduleStepResult> run_schedule(const SweepConfig& config, std::int64_t ring_rows,
                                             const std::vector<ProbeStep>& steps) {
  SweepConfig sized = config;
  for (const auto& s : steps) {
    sized.drafts = std::max(sized.drafts, s.drafts);
    sized.chunk_rows = std::max(sized.chunk_rows, s.rows);
  }
  TagEngine engine(sized, ring_rows, 1);
  std::vector<ScheduleStepResult> out(steps.size());
  for (std::size_t i = 0; i < steps.size(); ++i) engine.step(0, steps[i], &out[i]);
  return out;
}

std::optional<scenarios::Scenario> make_counterexample(const SweepConfig& config, std::int64_t ring_rows,
                                                       const ProbeResult& below) {
  if (below.safe || below.path.empty() || ring_rows < 1) return std::nullopt;
  // Fill lengths to try: the window just full, then the probe's own history
  // (two wraps, phase 0), so the scenario is as small as reproduces.
  const std::int64_t fills[] = {config.window_keys, history_rows(config.window_keys, ring_rows, 0)};
  for (const std::int64_t fill : fills) {
    std::vector<ProbeStep> steps;
    // Chunks no longer than the ring or the window: load_then_store chunks of
    // at most S rows neither lose a row nor collide.
    const std::int64_t chunk = std::min(config.window_keys, ring_rows);
    for (std::int64_t done = 0; done < fill; done += chunk) {
      steps.push_back(
          ProbeStep{StepKind::kPrefill, std::min(chunk, fill - done), SweepOrder::kLoadThenStore, 0, 0});
    }
    const std::size_t fill_steps = steps.size();
    steps.insert(steps.end(), below.path.begin(), below.path.end());
    const auto results = run_schedule(config, ring_rows, steps);
    bool fill_clean = true, fails = false;
    std::int64_t collisions = 0;
    for (std::size_t i = 0; i < results.size(); ++i) {
      std::int64_t lost = 0;
      for (auto c : results[i].overwritten) lost += c;
      const bool bad = lost > 0 || results[i].collisions.total() > 0 || results[i].extra_reads > 0;
      if (i < fill_steps && bad) fill_clean = false;
      if (i >= fill_steps && bad) fails = true;
      collisions += results[i].collisions.total();
    }
    if (!fill_clean || !fails) continue;

    scenarios::Scenario sc;
    sc.name = "sweep-w" + std::to_string(config.window_keys) + "-k" + std::to_string(config.drafts) + "-c" +
              std::to_string(config.chunk_rows) + "-" + order_file_name(config.order) + "-s" +
              std::to_string(ring_rows);
    sc.description = "kvcheck sweep counterexample: W=" + std::to_string(config.window_keys) +
                     ", k=" + std::to_string(config.drafts) + ", C=" + std::to_string(config.chunk_rows) +
                     ", " + order_file_name(config.order) + "; the minimum safe ring is " +
                     std::to_string(ring_rows + 1) + ", and at S=" + std::to_string(ring_rows) +
                     " after a fill of " + std::to_string(fill) + " rows, " + below.hazard +
                     " loses visible rows or collides";
    sc.cache.window = config.window_keys;
    sc.cache.convention = scenarios::Convention::kKeys;
    sc.cache.ring_rows = ring_rows;
    sc.cache.states = 1;
    sc.cache.q_heads = 1;
    sc.cache.kv_heads = 1;
    sc.cache.head_dim = 1;
    sc.cache.format = scenarios::Format::kF32;
    sc.data.seed = 1;
    sc.requests.push_back(scenarios::Request{0, 0});
    scenarios::Expectations expect;
    for (std::size_t i = 0; i < steps.size(); ++i) {
      scenarios::Step st;
      st.kind = steps[i].kind;
      st.request = 0;
      if (st.kind == StepKind::kPrefill) {
        st.rows = steps[i].rows;
        st.order = steps[i].order == SweepOrder::kStoreThenLoad ? scenarios::Order::kStoreThenLoad
                                                                : scenarios::Order::kLoadThenStore;
      }
      if (st.kind == StepKind::kVerify) st.drafts = steps[i].drafts;
      if (st.kind == StepKind::kAccept) st.accepted = steps[i].accepted;
      sc.steps.push_back(st);
      const auto& counts = results[i].overwritten;
      if (std::any_of(counts.begin(), counts.end(), [](std::int64_t c) { return c > 0; })) {
        expect.overwritten.push_back(scenarios::OverwriteExpectation{static_cast<std::int64_t>(i), counts});
      }
    }
    expect.collisions = collisions;
    sc.expect = expect;
    return sc;
  }
  return std::nullopt;
}

}  // namespace kvcheck::sweep
