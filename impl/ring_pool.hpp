// RingPool: the step semantics composed once from a KvBackend's data kernels
// and a slot map (impl/slot_map.hpp), so the CPU and CUDA backends run
// identical schedules and a ring and a block table run the same steps.
//
// One RingPool is one layer's sliding-window pool. A request is bound to a
// state id by begin(); steps then write rows at the request's logical length
// (at the slot map's write slots) and read windows through the slot map's
// index rows:
//   prefill(n, order)  n rows; load_then_store copies the old window to scratch
//                      first, store_then_load stores first and reads the pool
//   decode             1 row, store then read
//   verify(k)          k + 1 rows stored, then every query reads
//   accept(a)          keeps a <= k drafts: length = p + 1 + a
//   finish             frees the state id (old rows stay, stale)
//   reset              length back to 0, storage kept
//   trim(n)            a pending verify's rows dropped, then length -= n
//                      (1 <= n <= the committed length); rows stay, stale
// Named faults (impl/kv_cache.hpp) that live at step level are applied here.
// Every failing call returns a typed Status and changes nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "impl/kv_cache.hpp"
#include "impl/slot_map.hpp"

namespace kvcheck::impl {

/// Host input rows of one step for one request.
struct StepRows {
  const double* k = nullptr;  ///< [n, kv_heads, head_dim]
  const double* v = nullptr;  ///< [n, kv_heads, head_dim]; nullptr for shared rows
  const double* q = nullptr;  ///< [n, q_heads, head_dim]
};

/// Which queries of a step read their window, and what they give back. The
/// default: every query reads and attends. A caller that judges some
/// queries by their tags pays for those alone (the capacity sweep reads the
/// queries whose windows cover the step's, without outputs, and none while
/// it writes a history).
struct StepReads {
  /// Ascending indices into the step's n rows; std::nullopt: every query.
  /// The others only store their rows (their q rows are not used). Indices
  /// out of order or range (kBadArgument), or more readers than
  /// PoolSpec::max_step_readers (kTooManyRows), are refused before a write.
  std::optional<std::span<const std::int64_t>> queries;
  /// false: no outputs (StepResult::out is empty). Reads of the pool then
  /// report each index row's slots and the tags those slots hold without
  /// running attention; load_then_store still attends from scratch, whose
  /// tags only the kernel reports.
  bool outputs = true;
};

/// One slot write performed by a step.
struct WriteRecord {
  std::int64_t slot = 0;
  Tag written;   ///< the new tag
  Tag replaced;  ///< what the slot held before this step wrote it
};

/// What one step did, valid until the next call on the pool (buffers are
/// owned by the pool and preallocated).
struct StepResult {
  std::int64_t queries = 0;  ///< n
  std::int64_t width = 0;    ///< index columns per query
  KvSource source = KvSource::kPool;
  std::int64_t first_position = 0;           ///< position of query 0
  std::int64_t readers = 0;                  ///< queries that read: n, or StepReads::queries' count
  std::span<const double> out;               ///< [readers, q_heads, head_dim]; empty without outputs
  std::span<const std::int64_t> read_slots;  ///< [readers, width], -1 = not read
  std::span<const Tag> read_tags;            ///< [readers, width]
  std::span<const WriteRecord> writes;       ///< in write order
  std::int64_t duplicate_slots = 0;          ///< same-step write-write collisions
};

/// Logical state of one state id.
struct StateInfo {
  bool busy = false;
  std::int64_t request = -1;
  std::int64_t length = 0;           ///< committed positions
  std::int64_t pending_drafts = -1;  ///< k of the last verify awaiting accept, else -1
};

class RingPool {
 public:
  /// Validates `spec` (typed errors for zero/overflowing sizes), asks the
  /// backend whether it supports it, and configures it. The ring-sized-window
  /// fault shrinks ring_rows to window_keys here.
  static Status create(std::unique_ptr<KvBackend> backend, const PoolSpec& spec,
                       std::unique_ptr<RingPool>* out);
  /// The same steps over another addressing (a block table): its slot map
  /// must address spec.states states in pool_slot_count(spec) slots
  /// (kBadSpec otherwise). Named faults keep their step-level effects; the
  /// address faults belong to the ring's slot map.
  static Status create(std::unique_ptr<KvBackend> backend, const PoolSpec& spec,
                       std::unique_ptr<PoolAddressing> addressing, std::unique_ptr<RingPool>* out);

