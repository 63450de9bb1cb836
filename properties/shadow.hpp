// The shadow map: what kvcheck believes each slot of a cache under test
// holds, built only from what the cache reported (the slot each new row was
// written to), and the docs/semantics.md "What is judged" slot observations derived from it for every
// query of a step (overwritten visible rows, missing and extra reads) and for
// the step (slot collisions). A slot is an opaque integer: ring, paged or
// anything else. The runner (live caches) and `kvcheck audit` (recorded
// traces) both observe through this one class.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engines/cache_under_test.hpp"
#include "properties/observation.hpp"

namespace kvcheck::properties {

/// One row as the shadow map knows it (request < 0: never written).
struct ShadowRow {
  std::int64_t request = -1;
  std::int64_t position = -1;
  std::uint64_t write_seq = 0;  ///< kvcheck's own counter of reported writes, from 1
  /// Padding the cache wrote with request `request`'s step (no token:
  /// position -1, write_seq 0); not a row of the resident set.
  bool padding = false;
  /// The row came here by a move (a copy of a row written elsewhere); not compared.
  bool copied = false;
  /// The cache released the slot to its free pool with the row still in it
  /// (docs/semantics.md "Cached rows"): no request holds it and no bound
  /// counts it; a later write there evicts it, a free ends it, a prefix
  /// begin that shares it takes it back. Not compared.
  bool cached = false;
  /// The row's content lineage (docs/semantics.md "Row lineage"): the write
  /// number of the step row whose values it holds, and that row's request.
  /// A step's row is its own content; a prefix row a begin stores again, and
  /// a move's copy, hold their source's (through any chain of begins), so
  /// every judgement takes them for the same row. 0: no content (empty,
  /// padding).
  std::uint64_t origin = 0;
  std::int64_t origin_request = -1;
  bool operator==(const ShadowRow& o) const noexcept {
    return request == o.request && position == o.position && write_seq == o.write_seq && padding == o.padding;
  }
};

/// What one step did, as the cache (or a trace) reported it.
struct StepFacts {
  std::int64_t request = 0;
  std::int64_t state = 0;
  std::int64_t first_position = 0;  ///< position of row/query 0
  std::int64_t rows = 0;            ///< rows written = queries run
  std::int64_t window_keys = 1;     ///< keys a query sees, itself included
  bool has_written = false;
  std::span<const std::int64_t> written;  ///< [rows]
  bool has_reads = false;
  std::span<const std::int64_t> read_offsets;  ///< [rows + 1]
  std::span<const std::int64_t> read_slots;    ///< -1 entries ignored
  engines::ReadView view = engines::ReadView::kAfterWrites;
  std::int64_t duplicate_slots = 0;  ///< collisions the cache itself counted
  /// Rows moved (slot first's row copied to slot second), in order, before
  /// the step's rows are written.
  std::span<const std::pair<std::int64_t, std::int64_t>> moved;
  /// Padding slots, written after the step's rows (before the reads in the
  /// after-writes view; the causal view's reads see the pool before the step).
  std::span<const std::int64_t> padded;
  /// Ring caches: slots of state b are [b * ring_rows, (b + 1) * ring_rows).
  bool ring = false;
  std::int64_t ring_rows = 0;
  bool record_reads = true;  ///< keep QueryObservation::reads
  bool record_ring = true;   ///< keep StepObservation::ring_positions (ring, S <= 512)
};

/// One layer's shadow map.
class ShadowMap {
 public:
  /// Applies the step's writes and fills `obs` (written_slots, collisions,
  /// and per query position, visible_first, overwritten, missing, extra,
  /// reads). `obs->queries` gets one entry per query; output fields are left
  /// for the caller. Without reported writes and reads only positions and
  /// visible ranges are filled (the step is judged on outputs alone).
  void observe(const StepFacts& facts, StepObservation* obs);

