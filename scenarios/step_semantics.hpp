// How each step kind changes a request's logical length and pending drafts
// (docs/semantics.md "Steps"), written once, in integers only. Scenario validation, the
// generator, the runner, the sweep engine and the step-level caches of
// engines/ all advance requests through this one function. The request
// lifecycle (a request begins and takes its state, one active request per
// state, finish frees it) is RequestLifecycle below, kept by scenario
// validation, the generator and the trace recorder.
//
// Deliberately NOT used by the implementations under test (impl/ring_pool.cpp,
// impl/cpu/layer_kv_cache.cpp, the adapters under adapters/) nor by the
// conformance suite (tests/impl/conformance.hpp): they keep their own copies
// so that a mistake here cannot hide the same mistake there.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "scenarios/scenario.hpp"

namespace kvcheck::scenarios {

/// The logical state of one request between steps.
struct RequestProgress {
  std::int64_t length = 0;           ///< committed positions; the next write goes here
  std::int64_t pending_first = -1;   ///< first position of a verify awaiting accept, else -1
  std::int64_t pending_drafts = -1;  ///< k of that verify, else -1
  bool pending() const noexcept { return pending_drafts >= 0; }
  /// Positions written so far past the committed length (a pending verify's rows).
  std::int64_t speculative_length() const noexcept {
    return pending() ? pending_first + 1 + pending_drafts : length;
  }
  /// Where the request's next query stands: the committed length, or with a
  /// verify pending one past its verified token (pending_first + 1).
  std::int64_t next_query_first() const noexcept { return pending() ? pending_first + 1 : length; }
  bool operator==(const RequestProgress&) const = default;
};

/// Why a step cannot be applied (the progress is left unchanged).
enum class StepRefusal : std::uint8_t {
  kNone,
  kWriteWhileVerifyPending,  ///< prefill/decode/verify before the pending verify's accept
  kAcceptWithoutVerify,      ///< accept with no verify pending
  kAcceptNegative,           ///< accept(a) with a < 0
  kAcceptTooMany,            ///< accept(a) with a > k
  kBadRows,                  ///< prefill rows < 1 or verify drafts < 0
  kTrimNone,                 ///< trim(n) with n < 1
  kTrimTooMany,              ///< trim(n) with n > the committed length
};

/// One line for a refusal ("accept without a pending verify", ...).
const char* step_refusal_text(StepRefusal refusal) noexcept;

/// First position a step writes (and its first query's position): the committed length.
constexpr std::int64_t step_first_position(const RequestProgress& p) noexcept {
  return p.length;
}

/// Applies `step` (its kind, rows, drafts, accepted) to `p`:
///   prefill(n), decode: length += n
///   verify(k):          pending = (length, k); length is committed at accept
///   accept(a):          length = pending_first + 1 + a; pending cleared
///   finish:             pending cleared (the request ends)
///   reset:              length = 0; pending cleared
///   trim(n):            pending cleared (a pending verify's rows are dropped,
///                       the verified token's included), then length -= n,
///                       1 <= n <= length (the committed length)
///   preempt:            pending cleared (a pending verify's rows are dropped,
///                       the verified token's included); length unchanged:
///                       the cache drops the request's rows and its next step
///                       resumes it by storing them again (docs/semantics.md
///                       "Preemption")
/// On a refusal `p` is unchanged.
constexpr StepRefusal advance(RequestProgress& p, const Step& step) noexcept {
  switch (step.kind) {
    case StepKind::kPrefill:
    case StepKind::kDecode:
    case StepKind::kVerify: {
      if (p.pending()) return StepRefusal::kWriteWhileVerifyPending;
      if (step.kind == StepKind::kPrefill && step.rows < 1) return StepRefusal::kBadRows;
      if (step.kind == StepKind::kVerify) {
        if (step.drafts < 0) return StepRefusal::kBadRows;
        p.pending_first = p.length;
        p.pending_drafts = step.drafts;
        return StepRefusal::kNone;
      }
      p.length += step_rows(step);
      return StepRefusal::kNone;
    }
    case StepKind::kAccept:
      if (!p.pending()) return StepRefusal::kAcceptWithoutVerify;
      if (step.accepted < 0) return StepRefusal::kAcceptNegative;
      if (step.accepted > p.pending_drafts) return StepRefusal::kAcceptTooMany;
      // The verified last token plus the accepted drafts become committed.
      p.length = p.pending_first + 1 + step.accepted;
      p.pending_first = p.pending_drafts = -1;
      return StepRefusal::kNone;
    case StepKind::kFinish: p.pending_first = p.pending_drafts = -1; return StepRefusal::kNone;
    case StepKind::kReset: p = RequestProgress{}; return StepRefusal::kNone;
    case StepKind::kTrim:
      // A trim rewinds the committed length; pending drafts go first (a draft
      // cache rewound drops its speculation), so n counts committed positions.
      if (step.positions < 1) return StepRefusal::kTrimNone;
      if (step.positions > p.length) return StepRefusal::kTrimTooMany;
      p.length -= step.positions;
      p.pending_first = p.pending_drafts = -1;
      return StepRefusal::kNone;
    case StepKind::kPreempt:
      // Unverified speculation is discarded (as a scheduler preempting a
      // request drops its draft tokens); the committed length stays.
      p.pending_first = p.pending_drafts = -1;
      return StepRefusal::kNone;
  }
  return StepRefusal::kNone;
}

/// A request's progress before its first step: a request that starts from a
/// shared prefix (Request::prefix) of n positions starts at length n
/// (positions 0 .. n-1 are shared, not written), any other at 0.
inline RequestProgress start_progress(const Request& request) {
  RequestProgress p;
  if (request.prefix) p.length = request.prefix->positions;
  return p;
}

/// Every request's progress before the schedule (start_progress), by id:
/// where walks over a scenario's steps begin.
inline std::map<std::int64_t, RequestProgress> start_progress(const std::vector<Request>& requests) {
  std::map<std::int64_t, RequestProgress> progress;
  for (const Request& r : requests) progress[r.id] = start_progress(r);
  return progress;
}

/// One past the last position any step of `steps` writes, over all requests
/// (1 for a schedule that writes nothing): what a cache without a sliding
/// window must hold. Steps are assumed valid (refusals are skipped).
/// A request that starts from a shared prefix (Request::prefix) starts at
/// length n: pass the scenario's requests.
inline std::int64_t schedule_end(const std::vector<Step>& steps, const std::vector<Request>& requests = {}) {
  std::map<std::int64_t, RequestProgress> progress = start_progress(requests);
  std::int64_t end = 1;
  for (const Step& s : steps) {
    RequestProgress& p = progress[s.request];
    end = std::max(end, step_first_position(p) + step_rows(s));
    advance(p, s);
  }
  return end;
}

/// Where each request is in its life and which request holds which state:
/// a request begins (explicitly, or at its first step) and takes its state,
/// which must then be free or its own; it steps through advance(); a kind
/// that ends a request (step_kind_ends_request: finish) frees the state, and
/// the request is over until it begins again. The one copy of these rules:
/// scenario validation, the generator and the trace recorder keep their
/// requests here and each decides what a breach means (an error, a step not
/// drawn, a refusal probe).
class RequestLifecycle {
 public:
  enum class Phase : std::uint8_t {
    kIdle,      ///< not begun
    kActive,    ///< begun, holds its state
    kFinished,  ///< ended; its state is free
  };

