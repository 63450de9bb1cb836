// The probes of the capacity sweep, run through RingPool: the worst-case
// schedules of one configuration at one ring size (probe_ring), any schedule
// of one request (run_schedule), and an unsafe probe turned into a
// counterexample scenario (make_counterexample). The steps are RingPool's own
// (begin, prefill, decode, verify, accept: the composition `check --impl cpu`
// runs), so the sweep's "safe at S_min" is a verdict on that code; what is
// judged here is only what the pool's tags say each step wrote and read. Why
// these schedules are the worst cases, and why reading the anchor queries of
// a step judges all of them in O(W + n), is argued in sweep.hpp.
#include <algorithm>
#include <memory>
#include <span>

#include "impl/ring_pool.hpp"
#include "scenarios/step_semantics.hpp"
#include "support/assert.hpp"
#include "support/error.hpp"
#include "sweep/sweep.hpp"

namespace kvcheck::sweep {

namespace {

using scenarios::StepKind;

// History (the writes before the probed steps) is stored in chunks of at
// most this many rows; it only sizes the pool's step buffers.
constexpr std::int64_t kProbeHistoryChunkRows = 64;

std::string probe_step_text(const ProbeStep& s) {
  switch (s.kind) {
    case StepKind::kDecode: return "decode";
    case StepKind::kVerify: return "verify(" + std::to_string(s.drafts) + ")";
    case StepKind::kAccept: return "accept(" + std::to_string(s.accepted) + ")";
    case StepKind::kPrefill:
      return "prefill(" + std::to_string(s.rows) + ", " + order_file_name(s.order) + ")";
    default: return "?";
  }
}

std::string probe_path_text(const std::vector<ProbeStep>& path) {
  std::string t;
  for (const auto& s : path) t += (t.empty() ? "" : ", ") + probe_step_text(s);
  return t;
}

/// What the judge knows about one state's request: its own copy of the step
/// semantics (scenarios/step_semantics.hpp), never the pool's.
struct ProbeRequest {
  std::int64_t request = 0;
  scenarios::RequestProgress progress;  ///< length and pending drafts
  std::int64_t written_end = 0;         ///< one past the last position written (stale drafts below it)
  std::vector<std::uint64_t> live_seq;  ///< [positions] write seq of the live row, 0 = none
  std::vector<std::int64_t> live_slot;  ///< [positions] slot the live row was written to
  /// A mark: the path length and whether a verify was pending (its drafts).
  struct Mark {
    std::size_t path_size;
    std::int64_t pending_drafts;
  };
  std::vector<Mark> marks;
  std::vector<ProbeStep> path;  ///< steps since the history, for reports
};

/// The judge's buffers, kept by each thread from one probe to the next: a
/// sweep runs thousands of probes, and memory handed back and taken again
/// each time costs more than the probe's own work.
struct RingProbeBuffers {
  bool busy = false;
  std::vector<ProbeRequest> requests;
  std::vector<double> zeros;
  std::vector<std::int64_t> anchors, sorted, prefix, first_lost;
  std::vector<std::uint8_t> lost;
  // Per-anchor stamps: union positions claimed, block slots read. The stamp
  // only grows, so no buffer needs clearing between anchors or probes.
  std::vector<std::uint64_t> claimed, slot_seen;
  std::uint64_t stamp = 0;
};

RingProbeBuffers& ring_probe_buffers() {
  thread_local RingProbeBuffers buffers;
  return buffers;
}

/// Drives one RingPool over the CPU kernels and judges every step by tags.
class RingProbe {
 public:
  RingProbe(const SweepConfig& config, std::int64_t ring_rows, std::int64_t states, impl::Fault fault)
      : ring_rows_(ring_rows), window_(config.window_keys) {
    KVCHECK_ASSERT(!buffers_.busy);  // one probe at a time per thread
    std::string why;
    std::unique_ptr<impl::KvBackend> backend = impl::make_backend("cpu", &why);
    KVCHECK_ASSERT(backend != nullptr);
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
    max_rows_ = std::max({config.drafts + 1, config.chunk_rows, kProbeHistoryChunkRows});
    spec.max_step_rows = max_rows_;
    // The anchors of the longest step (judge_reads) are all that read.
    spec.max_step_readers = std::min(max_rows_, (max_rows_ + window_ - 1) / window_ + 1);
    const impl::Status st = impl::RingPool::create(std::move(backend), spec, &pool_);
    if (!st.ok()) {
      throw Error(ErrorId::kSize, "--window",
                  "the CPU ring pool refused W=" + std::to_string(config.window_keys) +
                      ", S=" + std::to_string(ring_rows) + ": " + st.detail);
    }
    buffers_.busy = true;
    requests_.resize(static_cast<std::size_t>(states));
    for (std::int64_t b = 0; b < states; ++b) {
      ProbeRequest& s = requests_[static_cast<std::size_t>(b)];
      s.request = b;
      s.progress = scenarios::RequestProgress{};
      s.written_end = 0;
      s.live_seq.clear();  // every entry is written before it is read
      s.live_slot.clear();
      s.marks.clear();
      s.path.clear();
      KVCHECK_ASSERT(pool_->begin(b, b).ok());
    }
    // Key, value and query rows: zeros (the verdict is on tags, not values).
    zeros_.assign(static_cast<std::size_t>(max_rows_), 0.0);
    if (slot_seen_.size() < static_cast<std::size_t>(ring_rows))
      slot_seen_.resize(static_cast<std::size_t>(ring_rows), 0);
  }
  ~RingProbe() { buffers_.busy = false; }
  RingProbe(const RingProbe&) = delete;
  RingProbe& operator=(const RingProbe&) = delete;

