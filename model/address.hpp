// The address oracle: where a ring-addressed sliding-window cache must put and
// find each row (docs/semantics.md "Ring addressing"), and which tag every slot must hold after any
// sequence of writes. Plain integer arithmetic written from docs/semantics.md, kept
// apart from impl/'s own index math so a bug cannot sit in both.
#pragma once

#include <cstdint>
#include <vector>

#include "model/visible.hpp"

namespace kvcheck::model {

/// Ring geometry of one layer's pool.
struct Ring {
  std::int64_t states = 1;       ///< state ids
  std::int64_t ring_rows = 1;    ///< S
  std::int64_t window_keys = 1;  ///< W in the keys convention
};

/// Flattened slot of row (state, position): state*S + position mod S.
std::int64_t slot_of(std::int64_t state, std::int64_t position, std::int64_t ring_rows);

/// docs/semantics.md "Ring addressing" decode metadata for one query, plus the trace-table columns.
struct DecodeMeta {
  std::int64_t length = 0;          ///< min(p + 1, W)
  std::int64_t start = 0;           ///< p - length + 1 (logical first)
  std::int64_t read_offset = 0;     ///< first read slot
  std::int64_t last_read_slot = 0;  ///< slot of position p
  std::int64_t write_slot = 0;      ///< slot written by position p
};

/// Decode metadata of a query at `position` in `state`.
DecodeMeta decode_meta(std::int64_t state, std::int64_t position, const Ring& ring);

/// Index row of width `width` (normally W): slots of start..p, then -1.
std::vector<std::int64_t> expand_index(std::int64_t state, std::int64_t position, const Ring& ring,
                                       std::int64_t width);

/// Slots written by `count` rows starting at `first_position`.
std::vector<std::int64_t> write_slots(std::int64_t state, std::int64_t first_position, std::int64_t count,
                                      const Ring& ring);

/// What the oracle says a slot holds. request < 0: never written.
struct SlotTag {
  std::int64_t request = -1;
  std::int64_t position = -1;
  std::uint64_t write_seq = 0;
  bool operator==(const SlotTag&) const = default;
};

/// Expected tag of every slot after any sequence of writes.
class SlotOracle {
 public:
  explicit SlotOracle(const Ring& ring);

  /// Records a write of (request, position) into `state`'s block; returns
  /// the tag it replaced.
  SlotTag write(std::int64_t state, std::int64_t request, std::int64_t position);
  /// Tag the slot holds now.
  const SlotTag& at(std::int64_t slot) const;
  const Ring& ring() const noexcept { return ring_; }
  std::uint64_t writes() const noexcept { return seq_; }

 private:
  Ring ring_;
  std::vector<SlotTag> slots_;
  std::uint64_t seq_ = 0;
};

/// For queries at `query_positions` of (state, request) that read after the
/// step's rows are stored, the visible positions whose slot no longer holds
/// (request, j), per query (descending positions within each list are not
/// implied; they are ascending). The oracle must already hold the step's
/// writes.
std::vector<std::vector<std::int64_t>> overwritten_visible(const SlotOracle& oracle, std::int64_t state,
                                                           std::int64_t request,
                                                           const std::vector<std::int64_t>& query_positions);

/// Applies one step of `count` rows at first_position..+count-1 to the
/// oracle and returns, per query of the step, the visible positions it loses.
/// store_before_read: every row is stored before any query reads the ring
/// (decode, verify, store_then_load). Otherwise the old window is read first
/// (load_then_store): old positions are judged before the writes, new ones
/// come from the step itself and are never lost.
std::vector<std::vector<std::int64_t>> apply_step(SlotOracle& oracle, std::int64_t state,
                                                  std::int64_t request, std::int64_t first_position,
                                                  std::int64_t count, bool store_before_read);

}  // namespace kvcheck::model
