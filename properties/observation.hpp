// What a run observes, per query and per step (docs/semantics.md "What is judged"). Produced by
// properties/runner.hpp from one scenario run on the model and an
// implementation; consumed by reports/. Plain values, no JSON here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kvcheck::properties {

/// The tag a read returned, in plain integers (request < 0: empty slot).
struct ReadTag {
  std::int64_t slot = -1;
  std::int64_t request = -1;
  std::int64_t position = -1;
  std::uint64_t write_seq = 0;
  /// The request whose step wrote the row's content, when another (a prefix
  /// row a begin stored again, docs/semantics.md "Row lineage"); -1: `request`'s own.
  std::int64_t origin_request = -1;
  bool operator==(const ReadTag&) const = default;
  /// The request of the row's content: what `--against` compares reads by.
  std::int64_t lineage() const noexcept { return origin_request >= 0 ? origin_request : request; }
};

/// One query of one step on one layer.
struct QueryObservation {
  std::int64_t position = 0;              ///< the query's absolute position (model truth)
  std::int64_t visible_first = 0;         ///< first visible position (window convention applied)
  std::vector<std::int64_t> overwritten;  ///< visible positions whose slot held another tag when read
  std::vector<std::int64_t> missing;      ///< visible positions not read at all
  std::vector<ReadTag> extra;             ///< reads that no visible position accounts for
  std::vector<ReadTag> reads;             ///< every read, in index-column order
  /// The cache's output for this query, as it answered (RunOptions::record_outputs; else empty).
  std::vector<double> out;
  double abs_diff = 0;                    ///< max |impl - reference on the dequantized rows| (kernel error)
  double rel_diff = 0;                    ///< abs_diff / max(|reference|, 1e-30), max over elements
  double eps_units = 0;                   ///< abs_diff / epsilon of the element format
  double quant_abs_diff = 0;  ///< max |impl - reference on the exact rows| (includes quantization)
  double tolerance = 0;       ///< abs tolerance the kernel error was judged against
  double reference_max = 0;   ///< max |reference output element| (the scale of one rounding of the output)
  double rope_tolerance =
      0;  ///< the part of the computed tolerance owed to the RoPE angle error (README "Tolerances")
  /// The part of the tolerance owed to rounding into the cache's declared
  /// output format, where it is narrower than the accumulation (README
  /// "Tolerances"); 0 otherwise.
  double output_rounding_tolerance = 0;
  /// Output elements that are not values of the declared output format (a
  /// bf16 output that is not a bf16 number): each fails the query.
  std::int64_t outputs_off_format = 0;
  bool output_ok = true;
  /// Whether the output was judged: false when the reads were wrong (the
  /// query fails on them), outputs were not checked, or the tolerance reaches
  /// the largest |value| (an output check that could not fail).
  bool output_checked = false;
  bool failed = false;  ///< the verdict of this query (set once, by the runner)
};

/// True when the query read exactly its visible rows (nothing overwritten,
/// missing or extra). Only such a query's output error describes the
/// kernel's arithmetic: the run's maxima (max_eps_units ...) and every
/// report's "max output error" take these queries alone.
inline bool reads_correct(const QueryObservation& q) noexcept {
  return q.overwritten.empty() && q.missing.empty() && q.extra.empty();
}

/// Slot collisions of one step (docs/semantics.md "What is judged", three
/// kinds, and a fourth for one pool across layers).
struct Collisions {
  std::int64_t same_step = 0;        ///< two rows of one step written to one slot
  std::int64_t outside_block = 0;    ///< writes outside the request's own state block
  std::int64_t replaced_needed = 0;  ///< writes replacing a row a query of the same step still reads
  /// A cache with one pool across its layers (docs/semantics.md "One pool
  /// across layers"): writes (rows, padding, moves) over a row another
  /// layer still sees.
  std::int64_t other_layer = 0;
  std::int64_t total() const noexcept { return same_step + outside_block + replaced_needed + other_layer; }
};

