// Report: everything one kvcheck invocation hands to the writers (JSON, text,
// JUnit, HTML). The context says how the run was made (version, seed, backend,
// fault, command line) so any report can be replayed; the runs are the
// observations of properties/observation.hpp; the check summary is present
// only for property checks. Nothing here holds wall-clock time: equal input
// gives byte-identical reports.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "properties/observation.hpp"
#include "reports/output_set.hpp"

namespace kvcheck::reports {

/// How the reported runs were made; enough to replay them.
struct ReportContext {
  std::string tool_version = "0.1.0";  ///< kvcheck version
  std::uint64_t seed = 0;              ///< the invocation's seed
  std::string backend = "cpu";         ///< "cpu", "cuda", ...
  std::string fault = "none";          ///< injected fault, "none" for production code
  /// The reference's real significand bits, as every run records them: 53,
  /// 114 (`--precision 113`, mpfr_float_backend<34>) or 168 (`--precision 169`).
  int precision_bits = 114;
  int precision_requested = 113;  ///< `--precision` as given: 53, 113 or 169
  std::string command;            ///< the exact command line
};

/// One coverage class of a property check and its minimum-coverage gate.
struct CoverageCount {
  std::string name;          ///< e.g. "ring wrap", "verify with rejection"
  std::int64_t count = 0;    ///< cases that hit the class
  std::int64_t minimum = 1;  ///< gate: fewer hits fail the check
  /// True when the gate is met.
  bool met() const noexcept { return count >= minimum; }
};

/// The outcome of a property check (absent for single scenario runs).
struct CheckSummary {
  std::int64_t cases = 0;               ///< cases run
  std::int64_t failures = 0;            ///< cases that failed
  std::vector<CoverageCount> coverage;  ///< coverage classes with their gates
  std::string counterexample_file;      ///< shrunk schedule written as JSON, if any
  std::string replay_command;           ///< exact command that replays the failure
  std::uint64_t failing_case_seed = 0;  ///< seed of the failing case
  /// True when no case failed and every coverage gate is met.
  bool passed() const noexcept;
};

/// The full report.
struct Report {
  ReportContext context;
  std::vector<properties::RunObservation> runs;
  std::optional<CheckSummary> check;
  /// Files written in the same set as the reports (the counterexample); the
  /// writers never read them.
  std::vector<OutputFile> attachments;
  /// True when every run passed and the check (if any) passed.
  bool passed() const noexcept;
};

// ---- helpers shared by the writers -------------------------------------------

/// True when the query lost a row, read an extra row or missed its tolerance.
bool query_failed(const properties::QueryObservation& query) noexcept;

/// True when the step has a failing query, a collision or a failed expectation.
/// A typed refusal (`error`) alone is not a failure: scenarios may expect it.
bool step_failed(const properties::StepObservation& step) noexcept;

/// Index of the first failing step, or -1.
std::int64_t first_failing_step(const properties::RunObservation& run) noexcept;

/// Index of the query to explain in a step: the first failing one, else the
/// last one; -1 when the step has no queries.
std::int64_t focus_query(const properties::StepObservation& step) noexcept;

/// Per-query overwritten counts of a step, e.g. "[5,4,3,2,1,0]".
std::string overwritten_counts(const properties::StepObservation& step);

/// "[a,b,c]", truncated after `limit` items as "[a,b,… (N more)]".
std::string int_list(const std::vector<std::int64_t>& values, std::size_t limit = 16);

/// A double in the shortest form that round-trips ("0.5", "1e-300", "inf").
std::string format_double(double value);

/// The replay command of a run: the check's replay command when present,
/// else the context's command line; empty when neither is known.
std::string replay_command(const Report& report);

}  // namespace kvcheck::reports