  ProbeRequest& request(std::int64_t b) { return requests_[static_cast<std::size_t>(b)]; }

  /// Writes positions 0..rows-1 of state b in order, read by no query (argument 1).
  void history(std::int64_t b, std::int64_t rows) {
    KVCHECK_ASSERT(request(b).progress.length == 0);
    write_forward(b, rows);
  }

  void mark(std::int64_t b) {
    ProbeRequest& s = request(b);
    s.marks.push_back({s.path.size(), s.progress.pending_drafts});
  }

  /// Brings state b back to the state of its last mark, up to a shift of
  /// every position (argument 3: the verdict of a step does not depend on
  /// the ring's phase): a pending verify is accepted whole, the stale drafts
  /// a rollback left are written over, so the pool is canonical again
  /// (argument 1), and a verify that was pending at the mark runs again,
  /// read by no query.
  void undo(std::int64_t b) {
    ProbeRequest& s = request(b);
    KVCHECK_ASSERT(!s.marks.empty());
    const ProbeRequest::Mark m = s.marks.back();
    s.marks.pop_back();
    if (s.progress.pending_drafts >= 0) {
      run(b, ProbeStep{StepKind::kAccept, 0, SweepOrder::kLoadThenStore, 0, s.progress.pending_drafts}, false,
          nullptr);
    }
    write_forward(b, s.written_end - s.progress.length);
    if (m.pending_drafts >= 0) {
      run(b, ProbeStep{StepKind::kVerify, 0, SweepOrder::kLoadThenStore, m.pending_drafts, 0}, false,
          nullptr);
    }
    s.path.resize(m.path_size);
  }

  /// Runs one step on state b with its anchor queries reading; returns true
  /// when it lost a row, collided or read what it should not.
  bool step(std::int64_t b, const ProbeStep& step, ScheduleStepResult* out) {
    request(b).path.push_back(step);
    *out = ScheduleStepResult{};
    run(b, step, true, out);
    std::int64_t lost = 0;
    for (auto c : out->overwritten) lost += c;
    return lost > 0 || out->collisions.same_step > 0 || out->collisions.outside_block > 0 ||
           out->extra_reads > 0;
  }

  /// Lost positions (relative to the query) of the first losing query of the last step.
  const std::vector<std::int64_t>& first_lost() const { return first_lost_; }

 private:
  /// Stores positions length.. length+rows-1 of state b (prefill chunks of
  /// at most S rows, so no row of a chunk takes another's slot), read by no query.
  void write_forward(std::int64_t b, std::int64_t rows) {
    const std::int64_t chunk = std::min(max_rows_, ring_rows_);
    for (std::int64_t done = 0; done < rows; done += chunk) {
      run(b, ProbeStep{StepKind::kPrefill, std::min(chunk, rows - done), SweepOrder::kStoreThenLoad, 0, 0},
          false, nullptr);
    }
  }

