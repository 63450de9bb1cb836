// The docs/semantics.md's ring trace table for any window, ring, state and positions:
// logical range, first/last read slot and write slot of each query, from the
// address oracle.
#pragma once

#include <cstdint>
#include <vector>

namespace kvcheck::model {

/// One row of the trace table.
struct TraceRow {
  std::int64_t position = 0;
  std::int64_t logical_first = 0;
  std::int64_t logical_last = 0;
  std::int64_t first_read_slot = 0;
  std::int64_t last_read_slot = 0;
  std::int64_t write_slot = 0;
};

/// Trace rows for `positions` of state `state` with window W (keys) and ring S.
std::vector<TraceRow> ring_trace(std::int64_t window_keys, std::int64_t ring_rows, std::int64_t state,
                                 const std::vector<std::int64_t>& positions);

}  // namespace kvcheck::model