/// One step of the schedule on one layer.
struct StepObservation {
  std::int64_t step = 0;  ///< index into the scenario's steps
  std::int32_t layer = 0;
  std::string kind;   ///< "prefill", "decode", ...
  std::string order;  ///< prefill order, else empty
  std::int64_t request = 0;
  std::int64_t state = 0;
  std::int64_t first_position = 0;  ///< model's first written position
  std::vector<std::int64_t> written_slots;
  Collisions collisions;
  /// The first other-layer collision (collisions.other_layer), one line:
  /// the slot, the layer whose row it held and that row.
  std::string other_layer_detail;
  std::vector<QueryObservation> queries;
  /// Ring contents of the request's state block right after the step:
  /// positions held per slot of the block (-1 empty, -2 another request).
  std::vector<std::int64_t> ring_positions;
  /// The rows the shadow map holds after the step (RunOptions::record_resident;
  /// else empty): (request, position) of every written slot's content
  /// (docs/semantics.md "Row lineage"), each once, sorted, slot numbers and
  /// copies left out, so two caches that address, share or store again
  /// differently compare.
  std::vector<std::pair<std::int64_t, std::int64_t>> resident;
  // Slot events the cache answered with the step (padding, moves, frees).
  std::int64_t padded_slots = 0;
  std::int64_t moved_rows = 0;
  std::int64_t freed_slots = 0;
  /// Slots answered `cached` (docs/semantics.md "Cached rows"), and cached
  /// rows this step's writes (its begin's included) took over: evictions.
  std::int64_t cached_slots = 0;
  std::int64_t evicted_rows = 0;
  /// Prefix rows the step stored that its request's begin left to it
  /// (docs/semantics.md "Recompute in a step").
  std::int64_t recomputed_rows = 0;
  /// Rows freed while a query still to run may read them (the step fails).
  std::int64_t freed_visible = 0;
  std::string freed_detail;  ///< the first of them, one line
  /// The resident set after the step, for a cache that reports frees or
  /// declares a bound (-1: not tracked): slots holding a token's row, and
  /// blocks holding one (paged caches; else -1). Counted once, in the
  /// shadow map; reports show reports::resident_text.
  std::int64_t resident_rows = -1;
  std::int64_t resident_blocks = -1;
  /// Cached rows and blocks after the step (a cache that reports cached;
  /// else -1): counted apart from the rows held, in no bound.
  std::int64_t cached_rows = -1;
  std::int64_t cached_blocks = -1;
  /// Blocks (slots, without a block size) still held more steps after
  /// every row in them left the window than the cache's declared free
  /// deferral allows (Capabilities::free_deferral_steps; the step fails).
  std::int64_t late_frees = 0;
  std::string late_detail;       ///< the first of them, one line
  std::int64_t bound_limit = 0;  ///< the declared resident bound in force (0: none)
  std::int64_t bound_held = 0;   ///< what the cache held, counted as the bound counts (the step fails above it)
  std::string bound_unit;        ///< how the bound counts: "rows in all", "blocks per request", ...
  std::string error;  ///< a typed refusal the impl returned, if any
  std::int64_t stored_rows_checked =
      0;  ///< new rows the cache reported as stored, judged against the reference encoding
  std::int64_t encoding_mismatches = 0;  ///< of those, rows that are not a correct encoding (the step fails)
  std::string encoding_detail;           ///< the first mismatch, one line
  bool expectation_failed = false;       ///< a per-step scenario expectation was not met
  std::string expectation_detail;
  bool failed = false;  ///< the verdict of this step (set once, by the runner)
};

/// How much two caches side by side compared (properties/agreement.hpp),
/// for one case or summed over many.
struct ComparedCounts {
  std::int64_t cases = 0;     ///< cases both caches ran
  std::int64_t steps = 0;     ///< step observations (a step on one layer) both ran and compared
  std::int64_t resident = 0;  ///< of those, steps whose resident sets were compared
  std::int64_t queries = 0;   ///< queries of those steps
  std::int64_t reads = 0;     ///< of those, queries whose read positions were compared
  std::int64_t outputs = 0;   ///< of those, queries whose outputs were compared
  /// Cases where both caches stopped at the same step on their own (each
  /// crashed, refused, or got a probe wrong there; or both crashed at open):
  /// each cache's own failure counts, so such a case is not an agreement.
  std::int64_t both_stopped = 0;
  /// With --bitwise, when the two caches declare different output formats:
  /// the narrower one, which outputs were compared in (the other side's
  /// rounded once into it; docs/semantics.md "Output formats"). Empty:
  /// outputs compared as answered.
  std::string bitwise_format;
  ComparedCounts& operator+=(const ComparedCounts& o) {
    if (bitwise_format.empty()) bitwise_format = o.bitwise_format;
    both_stopped += o.both_stopped;
    cases += o.cases;
    steps += o.steps;
    resident += o.resident;
    queries += o.queries;
    reads += o.reads;
    outputs += o.outputs;
    return *this;
  }
  bool operator==(const ComparedCounts&) const = default;
};

/// A request that began from the first `positions` positions of another
/// (a shared prefix), as the run began it.
struct PrefixObservation {
  std::int64_t request = 0;    ///< the request that began from the prefix
  std::int64_t source = 0;     ///< the request whose rows it began from
  std::int64_t positions = 0;  ///< n: positions 0 .. n-1
  /// Of those, positions the cache said it stored again at the begin (on
  /// layer 0); the rest it shares with `source`.
  std::int64_t stored_again = 0;
  /// Of the positions its first query sees, those whose source row the
  /// cache had cached and no slot held any more at the begin (evicted): a
  /// begin from an evicted prefix (on layer 0).
  std::int64_t evicted_positions = 0;
  /// Of the n positions, those the cache left to the request's next
  /// writing step (docs/semantics.md "Recompute in a step"; on layer 0).
  std::int64_t recomputed_in_step = 0;
  std::int64_t begin_step = 0;  ///< scenario step whose call began the request
  bool operator==(const PrefixObservation&) const = default;
};