  /// `request` begins from the first `n` positions of `source` (a shared
  /// prefix). Position p is stored again at written[p] when the cache says
  /// so (a new write of `request`'s, holding the source row's content:
  /// docs/semantics.md "Row lineage"); otherwise (-1, or no `written`) it is
  /// `source`'s row where a slot still holds its content (a held slot
  /// before a cached one, its own slot before any copy of it: a
  /// copy-on-write's, or a row another begin stored again), the same row
  /// for both: a later write there, seen by
  /// either, is an overwritten visible row. A prefix row no slot holds any
  /// more (evicted, freed) is absent: a query that needs it finds it
  /// missing. Returns each position's write number (0 where shared or
  /// absent).
  /// `visible_from`: the first position the begun request's queries can
  /// see; a cached row it shares from there on is held again, with the
  /// other cached rows of its block (`block_size` slots; 0: the row alone).
  /// `tally`, when given, counts what the begin found (PrefixTally).
  struct PrefixTally {
    std::int64_t evicted_rows = 0;  ///< rows stored again over cached rows (evictions)
    /// Positions from `visible_from` whose source row was cached and no
    /// slot holds any more (evicted, or freed after): the cache had to store
    /// them again to read them.
    std::int64_t evicted_positions = 0;
    /// Positions not stored again whose row a slot still held (shared, or a
    /// cached row taken back): prefix hits.
    std::int64_t held_positions = 0;
  };
  /// `recompute`: positions the cache left to the request's next writing
  /// step (docs/semantics.md "Recompute in a step"): neither stored nor
  /// shared, absent until recompute() stores them.
  std::vector<std::uint64_t> begin_prefix(std::int64_t request, std::int64_t source, std::int64_t n,
                                          std::span<const std::int64_t> written,
                                          std::int64_t visible_from = 0, PrefixTally* tally = nullptr,
                                          std::int64_t block_size = 0,
                                          std::span<const std::int64_t> recompute = {});
  /// Stores the prefix rows a step recomputed, (position, slot) in order,
  /// before the step's own rows (docs/semantics.md "Recompute in a step"):
  /// each a new write of `request`'s holding the content its begin carried
  /// (the source's row by lineage), as a begin's stored-again row. Returns
  /// each row's write number; `evicted` counts cached rows taken over.
  std::vector<std::uint64_t> recompute(std::int64_t request,
                                       std::span<const std::pair<std::int64_t, std::int64_t>> rows,
                                       std::int64_t* evicted = nullptr);

  /// Copies slot `from`'s row to slot `to`, in order (an empty `from`
  /// empties `to`); the copy becomes the row's home.
  void move(std::span<const std::pair<std::int64_t, std::int64_t>> moved);
  /// Writes padding of `request`'s step at `slots`.
  void pad(std::span<const std::int64_t> slots, std::int64_t request);
  /// Releases `slots` (they hold nothing after). Returns the rows released
  /// for which `visible` is true, each once per slot. A slot in `keep` (the
  /// step's own written slots) was freed either before the step wrote it (a
  /// block freed and taken again within the step: it keeps the step's row
  /// while that row is visible) or after (its row is then out of every
  /// window): released without a count when its row is not visible.
  /// `lost_slots`, when given, gets the slot of each row returned, in order.
  /// `cache` (docs/semantics.md "Cached rows"): the slots keep their rows,
  /// marked cached, instead of being emptied; a row still visible is lost
  /// all the same (any write may take the slot now).
  template <class Visible>
  std::vector<ShadowRow> release(std::span<const std::int64_t> slots, std::span<const std::int64_t> keep,
                                 Visible&& visible, std::vector<std::int64_t>* lost_slots = nullptr,
                                 bool cache = false) {
    std::vector<ShadowRow> lost;
    // Empties the slot, or (cache) marks its row cached; padding is never a row to keep.
    const auto let_go = [&](auto it) {
      if (!cache || it->second.padding) {
        slots_.erase(it);
      } else if (!it->second.cached) {
        it->second.cached = true;
        was_cached_.insert(it->second.write_seq);
      }
    };
    for (const std::int64_t slot : slots) {
      const auto it = slots_.find(slot);
      if (it == slots_.end()) continue;
      if (std::find(keep.begin(), keep.end(), slot) != keep.end()) {
        if (it->second.padding || !visible(it->second)) let_go(it);
        continue;
      }
      // A copy freed while another slot still holds the same content (a
      // copy-on-write's source, a row a begin stored again) loses nothing;
      // a cached one does not count (any write may take it now).
      if (!it->second.padding && is_latest(it->second) && visible(it->second) &&
          !slot_with_content(it->second.origin, slot, false)) {
        lost.push_back(it->second);
        if (lost_slots != nullptr) lost_slots->push_back(slot);
      }
      let_go(it);
    }
    return lost;
  }
  /// Empties `slot`, returning what it held: another layer that shares the
  /// pool wrote there (docs/semantics.md "One pool across layers"). The row
  /// keeps it as its home, so a later read of the slot finds it overwritten.
  ShadowRow take(std::int64_t slot);
  /// Whether `row` is the latest write of its (request, position).
  bool is_latest(const ShadowRow& row) const;
  /// Whether a slot other than `slot` holds write number `write_seq`.
  bool held_elsewhere(std::int64_t slot, std::uint64_t write_seq) const;
  /// The lowest slot other than `except` holding write number `write_seq`
  /// (padding left out); none without a move so far.
  std::optional<std::int64_t> slot_holding(std::uint64_t write_seq,
                                           std::optional<std::int64_t> except = std::nullopt) const;
  /// The lowest slot other than `except` holding a row of content `origin`
  /// (ShadowRow::origin; padding left out; cached rows only with
  /// `cached_too`): without a move or a row stored again, only the write's
  /// own slot can, and callers look there first.
  std::optional<std::int64_t> slot_with_content(std::uint64_t origin,
                                                std::optional<std::int64_t> except = std::nullopt,
                                                bool cached_too = true) const;

