// Addressing apart from the data kernels. A SlotMap is a small descriptor
// that says where the row of (state, position) lives in a pool and which pool
// slots a query's window reads. The kernel table (impl/kv_cache.hpp) takes
// only what is made here (write slot lists and index rows, -1 padded) and
// never computes an address itself, so a ring and a block table are two
// descriptors over one kernel table, as FlashInfer hands its paged_kv_t
// descriptor to the same attention kernels whatever the page table holds.
//
//   ring         slot = state * S + position mod S (impl/ring_index.hpp, with
//                the named address faults applied there)
//   block table  logical block j = position / block_rows of a state uses
//                entry j mod table_blocks of its row in `block_table`; slot =
//                block id * block_rows + position mod block_rows
//
// PoolAddressing is what RingPool composes with its kernels: the slot map of
// the next step and, for a map that changes as requests grow (a block table
// whose blocks are handed out on demand), the calls that keep it filled.
// Host and device (KVCHECK_HOST_DEVICE) for the descriptor functions.
#pragma once

#include <cstdint>

#include "impl/host_device.hpp"
#include "impl/kv_cache.hpp"
#include "impl/ring_index.hpp"

namespace kvcheck::impl {

/// The kinds of slot map.
enum class SlotMapKind : std::uint8_t {
  kRing,        ///< one block of ring_rows slots per state, positions modulo ring_rows
  kBlockTable,  ///< per-state table of block ids (paged)
};

/// Where the rows of each (state, position) live in one pool.
struct SlotMap {
  SlotMapKind kind = SlotMapKind::kRing;
  std::int64_t states = 1;      ///< state ids the map addresses
  std::int64_t pool_slots = 0;  ///< slots of the pool the map points into
  // kRing
  std::int64_t ring_rows = 0;  ///< S: rows per state block
  Fault fault = Fault::kNone;  ///< the ring's address faults (impl/ring_index.hpp); others are ignored
  // kBlockTable
  std::int64_t block_rows = 0;                ///< rows per block
  std::int64_t table_blocks = 0;              ///< entries per state in block_table
  const std::int64_t* block_table = nullptr;  ///< [states, table_blocks] block ids, -1 = no block
};

/// The ring of `states` blocks of `ring_rows` slots, with `fault`'s address math.
KVCHECK_HOST_DEVICE SlotMap ring_slot_map(std::int64_t states, std::int64_t ring_rows, Fault fault) {
  SlotMap map;
  map.kind = SlotMapKind::kRing;
  map.states = states;
  map.pool_slots = states * ring_rows;
  map.ring_rows = ring_rows;
  map.fault = fault;
  return map;
}

/// A block table over a pool of `pool_blocks` blocks of `block_rows` slots.
/// `table` ([states, table_blocks]) stays owned by the caller and may change
/// between steps.
KVCHECK_HOST_DEVICE SlotMap block_table_slot_map(std::int64_t states, std::int64_t block_rows,
                                                 std::int64_t table_blocks, std::int64_t pool_blocks,
                                                 const std::int64_t* table) {
  SlotMap map;
  map.kind = SlotMapKind::kBlockTable;
  map.states = states;
  map.pool_slots = pool_blocks * block_rows;
  map.block_rows = block_rows;
  map.table_blocks = table_blocks;
  map.block_table = table;
  return map;
}

/// Slot of the row of (state, position), or -1 when the map holds none
/// (a block table entry without a block). state in [0, states), position >= 0.
KVCHECK_HOST_DEVICE std::int64_t slot_map_slot(const SlotMap& map, std::int64_t state,
                                               std::int64_t position) {
  if (map.kind == SlotMapKind::kRing) return ring_slot(state, position, map.ring_rows, map.states, map.fault);
  const std::int64_t entry = position / map.block_rows % map.table_blocks;
  const std::int64_t block = map.block_table[state * map.table_blocks + entry];
  return block < 0 ? -1 : block * map.block_rows + position % map.block_rows;
}

/// Index row of one query of `state` reading `length` keys from
/// `first_position` on: `width` columns, column c < length the slot of
/// position first_position + c, -1 after. The ring expands from the slot of
/// first_position inside that slot's block (ring_index_column), so its
/// address faults read exactly what they always read.
KVCHECK_HOST_DEVICE void slot_map_index_row(const SlotMap& map, std::int64_t state,
                                            std::int64_t first_position, std::int64_t length,
                                            std::int64_t width, std::int64_t* row) {
  if (map.kind == SlotMapKind::kRing) {
    ReadMeta m;
    m.read_offset = ring_slot(state, first_position, map.ring_rows, map.states, map.fault);
    m.length = length;
    for (std::int64_t c = 0; c < width; ++c) row[c] = ring_index_column(m, c, map.ring_rows, map.fault);
    return;
  }
  for (std::int64_t c = 0; c < width; ++c)
    row[c] = c < length ? slot_map_slot(map, state, first_position + c) : -1;
}

/// What RingPool composes with its kernels for addressing.
class PoolAddressing {
 public:
  virtual ~PoolAddressing() = default;
  /// The descriptor the next step reads; valid until the next reserve or release.
  virtual const SlotMap& slot_map() const noexcept = 0;
  /// Makes positions [first_position, first_position + rows) of `state`
  /// addressable before a step writes them. A refusal (no free block) is a
  /// typed Status and changes nothing.
  virtual Status reserve(std::int64_t state, std::int64_t first_position, std::int64_t rows) = 0;
  /// The state's request ended (finish): what it held may go to another.
  virtual void release(std::int64_t state) = 0;
};

}  // namespace kvcheck::impl
