#include "model/trace.hpp"

#include "model/address.hpp"

namespace kvcheck::model {

std::vector<TraceRow> ring_trace(std::int64_t window_keys, std::int64_t ring_rows, std::int64_t state,
                                 const std::vector<std::int64_t>& positions) {
  const Ring ring{state + 1, ring_rows, window_keys};
  std::vector<TraceRow> rows;
  for (const std::int64_t p : positions) {
    const DecodeMeta m = decode_meta(state, p, ring);
    rows.push_back({p, m.start, m.start + m.length - 1, m.read_offset, m.last_read_slot, m.write_slot});
  }
  return rows;
}

}  // namespace kvcheck::model