  /// The phase of `request` (kIdle when never seen).
  Phase phase(std::int64_t request) const {
    const auto it = requests_.find(request);
    return it == requests_.end() ? Phase::kIdle : it->second.phase;
  }

  /// The progress of `request` (the empty progress when never begun).
  const RequestProgress& progress(std::int64_t request) const {
    static const RequestProgress kNone{};
    const auto it = requests_.find(request);
    return it == requests_.end() ? kNone : it->second.progress;
  }

  /// The active request holding `state`; nullopt when the state is free.
  std::optional<std::int64_t> holder(std::int64_t state) const {
    const auto it = holders_.find(state);
    return it == holders_.end() ? std::nullopt : std::optional<std::int64_t>(it->second);
  }

  /// Whether `request` may hold `state` now: it is free or already its own.
  bool may_hold(std::int64_t request, std::int64_t state) const {
    const auto h = holder(state);
    return !h || *h == request;
  }

  /// `request` begins on `state`: active with an empty progress (or, from a
  /// shared prefix of `prefix_positions` positions, at that length), the
  /// state its own.
  void begin(std::int64_t request, std::int64_t state, std::int64_t prefix_positions = 0) {
    RequestProgress start;
    start.length = prefix_positions;
    requests_[request] = Entry{Phase::kActive, state, start};
    holders_[state] = request;
  }

  /// One step of `request` on `state`: an idle request begins first (at
  /// `prefix_positions`, its shared prefix's length); its progress advances;
  /// a kind that ends the request frees the state. On a refusal the progress
  /// is unchanged (the request has still begun).
  StepRefusal step(std::int64_t request, std::int64_t state, const Step& step, std::int64_t prefix_positions = 0) {
    if (phase(request) == Phase::kIdle) begin(request, state, prefix_positions);
    Entry& e = requests_[request];
    const StepRefusal refusal = advance(e.progress, step);
    if (refusal != StepRefusal::kNone) return refusal;
    if (step_kind_ends_request(step.kind)) {
      e.phase = Phase::kFinished;
      holders_.erase(e.state);
    }
    return StepRefusal::kNone;
  }

 private:
  struct Entry {
    Phase phase = Phase::kIdle;
    std::int64_t state = 0;
    RequestProgress progress;
  };
  std::map<std::int64_t, Entry> requests_;       // request -> its life
  std::map<std::int64_t, std::int64_t> holders_;  // state -> the active request holding it
};

inline const char* step_refusal_text(StepRefusal refusal) noexcept {
  switch (refusal) {
    case StepRefusal::kNone: return "ok";
    case StepRefusal::kWriteWhileVerifyPending: return "a write while a verify awaits its accept";
    case StepRefusal::kAcceptWithoutVerify: return "accept without a pending verify";
    case StepRefusal::kAcceptNegative: return "accept of a negative number of drafts";
    case StepRefusal::kAcceptTooMany: return "accept of more drafts than the pending verify wrote";
    case StepRefusal::kBadRows: return "prefill rows < 1 or verify drafts < 0";
    case StepRefusal::kTrimNone: return "trim of fewer than 1 position";
    case StepRefusal::kTrimTooMany: return "trim of more positions than the request has committed";
  }
  return "?";
}

}  // namespace kvcheck::scenarios
