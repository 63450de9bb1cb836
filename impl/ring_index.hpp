// Ring index math of the implementations: the ring kind of the slot map
// (impl/slot_map.hpp), host and device, so the CPU test suite exercises what
// the CUDA code compiles. Faults that live in address math are applied here,
// so every backend breaks the same way. The reference model has its own,
// separate oracle in model/address.hpp.
#pragma once

#include <cstdint>

#include "impl/host_device.hpp"
#include "impl/kv_cache.hpp"

namespace kvcheck::impl {

/// Decode metadata of one query on the ring: where its window starts, how
/// many columns are valid, and where its own row goes.
struct ReadMeta {
  std::int64_t read_offset = 0;  ///< first read slot
  std::int64_t length = 0;       ///< valid index columns
  std::int64_t write_slot = 0;   ///< slot of the query's own row
};

/// Positive modulo for non-negative a and positive m.
KVCHECK_HOST_DEVICE std::int64_t ring_mod(std::int64_t a, std::int64_t m) {
  return a % m;
}

/// Keys visible per query after faults that change the window.
KVCHECK_HOST_DEVICE std::int64_t ring_window_keys(std::int64_t window_keys, Fault fault) {
  if (fault == Fault::kWindowTooWide) return window_keys + 1;
  if (fault == Fault::kWindowTooNarrow) return window_keys > 1 ? window_keys - 1 : 1;
  return window_keys;
}

/// Slot of (state, position): state*S + position mod S, or a faulty variant.
KVCHECK_HOST_DEVICE std::int64_t ring_slot(std::int64_t state, std::int64_t position, std::int64_t ring_rows,
                                           std::int64_t states, Fault fault) {
  if (fault == Fault::kSlotNoStateOffset) return ring_mod(position, ring_rows);
  if (fault == Fault::kModuloWholePool) {
    return ring_mod(state * ring_rows + position, states * ring_rows);
  }
  return state * ring_rows + ring_mod(position, ring_rows);
}

/// Decode metadata of one query.
KVCHECK_HOST_DEVICE ReadMeta ring_metadata(std::int64_t state, std::int64_t position,
                                           std::int64_t window_keys, std::int64_t ring_rows,
                                           std::int64_t states, Fault fault) {
  const std::int64_t keys = ring_window_keys(window_keys, fault);
  const std::int64_t len = position + 1 < keys ? position + 1 : keys;
  const std::int64_t start = position - len + 1;
  ReadMeta m;
  m.read_offset = ring_slot(state, start, ring_rows, states, fault);
  m.length = len;
  m.write_slot = ring_slot(state, position, ring_rows, states, fault);
  return m;
}

/// Index column c of a query with metadata m: the slot of start + c within
/// the block that holds read_offset, or -1 past the valid length (the seed's
/// get_kv_index ring branch). The no-padding fault keeps wrapping instead.
KVCHECK_HOST_DEVICE std::int64_t ring_index_column(const ReadMeta& m, std::int64_t c, std::int64_t ring_rows,
                                                   Fault fault) {
  if (c >= m.length && fault != Fault::kIndexNoPadding) return -1;
  const std::int64_t base = m.read_offset / ring_rows * ring_rows;
  return base + ring_mod(m.read_offset - base + c, ring_rows);
}

/// RoPE position used for a row at `position` (the resident-length fault
/// rotates by min(position, S) instead).
KVCHECK_HOST_DEVICE std::int64_t ring_rope_position(std::int64_t position, std::int64_t ring_rows,
                                                    Fault fault) {
  if (fault == Fault::kRopeResidentLength && position > ring_rows) return ring_rows;
  return position;
}

}  // namespace kvcheck::impl
