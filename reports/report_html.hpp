// One self-contained HTML page (inline CSS and SVG; no scripts, no external
// resources): a summary table of runs; for each failing run (or, when nothing
// failed, the first few runs) a picture of the state's ring at the failing
// read, a bar chart of overwritten rows per query of that step, and a table
// of the run's steps.
#pragma once

#include <string>

#include "reports/report.hpp"

namespace kvcheck::reports {

/// The report as one HTML page (UTF-8, trailing newline).
std::string report_html(const Report& report);

}  // namespace kvcheck::reports