  const PoolSpec& spec() const noexcept { return spec_; }
  KvBackend& backend() noexcept { return *backend_; }
  const KvBackend& backend_const() const noexcept { return *backend_; }
  /// The slot map the next step reads.
  const SlotMap& slot_map() const noexcept { return addressing_->slot_map(); }
  const StateInfo& state(std::int64_t state) const;

  /// Binds `request` to a free state id at length 0.
  Status begin(std::int64_t state, std::int64_t request);
  Status prefill(std::int64_t state, std::int64_t rows, const StepRows& in, PrefillOrder order,
                 StepResult* result, const StepReads& reads = {});
  Status decode(std::int64_t state, const StepRows& in, StepResult* result, const StepReads& reads = {});
  Status verify(std::int64_t state, std::int64_t drafts, const StepRows& in, StepResult* result,
                const StepReads& reads = {});
  Status accept(std::int64_t state, std::int64_t accepted);
  Status finish(std::int64_t state);
  Status reset(std::int64_t state);
  /// Removes the last `positions` committed positions (a pending verify is
  /// dropped first): the next write goes to length - positions.
  Status trim(std::int64_t state, std::int64_t positions);

 private:
  RingPool() = default;
  PoolSpec spec_;
  std::unique_ptr<KvBackend> backend_;
  std::unique_ptr<PoolAddressing> addressing_;
  std::vector<StateInfo> states_;
  // Preallocated step buffers (sized from max_step_rows, max_step_readers and window_keys).
  std::vector<std::int64_t> index_;
  std::vector<std::int64_t> slots_;
  std::vector<std::int64_t> rope_positions_;
  std::vector<Tag> tags_;
  std::vector<double> out_;
  std::vector<std::int64_t> read_slots_;
  std::vector<Tag> read_tags_;
  std::vector<WriteRecord> writes_;
  std::vector<double> reader_q_;  // [max_step_readers, q_heads, head_dim]: q rows of the readers
  StepReads reads_;               // the current step's (set by prepare_step)
  std::uint64_t write_seq_ = 0;
  // Faults at step level keep extra state here (e.g. the freed-state fault
  // remembers each state's old occupant length).
  std::vector<std::int64_t> high_water_;
  // Highest logical length the current occupant of each state reached.
  std::vector<std::int64_t> occupant_high_;
  // Whether each state id has had an occupant before the current one.
  std::vector<bool> reused_;

  Status check_step(std::int64_t state, std::int64_t rows, const StepRows& in, const StepReads& reads) const;
  /// check_step, then the addressing makes the step's positions addressable.
  Status prepare_step(std::int64_t state, std::int64_t rows, const StepRows& in, const StepReads& reads);
  Status run_store(std::int64_t state, std::int64_t first_position, std::int64_t rows, const StepRows& in,
                   StoreReport* report);
  Status run_pool_reads(std::int64_t state, std::int64_t first_position, std::int64_t rows,
                        const StepRows& in);
  std::int64_t read_width() const noexcept;
  /// Queries of the current n-row step that read (reads_.queries, or all
  /// n), the index of reader `i`, and the readers' q rows (gathered when
  /// selected); the most readers a step may have.
  std::int64_t reader_count(std::int64_t rows) const noexcept;
  std::int64_t reader_index(std::int64_t i) const noexcept;
  const double* reader_rows(const StepRows& in);
  std::int64_t max_readers() const noexcept;
  /// A kernel failed after the step's rows were stored: restores the logical
  /// length and returns `failure` with a note that the state needs a reset.
  Status after_failed_read(std::int64_t state, std::int64_t first_position, Status failure);
  void fill_result(std::int64_t rows, std::int64_t readers, std::int64_t first_position, KvSource source,
                   std::int64_t duplicates, StepResult* result) const;
  void note_length(std::int64_t state);
};

}  // namespace kvcheck::impl
