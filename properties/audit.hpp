// `kvcheck audit`: judges recorded traces (scenarios/trace.hpp) like live
// runs. Each trace run becomes a scenario (the header's window, capacity and
// row layout; the requests, states and steps of the records; the recorded
// rows as explicit rows), validated like any scenario file, and is run by
// properties::run_scenario against the trace provider of
// engines/trace_cache.hpp, which answers every call from its record. The
// observations, the verdict and every report therefore mean exactly what
// they mean for a live cache.
//
// Outputs are judged only when the header has "cache" and every writing step
// that was not refused carries k, q (v unless shared rows) and out; otherwise
// the run's `observed` is "slots" (slots judged, outputs not). A position
// rewritten with new content (a rejected draft written again, a reset) gets
// one explicit row per writing step (ExplicitRow::step).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "properties/observation.hpp"
#include "scenarios/scenario.hpp"
#include "scenarios/trace.hpp"

namespace kvcheck::properties {

/// How traces are audited.
struct AuditOptions {
  int precision_bits = 113;  ///< reference significand bits: 53, 113 (default) or 169
  bool record_reads = true;  ///< keep every read in QueryObservation::reads
  bool record_ring = true;   ///< keep StepObservation::ring_positions (ring addressing, S <= 512)
  /// RunOptions::on_query_judged of every run (a progress line); may be empty.
  std::function<void(std::int64_t reads)> on_query_judged;
};

/// The scenario a trace run describes.
struct TraceScenario {
  scenarios::Scenario scenario;  ///< passes scenarios::validate_scenario
  bool judge_outputs = false;    ///< rows and outputs recorded for every writing step
  std::string outputs_note;      ///< why outputs are not judged (empty when they are)
};

/// Builds and validates the scenario of `run`. Throws kvcheck::Error naming
/// the trace line ("line 7: accepted", "line 1: capacity") when the records
/// are not a valid schedule (docs/semantics.md "Steps": positions, accepts, states, finished
/// requests) or the header cannot describe a cache.
TraceScenario trace_scenario(const scenarios::TraceRun& run);

/// Audits one run (see the file comment). Throws kvcheck::Error for an
/// invalid trace, like trace_scenario.
RunObservation audit_run(const scenarios::TraceRun& run, const AuditOptions& options);

/// Audits every run, in order; one observation per run.
std::vector<RunObservation> audit_trace(const std::vector<scenarios::TraceRun>& runs,
                                        const AuditOptions& options);

}  // namespace kvcheck::properties
