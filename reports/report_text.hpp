// The human-readable report: one line per run (PASS/FAIL, name, counts), then
// for each failing run a short explanation of its first failing step that a
// kernel engineer can read in one screen (at most ~25 lines per run).
#pragma once

#include <string>

#include "reports/report.hpp"

namespace kvcheck::reports {

/// The whole text report, ending in a newline.
std::string report_text(const Report& report);

/// One line summarising a run: "FAIL  name  S=128 W=128 ...", no newline.
std::string run_summary_line(const properties::RunObservation& run);

/// Explanation of a failing run: its first failure, the first failing step
/// with each failing query's overwritten list, collisions, max output error
/// in eps units, and the replay command. Lines end in '\n'; at most ~25.
std::string run_explanation(const Report& report, const properties::RunObservation& run);

/// The line after a part's text: "=> PASS", "=> CAUGHT (a planted fault:
/// meant to be caught)", "=> MISSED ...", "=> FAIL".
std::string part_verdict_line(const ReportPart& part);

/// The report's last line: "PASS: " or "FAIL: " and the counts of what
/// ran (a check's cases, the parts, or the runs), newline-terminated.
std::string verdict_line(const Report& report);

}  // namespace kvcheck::reports
