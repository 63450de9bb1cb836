// The step kinds, one table. Every place that asks what kinds there are,
// what a kind is called, which fields it carries, how many rows it writes,
// whether it ends its request or which capability runs it reads
// KVCHECK_STEP_KINDS (and KVCHECK_STEP_CAPABILITIES, the kinds as a cache
// declares them): the StepKind and TraceKind enumerators, the names in
// scenario files, traces, the exec protocol and reports, the generator's
// swarm slots and engines::Capabilities's step bools. How a kind changes a
// request's length is scenarios/step_semantics.hpp (advance).
//
// Dependency-free (the standard library only), so model/, engines/ and
// properties/ may include it. Adding a step kind: docs/development.md.
#pragma once

#include <cstdint>
#include <string_view>

namespace kvcheck::scenarios {

/// Prefill order ("load_then_store", "store_then_load").
enum class Order : std::uint8_t { kLoadThenStore, kStoreThenLoad };

/// The parameter fields a step kind carries beside "kind" and "request", in
/// the order they are written (scenario files, traces, the exec protocol).
enum class StepFields : std::uint8_t {
  kNone,       ///< none
  kRowsOrder,  ///< "rows" (the chunk, >= 1) then "order"
  kDrafts,     ///< "drafts" k (>= 0)
  kAccepted,   ///< "accepted" a (0 <= a <= k of the pending verify)
  kPositions,  ///< "positions" n (1 <= n <= the committed length): trim
};

/// How many rows a step writes, which is also how many queries it runs.
enum class StepRows : std::uint8_t {
  kNone,           ///< none: the step only moves the request's bookkeeping
  kGiven,          ///< its "rows" field
  kOne,            ///< one
  kDraftsPlusOne,  ///< k + 1: the verified token and its k drafts
};

// X(id, name, fields, rows, runs_with, ends_request, needs_begun):
//   id, name      the enumerator and the string of scenario files, traces,
//                 the exec protocol and reports;
//   fields, rows  StepFields and StepRows above;
//   runs_with     the kind whose capability runs this one (accept ends a
//                 verify, so a cache that verifies accepts);
//   ends_request  the request is over: its state is freed for another
//                 request and it takes no further step;
//   needs_begun   drawn by the generator only for a request that has begun
//                 (on a fresh request it would do nothing).
#define KVCHECK_STEP_KINDS(X)                                          \
  X(kPrefill, "prefill", kRowsOrder, kGiven, kPrefill, false, false)   \
  X(kDecode, "decode", kNone, kOne, kDecode, false, false)             \
  X(kVerify, "verify", kDrafts, kDraftsPlusOne, kVerify, false, false) \
  X(kAccept, "accept", kAccepted, kNone, kVerify, false, true)         \
  X(kFinish, "finish", kNone, kNone, kFinish, true, true)              \
  X(kReset, "reset", kNone, kNone, kReset, false, true)                \
  X(kTrim, "trim", kPositions, kNone, kTrim, false, true)              \
  X(kPreempt, "preempt", kNone, kNone, kPreempt, false, true)

/// Step kinds ("prefill", "decode", "verify", "accept", "finish", "reset", "trim", "preempt").
enum class StepKind : std::uint8_t {
#define KVCHECK_STEP_KIND_ENUMERATOR(id, name, fields, rows, runs_with, ends, begun) id,
  KVCHECK_STEP_KINDS(KVCHECK_STEP_KIND_ENUMERATOR)
#undef KVCHECK_STEP_KIND_ENUMERATOR
};

/// Number of StepKind values, counted from the table.
inline constexpr int kStepKindCount = 0
#define KVCHECK_STEP_KIND_COUNT(id, name, fields, rows, runs_with, ends, begun) +1
    KVCHECK_STEP_KINDS(KVCHECK_STEP_KIND_COUNT)
#undef KVCHECK_STEP_KIND_COUNT
    ;

/// Every step kind, in table order (the order names are listed in messages).
inline constexpr StepKind kStepKinds[] = {
#define KVCHECK_STEP_KIND_VALUE(id, name, fields, rows, runs_with, ends, begun) StepKind::id,
    KVCHECK_STEP_KINDS(KVCHECK_STEP_KIND_VALUE)
#undef KVCHECK_STEP_KIND_VALUE
};

/// One row of the table as data.
struct StepKindInfo {
  std::string_view name;
  StepFields fields;
  StepRows rows;
  StepKind runs_with;
  bool ends_request;
  bool needs_begun;
};

namespace step_kinds_detail {
inline constexpr StepKindInfo kInfo[] = {
#define KVCHECK_STEP_KIND_INFO(id, name, fields, rows, runs_with, ends, begun) \
  {name, StepFields::fields, StepRows::rows, StepKind::runs_with, ends, begun},
    KVCHECK_STEP_KINDS(KVCHECK_STEP_KIND_INFO)
#undef KVCHECK_STEP_KIND_INFO
};
// A value outside the table (a cast gone wrong) reads as a nameless no-op.
inline constexpr StepKindInfo kUnknown{"?", StepFields::kNone, StepRows::kNone, StepKind{}, false, false};
}  // namespace step_kinds_detail

/// The table row of `kind`.
constexpr const StepKindInfo& step_kind_info(StepKind kind) noexcept {
  return static_cast<int>(kind) < kStepKindCount ? step_kinds_detail::kInfo[static_cast<int>(kind)]
                                                 : step_kinds_detail::kUnknown;
}

/// The name of a step kind ("prefill", "decode", ...).
constexpr std::string_view step_kind_name(StepKind kind) noexcept { return step_kind_info(kind).name; }

/// Parses a step kind name; returns false (and leaves `out`) when unknown.
constexpr bool parse_step_kind(std::string_view name, StepKind* out) noexcept {
  for (const StepKind kind : kStepKinds) {
    if (step_kind_name(kind) == name) {
      *out = kind;
      return true;
    }
  }
  return false;
}

/// The parameter fields of a step kind.
constexpr StepFields step_kind_fields(StepKind kind) noexcept { return step_kind_info(kind).fields; }

/// Whether a step of this kind writes rows (and runs queries): prefill, decode, verify.
constexpr bool step_kind_writes_rows(StepKind kind) noexcept {
  return step_kind_info(kind).rows != StepRows::kNone;
}

/// Rows a step of `kind` writes given its fields (prefill n, decode 1, verify k+1, else 0).
constexpr std::int64_t step_kind_rows(StepKind kind, std::int64_t rows, std::int64_t drafts) noexcept {
  switch (step_kind_info(kind).rows) {
    case StepRows::kNone: return 0;
    case StepRows::kGiven: return rows;
    case StepRows::kOne: return 1;
    case StepRows::kDraftsPlusOne: return drafts + 1;
  }
  return 0;
}

/// Whether a step of this kind ends its request (finish).
constexpr bool step_kind_ends_request(StepKind kind) noexcept { return step_kind_info(kind).ends_request; }

/// Whether the generator draws this kind only for a request that has begun.
constexpr bool step_kind_needs_begun(StepKind kind) noexcept { return step_kind_info(kind).needs_begun; }

// What a cache declares it runs: one row per engines::Capabilities step bool
// and per name of the exec protocol's hello "steps" (a kind with an order
// field has one row per order; accept runs with verify's row).
// X(id, member, kind, order): member is both the Capabilities field and the
// hello name; order is read only for a kind with an order field.
#define KVCHECK_STEP_CAPABILITIES(X)                                          \
  X(kPrefillLoadThenStore, prefill_load_then_store, kPrefill, kLoadThenStore) \
  X(kPrefillStoreThenLoad, prefill_store_then_load, kPrefill, kStoreThenLoad) \
  X(kDecode, decode, kDecode, kLoadThenStore)                                 \
  X(kVerify, verify, kVerify, kLoadThenStore)                                 \
  X(kFinish, finish, kFinish, kLoadThenStore)                                 \
  X(kReset, reset, kReset, kLoadThenStore)                                    \
  X(kTrim, trim, kTrim, kLoadThenStore)                                       \
  X(kPreempt, preempt, kPreempt, kLoadThenStore)

/// The rows of KVCHECK_STEP_CAPABILITIES (also the generator's swarm slots).
enum class StepCapability : std::uint8_t {
#define KVCHECK_STEP_CAPABILITY_ENUMERATOR(id, member, kind, order) id,
  KVCHECK_STEP_CAPABILITIES(KVCHECK_STEP_CAPABILITY_ENUMERATOR)
#undef KVCHECK_STEP_CAPABILITY_ENUMERATOR
};

/// Number of StepCapability values, counted from the table.
inline constexpr int kStepCapabilityCount = 0
#define KVCHECK_STEP_CAPABILITY_COUNT(id, member, kind, order) +1
    KVCHECK_STEP_CAPABILITIES(KVCHECK_STEP_CAPABILITY_COUNT)
#undef KVCHECK_STEP_CAPABILITY_COUNT
    ;

/// One capability row as data.
struct StepCapabilityInfo {
  std::string_view name;  ///< the Capabilities field and the hello name
  StepKind kind;
  Order order;
};

namespace step_kinds_detail {
inline constexpr StepCapabilityInfo kCapabilityInfo[] = {
#define KVCHECK_STEP_CAPABILITY_INFO(id, member, kind, order) {#member, StepKind::kind, Order::order},
    KVCHECK_STEP_CAPABILITIES(KVCHECK_STEP_CAPABILITY_INFO)
#undef KVCHECK_STEP_CAPABILITY_INFO
};
inline constexpr StepCapabilityInfo kUnknownCapability{"?", StepKind{}, Order{}};
}  // namespace step_kinds_detail

/// The table row of `capability`.
constexpr const StepCapabilityInfo& step_capability_info(StepCapability capability) noexcept {
  return static_cast<int>(capability) < kStepCapabilityCount
             ? step_kinds_detail::kCapabilityInfo[static_cast<int>(capability)]
             : step_kinds_detail::kUnknownCapability;
}

/// Whether engines::Capabilities declares `capability` by default: every
/// row but preempt (a cache says it drops and resumes requests:
/// docs/semantics.md "Preemption").
constexpr bool step_capability_default(StepCapability capability) noexcept {
  return capability != StepCapability::kPreempt;
}

/// Whether `capability` is the one that runs a step of `kind` (in `order`, for a kind with an order field).
constexpr bool step_capability_runs(StepCapability capability, StepKind kind, Order order) noexcept {
  const StepCapabilityInfo& c = step_capability_info(capability);
  const StepKind gate = step_kind_info(kind).runs_with;
  return c.kind == gate && (step_kind_fields(gate) != StepFields::kRowsOrder || c.order == order);
}

}  // namespace kvcheck::scenarios