  /// The resident set: slots holding a token's row (padding left out), and
  /// blocks of `block_size` slots holding one (block_size 0: not counted);
  /// in all and for the request holding most.
  /// Cached rows (docs/semantics.md "Cached rows") are counted apart, in
  /// no other field.
  struct Resident {
    std::int64_t rows = 0;
    std::int64_t blocks = 0;
    std::int64_t cached_rows = 0;    ///< slots holding a cached row
    std::int64_t cached_blocks = 0;  ///< blocks holding a cached row and no other row
    std::int64_t request_rows = 0;   ///< the most rows one request holds
    std::int64_t request_blocks = 0;  ///< the most blocks one request holds
  };
  /// The totals alone (`rows`, `blocks`; the per-request counts 0): one
  /// pass over the slots, for a bound in all.
  Resident resident_totals(std::int64_t block_size) const;
  /// Per request, a row is held by every request whose row of that position
  /// it is (the writer, and the requests sharing it as a prefix) and that
  /// can still see it (`visible`, asked with that request and position; none
  /// given: every one can), a sharer that reads its own copy of it (a
  /// copy-on-write) left out. A row none of them sees is held by those of
  /// them that are no longer `live` (finished: a prefix cache keeps their
  /// rows for a later begin; none given: every request is live), else by
  /// the request that wrote it (a cache keeping a row past every window
  /// keeps it for its writer). A block is held by the requests holding a
  /// row of it they see, or, where none does, by those its unseen rows are
  /// held by.
  /// `by_request`, when given, gets every holding request's rows and
  /// blocks (added to what it holds: a pool shared by layers sums them).
  struct RequestHeld {
    std::int64_t rows = 0;
    std::int64_t blocks = 0;
  };
  Resident resident_counts(std::int64_t block_size, const std::function<bool(const ShadowRow&)>& visible = {},
                           const std::function<bool(std::int64_t)>& live = {},
                           std::map<std::int64_t, RequestHeld>* by_request = nullptr) const;

  /// Calls `f(slot, row)` for every slot holding something (padding
  /// included), in no particular order.
  template <class F>
  void for_each_slot(F&& f) const {
    for (const auto& [slot, row] : slots_) f(slot, row);
  }
  /// What `slot` holds now.
  ShadowRow at(std::int64_t slot) const;
  /// What every written slot holds now, cached rows left out (docs/semantics.md
  /// "Cached rows"), by lineage (docs/semantics.md "Row lineage"): the
  /// (request, position) of each row's content, once however many slots
  /// hold it, sorted: the resident set as the cache's reports show it, slot
  /// numbers and copies left out.
  std::vector<std::pair<std::int64_t, std::int64_t>> resident() const;
  /// Rows written so far (for memory accounting in tests).
  std::size_t slots_used() const noexcept { return slots_.size(); }
  /// Writes applied so far: the next step's row i gets write number write_count() + i + 1.
  std::uint64_t write_count() const noexcept { return write_seq_; }

 private:
  /// A (request, position)'s row: the write a slot holds for it (0 and
  /// slot -1: no slot held its content at a prefix begin), and its content.
  struct Latest {
    std::uint64_t write_seq = 0;
    std::int64_t slot = -1;
    std::uint64_t origin = 0;
    std::int64_t origin_request = -1;
  };
  /// A row stored again at `slot` (a begin's, a step's recomputed one): a
  /// new write of `request`'s position `p` holding content `origin` of
  /// `origin_request` (origin 0: its own). A cached row it takes is counted
  /// in `evicted`. Returns its write number.
  std::uint64_t store_again(std::int64_t request, std::int64_t p, std::int64_t slot, std::uint64_t origin,
                            std::int64_t origin_request, std::int64_t* evicted);

  std::unordered_map<std::int64_t, ShadowRow> slots_;
  std::map<std::pair<std::int64_t, std::int64_t>, Latest> latest_;  // (request, position)
  std::uint64_t write_seq_ = 0;
  bool any_copies_ = false;  // a move has put a row in a second slot
  bool any_restored_ = false;  // a begin has stored a row's content again (a second slot may hold it)
  std::set<std::uint64_t> was_cached_;  // writes the cache has answered cached (begin_prefix's tally)
};

}  // namespace kvcheck::properties