/// Totals and the verdict of one run.
struct RunObservation {
  std::string scenario_name;
  std::string backend;
  std::string fault;              ///< "none" or a fault name
  std::string window_convention;  ///< "keys", "left", "off-by-one"
  std::int64_t window_keys = 0;  ///< keys a query sees, itself included (the convention applied)
  /// The scenario's own window parameter, read with `window_convention`
  /// ("left" 4 is 5 keys); what reports print beside the convention.
  std::int64_t window = 0;
  /// Keys a query of each layer sees, when the scenario lists layer windows
  /// (0: a global layer that sees every position); empty otherwise.
  std::vector<std::int64_t> layer_window_keys;
  std::int64_t ring_rows = 0;
  /// Paged addressing (the cache's Capabilities::block_size): slots are
  /// block * block_size + offset; 0 for any other cache. The reports then
  /// show block tables and block lifetimes instead of a ring.
  std::int64_t block_size = 0;
  /// Paged: blocks in the pool per layer (in the one pool of a cache whose
  /// layers share it), as the cache was opened.
  std::int64_t pool_blocks = 0;
  std::string format;
  /// The format the cache declared its outputs are written in
  /// (Capabilities::output_format: "bf16", "fp16", "f32", "f64"); empty when
  /// it declared none (outputs as accumulated).
  std::string output_format;
  int precision_bits = 0;  ///< reference significand bits
  /// Requests that began from a shared prefix, in the order they began
  /// (empty for a run without prefixes).
  std::vector<PrefixObservation> prefixes;
  /// Preempted requests resumed (docs/semantics.md "Preemption"): begins
  /// that carried a preempted request's own rows, on layer 0; of those,
  /// begins where the cache still held (or had cached) a row it then did not
  /// store again (a prefix hit served the resume).
  std::int64_t resumes = 0;
  std::int64_t resumes_with_hits = 0;
  /// Writing steps (layer 0) that stored prefix rows their begin left to
  /// them (docs/semantics.md "Recompute in a step").
  std::int64_t steps_recomputing = 0;
  /// A pool shared by the layers (docs/semantics.md "One pool across
  /// layers"): writes to a slot whose last event was a release (freed or
  /// cached) by another layer.
  std::int64_t slots_across_layers = 0;
  std::vector<StepObservation> steps;
  std::int64_t lost_rows = 0;  ///< sum of overwritten + missing over all queries
  std::int64_t extra_reads = 0;
  std::int64_t collisions = 0;
  std::int64_t output_failures = 0;
  double max_abs_diff = 0;               ///< over queries whose reads were all correct
  double max_eps_units = 0;              ///< likewise, in units of the format's epsilon
  double max_quant_abs_diff = 0;         ///< likewise, against the exact rows
  double max_rope_tolerance = 0;         ///< likewise, largest RoPE part of a query's tolerance
  double max_output_rounding_tolerance = 0;  ///< likewise, largest output-format part of a query's tolerance
  std::int64_t stored_rows_checked = 0;  ///< sum over steps
  std::int64_t encoding_mismatches = 0;  ///< sum over steps
  std::int64_t freed_visible = 0;        ///< sum over steps: visible rows freed
  std::int64_t steps_over_bound = 0;     ///< steps (and layers) after which the cache held more than its bound
  std::int64_t late_frees = 0;           ///< sum over steps: blocks held past the declared free deferral
  std::int64_t queries = 0;
  std::int64_t queries_not_output_checked = 0;  ///< queries whose output was not judged (see QueryObservation)
  std::int64_t mpfr_queries =
      0;  ///< queries whose reference outputs MPFR computed (the certified bound did not pin them)
  bool passed = true;                    ///< == (first_failing_step < 0 && !skipped-with-failure)
  std::int64_t first_failing_step = -1;  ///< index into `steps` of the first failed step, -1 when none
  std::string first_failure;             ///< one line: what failed first, where
  bool skipped = false;                  ///< the cache cannot run this scenario (it did not run)
  /// With `skipped`: the cache refused the configuration at open (else its
  /// capabilities exclude the scenario, and nothing was sent).
  bool refused = false;
  std::string skip_reason;
  /// Which observations the cache made available: "slots+outputs" (written
  /// and read slots reported), "written-slots+outputs", "outputs", or
  /// "slots": the cache gave slots and no outputs (a bookkeeping-only
  /// engine, whose outputs kvcheck computes over the rows its slots name;
  /// `kvcheck audit` of a trace without rows and outputs for every writing
  /// step: slots judged, outputs not). properties::observed_name.
  std::string observed = "slots+outputs";
  std::int64_t probes = 0;  ///< refusal probes sent (each must be refused, cache unchanged)
  /// The cache crashed during the run (engines::CacheCrash: an adapter's
  /// process ended, or a C++ cache threw): the run failed at that step with
  /// the crash's message as its first failure.
  bool crashed = false;
};

}  // namespace kvcheck::properties
