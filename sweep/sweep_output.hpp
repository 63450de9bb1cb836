// Writers for a capacity sweep: JSON (nlohmann, fixed key order), CSV, an
// SVG heatmap (window by drafts, one panel per chunk and order, colour = the
// slack of the user's formula, or of the seed's W + k + 1 allocation, over
// the simulated minimum) and a text table. Every writer is a pure function
// of the SweepResult: no times, no paths that depend on the run, so the same
// sweep gives byte-identical files.
#pragma once

#include <string>

#include "sweep/sweep.hpp"

namespace kvcheck::sweep {

/// Version of the sweep JSON document.
inline constexpr int kSweepSchemaVersion = 1;

/// JSON document (2-space indent, ends with a newline); every row has "min_safe_ring".
std::string sweep_json(const SweepResult& result);

/// CSV with a header row (RFC 4180 quoting), one line per configuration.
std::string sweep_csv(const SweepResult& result);

/// SVG heatmap.
std::string sweep_svg(const SweepResult& result);

/// Human-readable table and summary; all rows up to `max_rows`, then only
/// the rows that disagree with docs/semantics.md "Safe capacity", the formula, or their replay.
std::string sweep_table(const SweepResult& result, std::int64_t max_rows = 100);

}  // namespace kvcheck::sweep
