// The shadow map: what kvcheck believes each slot of a cache under test
// holds, built only from what the cache reported (the slot each new row was
// written to), and the SPEC §4 slot observations derived from it for every
// query of a step (overwritten visible rows, missing and extra reads) and for
// the step (slot collisions). A slot is an opaque integer: ring, paged or
// anything else. The runner (live caches) and `kvcheck audit` (recorded
// traces) both observe through this one class.
#pragma once

#include <cstdint>
#include <map>
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
  bool operator==(const ShadowRow&) const = default;
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

  /// What `slot` holds now.
  ShadowRow at(std::int64_t slot) const;
  /// Rows written so far (for memory accounting in tests).
  std::size_t slots_used() const noexcept { return slots_.size(); }
  /// Writes applied so far: the next step's row i gets write number write_count() + i + 1.
  std::uint64_t write_count() const noexcept { return write_seq_; }

 private:
  struct Latest {
    std::uint64_t write_seq = 0;
    std::int64_t slot = -1;
  };
  std::unordered_map<std::int64_t, ShadowRow> slots_;
  std::map<std::pair<std::int64_t, std::int64_t>, Latest> latest_;  // (request, position)
  std::uint64_t write_seq_ = 0;
};

}  // namespace kvcheck::properties
