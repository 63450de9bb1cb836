// BlockTable: the paged addressing of a pool (impl/slot_map.hpp), ready for
// RingPool::create. The pool is `pool_blocks` blocks of `block_rows` slots;
// each state has a row of `table_blocks` entries, and a state's logical block
// j (positions j*block_rows ..) uses entry j mod table_blocks, so a sliding
// window reuses its own blocks in place once it has table_blocks of them
// (table_blocks * block_rows plays the part of the ring's S). Blocks are
// handed out on demand, last freed first, when a step is about to write a
// position whose entry is empty, and go back to the free list on finish.
// Host only; nothing here allocates after create().
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "impl/kv_cache.hpp"
#include "impl/slot_map.hpp"

namespace kvcheck::impl {

class BlockTable final : public PoolAddressing {
 public:
  /// A table for `states` states over `pool_blocks` blocks of `block_rows`
  /// slots, `table_blocks` entries per state. Sizes must be positive
  /// (kZeroRing) and their products fit int64 (kSizeOverflow).
  static Status create(std::int64_t states, std::int64_t block_rows, std::int64_t table_blocks,
                       std::int64_t pool_blocks, std::unique_ptr<BlockTable>* out) {
    if (states <= 0 || block_rows <= 0 || table_blocks <= 0 || pool_blocks <= 0) {
      return Status::fail(CacheError::kZeroRing,
                          "block table: states, block_rows, table_blocks and "
                          "pool_blocks must be positive");
    }
    std::int64_t entries = 0, slots = 0;
    if (__builtin_mul_overflow(states, table_blocks, &entries) ||
        __builtin_mul_overflow(pool_blocks, block_rows, &slots)) {
      return Status::fail(CacheError::kSizeOverflow, "block table: sizes overflow");
    }
    try {
      std::unique_ptr<BlockTable> table(new BlockTable());
      table->table_.assign(static_cast<std::size_t>(entries), -1);
      table->free_.reserve(static_cast<std::size_t>(pool_blocks));
      for (std::int64_t b = 0; b < pool_blocks; ++b) table->free_.push_back(b);
      table->map_ = block_table_slot_map(states, block_rows, table_blocks, pool_blocks, table->table_.data());
      *out = std::move(table);
    } catch (const std::bad_alloc&) {
      return Status::fail(CacheError::kAllocation, "block table could not be allocated");
    }
    return {};
  }

  const SlotMap& slot_map() const noexcept override { return map_; }

  /// Gives the empty entries of positions [first_position, + rows) a block
  /// each; refuses with kAllocation, changing nothing, when too few are free.
  Status reserve(std::int64_t state, std::int64_t first_position, std::int64_t rows) override {
    const std::int64_t first = first_position / map_.block_rows;
    const std::int64_t last = (first_position + rows - 1) / map_.block_rows;
    // Entries j mod table_blocks for j in [first, last]: at most table_blocks distinct.
    const std::int64_t count = std::min(last - first + 1, map_.table_blocks);
    std::int64_t needed = 0;
    for (std::int64_t j = first; j < first + count; ++j) needed += entry(state, j) < 0 ? 1 : 0;
    if (needed > static_cast<std::int64_t>(free_.size())) {
      return Status::fail(CacheError::kAllocation, "block table: no free block for the step's rows");
    }
    for (std::int64_t j = first; j < first + count; ++j) {
      std::int64_t& e = entry(state, j);
      if (e >= 0) continue;
      e = free_.back();
      free_.pop_back();
    }
    return {};
  }

  /// Returns the state's blocks to the free list and empties its entries.
  void release(std::int64_t state) override {
    for (std::int64_t j = 0; j < map_.table_blocks; ++j) {
      std::int64_t& e = entry(state, j);
      if (e >= 0) free_.push_back(e);  // never past the capacity reserved in create
      e = -1;
    }
  }

  /// Blocks no state holds.
  std::int64_t free_blocks() const noexcept { return static_cast<std::int64_t>(free_.size()); }

 private:
  BlockTable() = default;
  std::int64_t& entry(std::int64_t state, std::int64_t j) {
    return table_[static_cast<std::size_t>(state * map_.table_blocks + j % map_.table_blocks)];
  }

  std::vector<std::int64_t> table_;  // [states, table_blocks] block ids, -1 = none
  std::vector<std::int64_t> free_;   // [<= pool_blocks] free block ids, the last handed out first
  SlotMap map_;
};

}  // namespace kvcheck::impl
