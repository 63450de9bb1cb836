// The audit pipeline behind `kvcheck audit`: recorded traces
// (scenarios/trace.hpp) of an engine that cannot be driven live, or
// recordings kvcheck made itself (--record), judged with the same runner and
// reports as a live run. cli/ reads the flags into an AuditRequest.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "pipelines/check.hpp"

namespace kvcheck::pipelines {

/// What `kvcheck audit` was asked for.
struct AuditRequest {
  std::vector<std::string> files_or_dirs;       ///< trace files (*.jsonl) or directories of them
  int precision_bits = 113;                     ///< --precision: 53, 113 or 169
  std::string command;                          ///< the command line as the report records it
  ReportFiles files;                            ///< --text, --report, --junit, --html
  std::int64_t memory_limit_bytes = INT64_MAX;  ///< --memory-limit, else what the machine has free
  std::string limit_source = "no limit";        ///< where the limit came from (for the refusal)
  std::optional<std::int64_t> work_limit;       ///< --work-limit: most reads; none: no bound
  /// Draws progress (reads judged, reads estimated) for long work; may be empty.
  std::function<void(std::int64_t, std::int64_t)> progress;
};

/// Loads every trace (all before any is judged: a bad file writes nothing),
/// refuses up front what would not fit (estimated memory beyond the limit,
/// kMemory; reads beyond --work-limit, kSize; both naming the trace line or
/// field that drives them), announces long work and shows its progress, judges each run, prints the report and a note for each run whose outputs
/// could not be judged, and writes the report files as one set. Returns 0
/// when every run passed, else 1 (see write_set_keeping_verdict); throws
/// kvcheck::Error for a bad trace or when there is none.
int run_audit(const AuditRequest& request);

}  // namespace kvcheck::pipelines
