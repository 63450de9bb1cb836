// Recorded traces (format version 1): what a cache under test did in one or
// more runs, step by step, as an engine dumped it or as `kvcheck --record`
// wrote it. `kvcheck audit` judges a trace like a live run: the slots each
// step wrote and read go through the same shadow map, and when every writing
// step carries its rows and outputs, the outputs are compared with the
// reference too. JSON Lines I/O lives in scenarios/trace_json.hpp; the
// schema is scenarios/schema/trace.schema.json.
//
// A run is a header line followed by its step records:
//   {"kvcheck_trace":1,"name":...,"window":{"param":W,"convention":...},
//    "capacity":S?,"states":B?,"addressing":"ring"|"paged"|"opaque","resident_bound":{...}?,
//    "cache":{...}?,"expect":{...}?}
//   {"step":i,"layer":l,"kind":...,"request":r,"state":b, ...}
// Plain values; no JSON here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "scenarios/scenario.hpp"

namespace kvcheck::scenarios {

/// The trace format version this build reads and writes.
inline constexpr int kTraceVersion = 1;

/// How the engine's slots are numbered ("ring", "paged", "opaque"). Only
/// "ring" changes the audit: slots of state b are then [b*capacity, (b+1)*capacity).
enum class Addressing : std::uint8_t { kRing, kPaged, kOpaque };

/// Record kinds: the step kinds (scenarios/step_kinds.hpp, the same values in
/// the same order), and "begin" (a request takes its state; optional: the
/// first step of a request begins it).
enum class TraceKind : std::uint8_t {
#define KVCHECK_TRACE_KIND_ENUMERATOR(id, name, fields, rows, runs_with, ends, begun) id,
  KVCHECK_STEP_KINDS(KVCHECK_TRACE_KIND_ENUMERATOR)
#undef KVCHECK_TRACE_KIND_ENUMERATOR
  kBegin,
};

/// How a writing step's reads relate to its own writes ("after_writes", "causal");
/// the same two views as engines::ReadView (adapters/PROTOCOL.md, read_view).
enum class TraceReadView : std::uint8_t { kAfterWrites, kCausal };

/// The header's optional "cache" object: the row layout, for judging
/// outputs. Absent fields take the defaults below (the same as a trace with
/// no "cache" at all); `layers` absent means 1 + the largest layer recorded.
struct TraceCache {
  std::int32_t q_heads = 1;
  std::int32_t kv_heads = 1;
  std::int32_t head_dim = 2;
  bool shared_row = false;
  Format format = Format::kF64;
  Rope rope;
  std::optional<std::int32_t> layers;
  std::optional<double> softmax_scale;  ///< null or absent: 1/sqrt(head_dim)
  std::optional<double> sink_logit;
  bool operator==(const TraceCache&) const = default;
};

/// The header's optional "resident_bound": the memory bound the recorded
/// cache declared (as an exec hello's resident_bound, its limit resolved).
/// The audit fails a step after which the trace holds more, as check does.
struct TraceResidentBound {
  bool blocks = false;       ///< "unit": "blocks" (needs block_size), else "rows"
  bool per_request = false;  ///< "per": "request", else "cache" (all requests of a layer)
  std::int64_t limit = 1;    ///< rows or blocks, at least 1
  bool operator==(const TraceResidentBound&) const = default;
};

/// The first line of a run.
struct TraceHeader {
  std::string name;
  std::int64_t window = 1;  ///< window.param
  Convention convention = Convention::kKeys;
  std::optional<std::int64_t> capacity;  ///< rows per state; absent: 1 + the largest slot seen
  std::optional<std::int64_t> states;    ///< absent: 1 + the largest state used
  Addressing addressing = Addressing::kOpaque;
  /// Paged addressing: rows per block (JSON "block_size", only with
  /// addressing "paged"); 0: none. Replay and audit then show block tables
  /// and count the paged classes, as for the cache that was recorded.
  std::int64_t block_size = 0;
  std::optional<std::int64_t> pool_blocks;  ///< with block_size: the pool per layer the cache was opened with
  std::optional<TraceResidentBound> resident_bound;  ///< absent: no bound judged
  std::optional<TraceCache> cache;  ///< absent: TraceCache defaults, outputs not judged
  /// Each layer's own window (JSON "layer_windows", as a scenario's
  /// cache.layer_windows); empty: every layer has `window`.
  std::vector<LayerWindow> layer_windows;
  /// What the run expects, as a scenario file's "expect" (a recording of a
  /// replayed scenario carries the scenario's); absent: no lost row, no
  /// collision, outputs within the format's tolerance.
  std::optional<Expectations> expect;
  bool operator==(const TraceHeader&) const = default;
};

/// A paged engine's read description of one writing step: query i with
/// seq_lens[i] = L reads the slots of positions max(0, L - keys) .. L - 1,
/// slot = blocks[pos / block_size] * block_size + pos % block_size (block -1:
/// nothing read for that position).
struct BlockTable {
  std::vector<std::int64_t> blocks;  ///< block ids indexed by position / block_size, -1 for none
  std::int64_t block_size = 1;
  std::vector<std::int64_t> seq_lens;  ///< one per query
  bool operator==(const BlockTable&) const = default;
};

/// How a writing step's reads are given.
enum class ReadForm : std::uint8_t { kNone, kSlots, kBlockTable };

/// One step record (one step on one layer, or a begin).
struct TraceStep {
  std::int64_t line = 0;  ///< 1-based line in the source text (0: built in code)
  std::int64_t step = 0;  ///< index of the step in the run (a begin: of the step it precedes)
  std::int32_t layer = 0;
  TraceKind kind = TraceKind::kDecode;
  std::int64_t request = 0;
  std::int64_t state = 0;
  // Writing steps (prefill, decode, verify):
  std::int64_t position = 0;            ///< first position written
  std::int64_t rows = 0;                ///< rows written = queries run (prefill n, decode 1, verify k+1)
  Order order = Order::kLoadThenStore;  ///< prefill
  std::int64_t drafts = 0;              ///< verify k
  std::int64_t accepted = 0;            ///< accept a
  std::int64_t positions = 0;           ///< trim n
  /// A begin from a shared prefix (Request::prefix): the request it starts
  /// from and n; `written` then has n entries, the slot the cache stored
  /// each row in or -1 where it shares the other request's row (empty: all shared).
  std::optional<Prefix> prefix;
  std::vector<std::int64_t> written;    ///< [rows] slot of each new row
  ReadForm read_form = ReadForm::kNone;
  std::vector<std::vector<std::int64_t>> read;  ///< [rows] slots each query read (-1 ignored)
  BlockTable block_table;
  TraceReadView read_view = TraceReadView::kAfterWrites;
  /// Optional row data (rows before RoPE, as in the exec protocol) and the
  /// outputs; empty when absent. v is absent for shared rows.
  std::vector<std::vector<double>> k, v, q, out;
  /// Any step: slots written with no token, rows moved [from, to], slots
  /// released (adapters/PROTOCOL.md "Padding, moves and frees"); empty when absent.
  std::vector<std::int64_t> padded;
  std::vector<std::pair<std::int64_t, std::int64_t>> moved;
  std::vector<std::int64_t> freed;
  /// Any step: slots released to the cache's free pool with their rows
  /// still readable by a later prefix begin (docs/semantics.md "Cached
  /// rows"); empty when absent.
  std::vector<std::int64_t> cached;
  /// A prefix begin: positions left to the request's next writing step; a
  /// writing step: (position, slot) of each prefix row it stored that its
  /// begin left to it (docs/semantics.md "Recompute in a step"); empty when absent.
  std::vector<std::int64_t> recompute;
  std::vector<std::pair<std::int64_t, std::int64_t>> recomputed;
  /// "code: detail" when the cache refused this call (the run stops there).
  std::optional<std::string> refused;
  bool operator==(const TraceStep&) const = default;
};

/// One run: its header and its records, in file order.
struct TraceRun {
  std::string source;            ///< file name (for messages), may be empty
  std::int64_t header_line = 0;  ///< 1-based line of the header
  TraceHeader header;
  std::vector<TraceStep> steps;
  bool operator==(const TraceRun&) const = default;
};

/// The StepKind of a record kind (kBegin has none: returns kDecode).
constexpr StepKind trace_step_kind(TraceKind k) noexcept {
  return k == TraceKind::kBegin ? StepKind::kDecode : static_cast<StepKind>(k);
}

/// The record kind of a step kind.
constexpr TraceKind trace_kind(StepKind k) noexcept { return static_cast<TraceKind>(k); }

/// Whether a record kind writes rows (prefill, decode, verify; never begin).
constexpr bool trace_kind_writes(TraceKind k) noexcept {
  return k != TraceKind::kBegin && step_kind_writes_rows(trace_step_kind(k));
}

/// The scenario step a step record stands for: its kind, request and the
/// fields its kind carries (StepFields); a begin reads as a decode.
inline Step trace_record_step(const TraceStep& s) noexcept {
  Step step;
  step.kind = trace_step_kind(s.kind);
  step.request = s.request;
  if (s.kind == TraceKind::kBegin) return step;
  switch (step_kind_fields(step.kind)) {
    case StepFields::kRowsOrder:
      step.rows = s.rows;
      step.order = s.order;
      break;
    case StepFields::kDrafts: step.drafts = s.drafts; break;
    case StepFields::kAccepted: step.accepted = s.accepted; break;
    case StepFields::kPositions: step.positions = s.positions; break;
    case StepFields::kNone: break;
  }
  return step;
}

/// Keys a query sees under the header's window (keys: W; left, off-by-one: W + 1).
constexpr std::int64_t trace_window_keys(const TraceHeader& h) noexcept {
  return h.convention == Convention::kKeys ? h.window : h.window + 1;
}

/// Keys a query of `layer` sees: its own window when the header lists layer
/// windows (kGlobalWindowKeys for a global layer), else the header's.
constexpr std::int64_t trace_layer_window_keys(const TraceHeader& h, std::int32_t layer) noexcept {
  if (layer < 0 || static_cast<std::size_t>(layer) >= h.layer_windows.size()) return trace_window_keys(h);
  const LayerWindow& w = h.layer_windows[static_cast<std::size_t>(layer)];
  if (!w.window) return kGlobalWindowKeys;
  return w.convention == Convention::kKeys ? *w.window : *w.window + 1;
}

}  // namespace kvcheck::scenarios
