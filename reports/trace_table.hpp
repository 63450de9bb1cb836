// The ring trace table of `kvcheck trace`, as text (docs/semantics.md's layout) and as
// JSON (an array of objects). The rows are computed by the address oracle
// (model/trace.hpp); this file only formats plain integers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvcheck::reports {

/// One query's row of the trace table.
struct TraceLine {
  std::int64_t position = 0;
  std::int64_t logical_first = 0;
  std::int64_t logical_last = 0;
  std::int64_t first_read_slot = 0;
  std::int64_t last_read_slot = 0;
  std::int64_t write_slot = 0;
};

/// Header line naming the state's slots, then one aligned row per query.
std::string trace_text(std::int64_t window, std::int64_t ring, std::int64_t state,
                       const std::vector<TraceLine>& lines);

/// JSON array with keys position, logical_first, logical_last,
/// first_read_slot, last_read_slot, write_slot (ends with a newline).
std::string trace_json(const std::vector<TraceLine>& lines);

}  // namespace kvcheck::reports
