// Two caches side by side (`check --impl A --against B`, `--repeat-bitwise`):
// the same scenario runs on both, each through its own shadow map, and the
// two runs are compared step by step. Compared is what the caches hold and
// do, never how they address it: the resident set after each step (which
// positions of which request the written slots hold, slot numbers left
// out), which positions each query read, and each query's output (beyond
// the larger of the two caches' output tolerances, or bit for bit). A
// refusal or a stop on one side only is a difference, shown as such; so is
// a step both refuse or crash at (each cache's own failure counts: two
// caches failing alike do not agree). A configuration both refuse at open,
// or one a cache's capabilities exclude (replay of a given scenario: a
// check draws inside both), is not compared.
//
// The property of a side-by-side check is "the two runs agree"; a case where
// they do not is shrunk like any failing case (properties/check.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engines/cache_under_test.hpp"
#include "properties/observation.hpp"
#include "properties/runner.hpp"
#include "scenarios/scenario.hpp"

namespace kvcheck::properties {

/// One step (on one layer) where the two runs differ.
struct StepDifference {
  std::int64_t step = -1;  ///< index into the scenario's steps; -1: at open
  std::int32_t layer = 0;
  std::string kind;  ///< the step's kind ("decode", ...); "open" at open
  std::int64_t request = -1;
  /// What differs: "refusal" (one side refused or crashed, the other ran),
  /// "both-stopped" (both refused, crashed or got a probe wrong at this
  /// step: each cache's own failure, never an agreement), "stopped" (one
  /// run ended before this step), "resident", "reads", "outputs".
  std::string what;
  std::string detail;  ///< one line, naming the sides A and B
};

/// What comparing two runs of one scenario found.
struct PairComparison {
  /// Not compared: a cache's declared capabilities exclude it (nothing was
  /// sent to that cache), or both caches refused it at open.
  bool skipped = false;
  bool refused = false;     ///< with skipped: both caches refused it at open
  std::string skip_reason;  ///< with skipped: why, naming the cache
  /// What was compared: cases 1 when both caches ran it (neither skipped
  /// nor refused at open), else 0 and nothing compared.
  ComparedCounts counts;
  std::vector<StepDifference> differences;  ///< every differing step, in order
  bool differ() const noexcept { return !differences.empty(); }
};

/// Compares two runs of the same scenario (runs made with record_reads,
/// record_outputs and record_resident). `bitwise`: outputs must be equal
/// bit for bit, in the narrower of the two runs' declared output formats
/// when they differ (the other side's outputs rounded once, to nearest even,
/// into it; docs/semantics.md "Output formats"). `resident`: compare the resident sets too (run_pair: when
/// resident_sets_comparable).
PairComparison compare_runs(const RunObservation& a, const RunObservation& b, bool bitwise,
                            bool resident = true);

/// Whether two caches' resident sets mean the same thing: both report the
/// rows they free, or neither does and both declare the same addressing (a
/// ring, or paged with one block size, or neither). A cache that reports no
/// frees holds a row, as its reports show it, until its slot is written
/// again, which depends on how it addresses: a ring of S rows per state and
/// a pool of blocks holding the same live rows keep different stale ones,
/// and one that reports frees keeps none. Against a full-window cache
/// (whose cases never overwrite a row) neither reporting frees suffices.
bool resident_sets_comparable(const engines::Capabilities& a, const engines::Capabilities& b) noexcept;

/// What both caches can run: a case of a side-by-side check is drawn inside
/// it (every step kind, format, shape and limit both declare).
engines::Capabilities intersect_capabilities(const engines::Capabilities& a, const engines::Capabilities& b);

/// Whether `run` asks for two caches side by side (--against, --repeat-bitwise).
bool runs_side_by_side(const RunOptions& run) noexcept;

/// The run options of the second cache: `--against`'s cache with no fault,
/// or (--repeat-bitwise) the first cache again with its fault.
RunOptions second_run(const RunOptions& first);

/// "agreement" (--against) or "repeat-bitwise": the property's name in
/// reports.
std::string side_by_side_property(const RunOptions& run);

/// Both runs of one scenario and what comparing them found.
struct PairRun {
  RunObservation a;
  RunObservation b;
  PairComparison comparison;
  /// The two runs as one observation for the check's bookkeeping: passed
  /// when they agree, skipped when neither ran, its first failure the first
  /// difference, its queries the queries compared.
  RunObservation summary;
};

/// Runs `scenario` on a cache of `a` and on one of `b` (they may be the same
/// provider: two fresh caches of it), with `options` (reads, outputs and
/// resident sets are kept whatever it says; `b` runs with second_run's
/// fault), and compares them.
PairRun run_pair(const scenarios::Scenario& scenario, const RunOptions& options, engines::CacheProvider& a,
                 engines::CacheProvider& b);

/// "step 3 (decode) layer 0 request 1: outputs: ...".
std::string difference_text(const StepDifference& difference);

}  // namespace kvcheck::properties