  /// One step through the pool; with `judged`, the anchor queries read and
  /// `out` receives the verdict, else no query reads.
  void run(std::int64_t b, const ProbeStep& step, bool judged, ScheduleStepResult* out) {
    ProbeRequest& s = request(b);
    scenarios::Step as_step;
    as_step.kind = step.kind;
    as_step.rows = step.rows;
    as_step.drafts = step.drafts;
    as_step.accepted = step.accepted;
    const std::int64_t first = scenarios::step_first_position(s.progress);
    KVCHECK_ASSERT(scenarios::advance(s.progress, as_step) == scenarios::StepRefusal::kNone);
    if (step.kind == StepKind::kAccept) {
      KVCHECK_ASSERT(pool_->accept(b, step.accepted).ok());
      return;
    }
    const std::int64_t n = scenarios::step_rows(as_step);
    KVCHECK_ASSERT(n >= 1 && n <= max_rows_);
    anchors_.clear();
    if (judged) {
      // Anchor queries: first, last and every W-th between; their windows
      // cover the union of the step's windows.
      for (std::int64_t a = 0; a < n; a += window_) anchors_.push_back(a);
      if (anchors_.back() != n - 1) anchors_.push_back(n - 1);
    }
    const impl::StepRows in{zeros_.data(), zeros_.data(), zeros_.data()};
    // The anchors read, without outputs: the verdict is on tags.
    const impl::StepReads readers{std::span<const std::int64_t>(anchors_), false};
    impl::StepResult result;
    impl::Status st;
    if (step.kind == StepKind::kPrefill) {
      st = pool_->prefill(b, n, in,
                          step.order == SweepOrder::kStoreThenLoad ? impl::PrefillOrder::kStoreThenLoad
                                                                   : impl::PrefillOrder::kLoadThenStore,
                          &result, readers);
    } else if (step.kind == StepKind::kDecode) {
      st = pool_->decode(b, in, &result, readers);
    } else {
      st = pool_->verify(b, step.drafts, in, &result, readers);
    }
    KVCHECK_ASSERT(st.ok());
    KVCHECK_ASSERT(static_cast<std::int64_t>(result.writes.size()) == n);
    KVCHECK_ASSERT(result.readers == static_cast<std::int64_t>(anchors_.size()));
    if (out) judge_writes(b, first, result, out);
    // The judge's positions, not the pool's: a pool that writes elsewhere
    // (a rollback not taken) leaves tags no visible position accepts.
    if (static_cast<std::int64_t>(s.live_seq.size()) < first + n) {
      const auto size =
          static_cast<std::size_t>(std::max(first + n, 2 * static_cast<std::int64_t>(s.live_seq.size())));
      s.live_seq.resize(size, 0);
      s.live_slot.resize(size, -1);
    }
    for (std::int64_t i = 0; i < n; ++i) {
      const impl::WriteRecord& w = result.writes[static_cast<std::size_t>(i)];
      s.live_seq[static_cast<std::size_t>(first + i)] = w.written.write_seq;
      s.live_slot[static_cast<std::size_t>(first + i)] = w.slot;
    }
    s.written_end = std::max(s.written_end, first + n);
    if (out) judge_reads(b, first, n, result, out);
  }

  /// Same-step collisions, writes outside the state's block, and (steps that
  /// read the pool after their writes) writes over a live row the step reads.
  void judge_writes(std::int64_t b, std::int64_t first, const impl::StepResult& result,
                    ScheduleStepResult* out) {
    const ProbeRequest& s = request(b);
    sorted_.clear();
    for (const auto& w : result.writes) sorted_.push_back(w.slot);
    std::sort(sorted_.begin(), sorted_.end());
    std::int64_t dup = 0;
    for (std::size_t i = 1; i < sorted_.size(); ++i) {
      if (sorted_[i] == sorted_[i - 1] && (i < 2 || sorted_[i - 1] != sorted_[i - 2])) ++dup;
    }
    // The pool's own count, cross-checked on the slots.
    out->collisions.same_step = std::max(result.duplicate_slots, dup);
    const std::int64_t block = b * ring_rows_;
    for (const auto& w : result.writes) {
      if (w.slot < block || w.slot >= block + ring_rows_) ++out->collisions.outside_block;
    }
    if (result.source != impl::KvSource::kPool) return;
    // The union of the step's windows starts at first - W + 1.
    for (const auto& w : result.writes) {
      const impl::Tag& r = w.replaced;
      if (r.request == s.request && r.position >= 0 && r.position < first &&
          r.position >= first - window_ + 1 &&
          s.live_seq[static_cast<std::size_t>(r.position)] == r.write_seq) {
        ++out->collisions.replaced_needed;
      }
    }
  }

