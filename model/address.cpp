#include "model/address.hpp"

#include <algorithm>

#include "support/assert.hpp"

namespace kvcheck::model {

std::int64_t slot_of(std::int64_t state, std::int64_t position, std::int64_t ring_rows) {
  KVCHECK_ASSERT(state >= 0 && position >= 0 && ring_rows > 0);
  return state * ring_rows + position % ring_rows;
}

DecodeMeta decode_meta(std::int64_t state, std::int64_t position, const Ring& ring) {
  KVCHECK_ASSERT(ring.window_keys > 0);
  DecodeMeta m;
  m.length = std::min(position + 1, ring.window_keys);
  m.start = position - m.length + 1;
  m.read_offset = slot_of(state, m.start, ring.ring_rows);
  m.last_read_slot = slot_of(state, position, ring.ring_rows);
  m.write_slot = slot_of(state, position, ring.ring_rows);
  return m;
}

std::vector<std::int64_t> expand_index(std::int64_t state, std::int64_t position, const Ring& ring,
                                       std::int64_t width) {
  const DecodeMeta m = decode_meta(state, position, ring);
  std::vector<std::int64_t> index(static_cast<std::size_t>(width), -1);
  for (std::int64_t c = 0; c < std::min(width, m.length); ++c) {
    index[static_cast<std::size_t>(c)] = slot_of(state, m.start + c, ring.ring_rows);
  }
  return index;
}

std::vector<std::int64_t> write_slots(std::int64_t state, std::int64_t first_position, std::int64_t count,
                                      const Ring& ring) {
  std::vector<std::int64_t> slots;
  slots.reserve(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    slots.push_back(slot_of(state, first_position + i, ring.ring_rows));
  }
  return slots;
}

SlotOracle::SlotOracle(const Ring& ring)
    : ring_(ring), slots_(static_cast<std::size_t>(ring.states * ring.ring_rows)) {
  KVCHECK_ASSERT(ring.states > 0 && ring.ring_rows > 0);
}

SlotTag SlotOracle::write(std::int64_t state, std::int64_t request, std::int64_t position) {
  KVCHECK_ASSERT(state >= 0 && state < ring_.states);
  auto& tag = slots_[static_cast<std::size_t>(slot_of(state, position, ring_.ring_rows))];
  const SlotTag replaced = tag;
  tag = SlotTag{request, position, ++seq_};
  return replaced;
}

const SlotTag& SlotOracle::at(std::int64_t slot) const {
  KVCHECK_ASSERT(slot >= 0 && slot < static_cast<std::int64_t>(slots_.size()));
  return slots_[static_cast<std::size_t>(slot)];
}

std::vector<std::vector<std::int64_t>> overwritten_visible(const SlotOracle& oracle, std::int64_t state,
                                                           std::int64_t request,
                                                           const std::vector<std::int64_t>& query_positions) {
  const Ring& ring = oracle.ring();
  const Window window{ring.window_keys, WindowConvention::kKeys};
  std::vector<std::vector<std::int64_t>> lost;
  lost.reserve(query_positions.size());
  for (const std::int64_t p : query_positions) {
    auto& list = lost.emplace_back();
    const PositionRange visible = visible_range(p, window);
    for (std::int64_t j = visible.first; j <= visible.last; ++j) {
      const SlotTag& held = oracle.at(slot_of(state, j, ring.ring_rows));
      if (held.request != request || held.position != j) list.push_back(j);
    }
  }
  return lost;
}

std::vector<std::vector<std::int64_t>> apply_step(SlotOracle& oracle, std::int64_t state,
                                                  std::int64_t request, std::int64_t first_position,
                                                  std::int64_t count, bool store_before_read) {
  std::vector<std::int64_t> queries;
  for (std::int64_t i = 0; i < count; ++i) queries.push_back(first_position + i);
  std::vector<std::vector<std::int64_t>> lost;
  if (!store_before_read) {
    lost = overwritten_visible(oracle, state, request, queries);
    // New positions are read from the step's own rows, not from the ring.
    for (auto& list : lost) {
      std::erase_if(list, [first_position](std::int64_t j) { return j >= first_position; });
    }
  }
  for (const std::int64_t p : queries) oracle.write(state, request, p);
  if (store_before_read) lost = overwritten_visible(oracle, state, request, queries);
  return lost;
}

}  // namespace kvcheck::model