  /// The anchors' reads, judged by the tags they read: each visible position
  /// must be read once, from its live row; a position whose live row is
  /// gone while its slot was read is lost (overwritten); reads of anything
  /// else, outside the block, windows of the wrong length and positions not
  /// read at all are extra reads. Every query's count is then the lost
  /// positions in its window (argument of sweep.hpp, "Speed").
  void judge_reads(std::int64_t b, std::int64_t first, std::int64_t n, const impl::StepResult& result,
                   ScheduleStepResult* out) {
    const ProbeRequest& s = request(b);
    const std::int64_t block = b * ring_rows_;
    const std::int64_t u0 = std::max<std::int64_t>(0, first - window_ + 1);
    const auto union_rows = static_cast<std::size_t>(first + n - u0);
    lost_.assign(union_rows, 0);
    if (claimed_.size() < union_rows) claimed_.resize(union_rows, 0);
    const auto width = static_cast<std::size_t>(result.width);
    for (std::size_t a = 0; a < anchors_.size(); ++a) {
      const std::int64_t p = first + anchors_[a];
      const std::int64_t len = std::min(p + 1, window_);
      const std::int64_t lo = p - len + 1;
      ++stamp_;
      std::int64_t reads = 0, unclaimed = 0, slot_reads = 0;
      for (std::size_t c = 0; c < width; ++c) {
        const std::int64_t slot = result.read_slots[a * width + c];
        if (slot < 0) continue;
        ++reads;
        if (slot < block || slot >= block + ring_rows_) {
          ++out->extra_reads;  // another state's block
          continue;
        }
        slot_seen_[static_cast<std::size_t>(slot - block)] = stamp_;
        const impl::Tag& t = result.read_tags[a * width + c];
        if (t.request == s.request && t.position >= lo && t.position <= p &&
            s.live_seq[static_cast<std::size_t>(t.position)] == t.write_seq &&
            claimed_[static_cast<std::size_t>(t.position - u0)] != stamp_) {
          claimed_[static_cast<std::size_t>(t.position - u0)] = stamp_;
        } else {
          ++unclaimed;
        }
      }
      if (reads != len) ++out->extra_reads;  // a window of the wrong length
      for (std::int64_t j = lo; j <= p; ++j) {
        if (claimed_[static_cast<std::size_t>(j - u0)] == stamp_) continue;
        const std::int64_t home = s.live_slot[static_cast<std::size_t>(j)];
        if (home >= block && home < block + ring_rows_ &&
            slot_seen_[static_cast<std::size_t>(home - block)] == stamp_) {
          lost_[static_cast<std::size_t>(j - u0)] = 1;  // its slot was read, its row is gone
          ++slot_reads;
        } else {
          ++out->extra_reads;  // never read
        }
      }
      if (unclaimed > slot_reads) out->extra_reads += unclaimed - slot_reads;
    }
    count_losses(first, n, u0, out);
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

  std::int64_t ring_rows_;
  std::int64_t window_;
  std::int64_t max_rows_ = 1;
  std::unique_ptr<impl::RingPool> pool_;
  RingProbeBuffers& buffers_ = ring_probe_buffers();
  std::vector<ProbeRequest>& requests_ = buffers_.requests;
  std::vector<double>& zeros_ = buffers_.zeros;
  std::vector<std::int64_t>& anchors_ = buffers_.anchors;
  std::vector<std::int64_t>& sorted_ = buffers_.sorted;
  std::vector<std::int64_t>& prefix_ = buffers_.prefix;
  std::vector<std::int64_t>& first_lost_ = buffers_.first_lost;
  std::vector<std::uint8_t>& lost_ = buffers_.lost;
  std::vector<std::uint64_t>& claimed_ = buffers_.claimed;
  std::vector<std::uint64_t>& slot_seen_ = buffers_.slot_seen;
  std::uint64_t& stamp_ = buffers_.stamp;
};

/// One entry of a state's probe program.
struct ProbeProgramOp {
  enum class Kind : std::uint8_t { kMark, kUndo, kStep } kind = Kind::kStep;
  ProbeStep step;
};

/// The worst-case cases of sweep.hpp that state `b` of `states` runs, each
/// from the same history (up to a shift) and undone after. The cases are
/// split between the states (decode on one, the chunk on the next, the
/// accept branches dealt round-robin), so more states interleave more
/// without repeating work.
std::vector<ProbeProgramOp> probe_program(const SweepConfig& c, std::int64_t b, std::int64_t states) {
  using K = ProbeProgramOp::Kind;
  const ProbeStep decode{StepKind::kDecode, 0, SweepOrder::kLoadThenStore, 0, 0};
  const ProbeStep chunk{StepKind::kPrefill, c.chunk_rows, c.order, 0, 0};
  const ProbeStep verify{StepKind::kVerify, 0, SweepOrder::kLoadThenStore, c.drafts, 0};
  std::vector<ProbeProgramOp> ops;
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
ProbeResult run_probe_round(const SweepConfig& config, std::int64_t ring_rows,
                            const std::vector<std::int64_t>& phases, impl::Fault fault, ProbeResult result) {
  const auto states = static_cast<std::int64_t>(phases.size());
  RingProbe probe(config, ring_rows, states, fault);
  std::vector<std::vector<ProbeProgramOp>> programs;
  std::size_t longest = 0;
  for (std::int64_t b = 0; b < states; ++b) {
    probe.history(b, history_rows(config.window_keys, ring_rows, phases[static_cast<std::size_t>(b)]));
    programs.push_back(probe_program(config, b, states));
    longest = std::max(longest, programs.back().size());
  }
  ScheduleStepResult step;
  for (std::size_t at = 0; at < longest; ++at) {
    for (std::int64_t b = 0; b < states; ++b) {
      const auto& program = programs[static_cast<std::size_t>(b)];
      if (at >= program.size()) continue;
      const ProbeProgramOp& op = program[at];
      if (op.kind == ProbeProgramOp::Kind::kMark) {
        probe.mark(b);
      } else if (op.kind == ProbeProgramOp::Kind::kUndo) {
        probe.undo(b);
      } else {
        const bool bad = probe.step(b, op.step, &step);
        if (op.step.kind != StepKind::kAccept) ++result.steps_checked;
        if (bad) {
          result.safe = false;
          result.path = probe.request(b).path;
          result.hazard = probe_path_text(result.path);
          result.overwritten = step.overwritten;
          result.first_lost = probe.first_lost();
          result.collisions = step.collisions;
          result.extra_reads = step.extra_reads;
          return result;
        }
      }
    }
  }
  return result;
}

/// The named fault of ProbeOptions::fault.
impl::Fault probe_fault(const std::string& name) {
  impl::Fault fault = impl::Fault::kNone;
  if (!impl::parse_fault(name, &fault)) throw Error(ErrorId::kUsage, "fault", "unknown fault '" + name + "'");
  return fault;
}

}  // namespace

std::int64_t history_rows(std::int64_t window_keys, std::int64_t ring_rows, std::int64_t phase) {
  const std::int64_t wraps = std::max<std::int64_t>(2, 1 + (window_keys + ring_rows - 1) / ring_rows);
  return wraps * ring_rows + phase;
}

ProbeResult probe_ring(const SweepConfig& config, std::int64_t ring_rows, const ProbeOptions& options) {
  KVCHECK_ASSERT(ring_rows >= 1 && options.states >= 1);
  const impl::Fault fault = probe_fault(options.fault);
  ProbeResult result;
  result.ring_rows = ring_rows;
  if (options.all_phases) {
    // Every phase 0..S-1, each on a one-state pool that runs every case.
    for (std::int64_t phase = 0; phase < ring_rows; ++phase) {
      result = run_probe_round(config, ring_rows, {phase}, fault, result);
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
  return run_probe_round(config, ring_rows, phases, fault, result);
}

std::vector<ScheduleStepResult> run_schedule(const SweepConfig& config, std::int64_t ring_rows,
                                             const std::vector<ProbeStep>& steps) {
  SweepConfig sized = config;
  for (const auto& s : steps) {
    sized.drafts = std::max(sized.drafts, s.drafts);
    sized.chunk_rows = std::max(sized.chunk_rows, s.rows);
  }
  RingProbe probe(sized, ring_rows, 1, impl::Fault::kNone);
  std::vector<ScheduleStepResult> out(steps.size());
  for (std::size_t i = 0; i < steps.size(); ++i) probe.step(0, steps[i], &out[i]);
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
