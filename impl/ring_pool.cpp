// RingPool: the step semantics composed from a KvBackend's data kernels and a
// slot map (addresses come only from impl/slot_map.hpp).
// Every step validates everything it can before the first kernel that writes
// the pool (store), so a refused step leaves pool bytes, tags and logical
// state exactly as they were; the kernels themselves validate again.
#include "impl/ring_pool.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <string>

#include "impl/element_format.hpp"
#include "impl/ring_index.hpp"
#include "support/assert.hpp"

namespace kvcheck::impl {

namespace {

bool all_finite(const double* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return false;
  }
  return true;
}

/// The ring's addressing: a fixed slot map, every position always addressable.
class RingAddressing final : public PoolAddressing {
 public:
  explicit RingAddressing(const SlotMap& map) : map_(map) {}
  const SlotMap& slot_map() const noexcept override { return map_; }
  Status reserve(std::int64_t, std::int64_t, std::int64_t) override { return {}; }
  void release(std::int64_t) override {}

 private:
  SlotMap map_;
};

}  // namespace

Status RingPool::create(std::unique_ptr<KvBackend> backend, const PoolSpec& spec_in,
                        std::unique_ptr<RingPool>* out) {
  if (!backend) return Status::fail(CacheError::kUnsupported, "no backend");
  if (out == nullptr) return Status::fail(CacheError::kUnsupported, "no output pointer");
  if (auto st = validate_pool_spec(spec_in); !st.ok()) return st;
  // The ring-sized-window fault shrinks the ring before it is addressed.
  const std::int64_t ring_rows =
      spec_in.fault == Fault::kRingSizedWindow ? spec_in.window_keys : spec_in.ring_rows;
  std::unique_ptr<PoolAddressing> ring;
  try {
    ring = std::make_unique<RingAddressing>(ring_slot_map(spec_in.states, ring_rows, spec_in.fault));
  } catch (const std::bad_alloc&) {
    return Status::fail(CacheError::kAllocation, "step buffers could not be allocated");
  }
  return create(std::move(backend), spec_in, std::move(ring), out);
}

Status RingPool::create(std::unique_ptr<KvBackend> backend, const PoolSpec& spec_in,
                        std::unique_ptr<PoolAddressing> addressing, std::unique_ptr<RingPool>* out) {
  if (!backend) return Status::fail(CacheError::kUnsupported, "no backend");
  if (out == nullptr) return Status::fail(CacheError::kUnsupported, "no output pointer");
  if (!addressing) return Status::fail(CacheError::kUnsupported, "no addressing");
  if (auto st = validate_pool_spec(spec_in); !st.ok()) return st;
  PoolSpec spec = spec_in;
  if (spec.fault == Fault::kRingSizedWindow) spec.ring_rows = spec.window_keys;
  const SlotMap& map = addressing->slot_map();
  if (map.states != spec.states || map.pool_slots != pool_slot_count(spec)) {
    return Status::fail(CacheError::kBadSpec,
                        "the slot map's states or pool slots differ from the pool spec's");
  }
  const std::int64_t keys = ring_window_keys(spec.window_keys, spec.fault);
  const std::int64_t q_elements = static_cast<std::int64_t>(spec.q_heads) * spec.head_dim;
  std::string why;
  if (!backend->supports(spec, &why)) return Status::fail(CacheError::kUnsupported, why);
  if (auto st = backend->configure(spec); !st.ok()) return st;

  std::unique_ptr<RingPool> pool(new RingPool());
  try {
    pool->spec_ = spec;
    pool->backend_ = std::move(backend);
    pool->addressing_ = std::move(addressing);
    const auto states = static_cast<std::size_t>(spec.states);
    const auto rows = static_cast<std::size_t>(spec.max_step_rows);
    const auto readers =
        static_cast<std::size_t>(spec.max_step_readers > 0 ? spec.max_step_readers : spec.max_step_rows);
    const auto width = static_cast<std::size_t>(keys);
    pool->states_.assign(states, StateInfo{});
    pool->high_water_.assign(states, 0);
    pool->occupant_high_.assign(states, 0);
    pool->reused_.assign(states, false);
    pool->index_.resize(readers * width);
    pool->slots_.resize(rows);
    pool->rope_positions_.resize(rows);
    pool->tags_.resize(rows);
    pool->out_.resize(readers * static_cast<std::size_t>(q_elements));
    pool->reader_q_.resize(readers * static_cast<std::size_t>(q_elements));
    if (spec.track_tags) {
      pool->read_slots_.resize(readers * width);
      pool->read_tags_.resize(readers * width);
      pool->writes_.reserve(rows);
    }
  } catch (const std::bad_alloc&) {
    return Status::fail(CacheError::kAllocation, "step buffers could not be allocated");
  }
  *out = std::move(pool);
  return {};
}

const StateInfo& RingPool::state(std::int64_t state) const {
  KVCHECK_ASSERT(state >= 0 && state < spec_.states);
  return states_[static_cast<std::size_t>(state)];
}

Status RingPool::begin(std::int64_t state, std::int64_t request) {
  if (state < 0 || state >= spec_.states)
    return Status::fail(CacheError::kStateOutOfRange, "begin: state out of range");
  if (request < 0) return Status::fail(CacheError::kNegativePosition, "begin: request id must be >= 0");
  auto& s = states_[static_cast<std::size_t>(state)];
  if (s.busy) return Status::fail(CacheError::kStateBusy, "begin: state is in use");
  const auto b = static_cast<std::size_t>(state);
  if (reused_[b] || occupant_high_[b] > 0) {
    high_water_[b] = std::max(high_water_[b], occupant_high_[b]);
    reused_[b] = true;
  }
  occupant_high_[b] = 0;
  s = StateInfo{true, request, 0, -1};
  return {};
}

std::int64_t RingPool::read_width() const noexcept {
  return ring_window_keys(spec_.window_keys, spec_.fault);
}

void RingPool::note_length(std::int64_t state) {
  const auto b = static_cast<std::size_t>(state);
  occupant_high_[b] = std::max(occupant_high_[b], states_[b].length);
}

Status RingPool::check_step(std::int64_t state, std::int64_t rows, const StepRows& in,
                            const StepReads& reads) const {
  if (state < 0 || state >= spec_.states)
    return Status::fail(CacheError::kStateOutOfRange, "step: state out of range");
  const auto& s = states_[static_cast<std::size_t>(state)];
  if (!s.busy) return Status::fail(CacheError::kStateFree, "step: state has no request");
  if (s.pending_drafts >= 0) return Status::fail(CacheError::kBadAccept, "step: a verify awaits accept");
  if (rows <= 0 || rows > spec_.max_step_rows) {
    return Status::fail(CacheError::kTooManyRows, "step: rows must be in [1, max_step_rows]");
  }
  if (in.k == nullptr || in.q == nullptr || (!spec_.shared_row && in.v == nullptr)) {
    return Status::fail(CacheError::kBadArgument, "step: missing k, v or q rows");
  }
  const std::int64_t kv = rows * spec_.kv_heads * spec_.head_dim;
  const std::int64_t qn = rows * spec_.q_heads * spec_.head_dim;
  if (!all_finite(in.k, kv) || (!spec_.shared_row && !all_finite(in.v, kv)) || !all_finite(in.q, qn)) {
    return Status::fail(CacheError::kNonFinite, "step: non-finite key, value or query element");
  }
  if (reads.queries) {
    std::int64_t previous = -1;
    for (const std::int64_t i : *reads.queries) {
      if (i <= previous || i >= rows) {
        return Status::fail(CacheError::kBadArgument,
                            "step: readers must be ascending indices into the rows");
      }
      previous = i;
    }
  }
  const std::int64_t reading = reads.queries ? static_cast<std::int64_t>(reads.queries->size()) : rows;
  if (reading > max_readers()) {
    return Status::fail(CacheError::kTooManyRows, "step: more readers than max_step_readers");
  }
  return {};
}

std::int64_t RingPool::reader_count(std::int64_t rows) const noexcept {
  return reads_.queries ? static_cast<std::int64_t>(reads_.queries->size()) : rows;
}

std::int64_t RingPool::reader_index(std::int64_t i) const noexcept {
  return reads_.queries ? (*reads_.queries)[static_cast<std::size_t>(i)] : i;
}

std::int64_t RingPool::max_readers() const noexcept {
  return spec_.max_step_readers > 0 ? spec_.max_step_readers : spec_.max_step_rows;
}

const double* RingPool::reader_rows(const StepRows& in) {
  if (!reads_.queries) return in.q;
  const auto q_elements = static_cast<std::size_t>(spec_.q_heads) * static_cast<std::size_t>(spec_.head_dim);
  for (std::size_t r = 0; r < reads_.queries->size(); ++r) {
    const double* from = in.q + static_cast<std::size_t>((*reads_.queries)[r]) * q_elements;
    std::copy(from, from + q_elements, reader_q_.data() + r * q_elements);
  }
  return reader_q_.data();
}

Status RingPool::prepare_step(std::int64_t state, std::int64_t rows, const StepRows& in,
                              const StepReads& reads) {
  if (auto st = check_step(state, rows, in, reads); !st.ok()) return st;
  reads_ = reads;
  return addressing_->reserve(state, states_[static_cast<std::size_t>(state)].length, rows);
}

// Computes write slots (from the slot map), rope positions and tags of `rows`
// rows at first_position.. and stores them; fills writes_ with the replaced tags.
Status RingPool::run_store(std::int64_t state, std::int64_t first_position, std::int64_t rows,
                           const StepRows& in, StoreReport* report) {
  const auto n = static_cast<std::size_t>(rows);
  const std::int64_t request = states_[static_cast<std::size_t>(state)].request;
  const SlotMap& map = addressing_->slot_map();
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t p = first_position + static_cast<std::int64_t>(i);
    slots_[i] = slot_map_slot(map, state, p);
    if (slots_[i] < 0) {
      return Status::fail(CacheError::kSlotOutOfRange,
                          "step: the slot map holds no slot for a written position");
    }
    rope_positions_[i] = ring_rope_position(p, spec_.ring_rows, spec_.fault);
    if (spec_.track_tags) tags_[i] = Tag{request, p, write_seq_ + 1 + i};
  }
  writes_.clear();
  if (spec_.track_tags) {
    for (std::size_t i = 0; i < n; ++i)
      writes_.push_back(WriteRecord{slots_[i], tags_[i], backend_->slot_tag(slots_[i])});
  }
  std::span<const Tag> tags(tags_.data(), spec_.track_tags ? n : 0);
  if (auto st = backend_->store(std::span<const std::int64_t>(slots_.data(), n),
                                std::span<const std::int64_t>(rope_positions_.data(), n), in.k,
                                spec_.shared_row ? nullptr : in.v, tags, report);
      !st.ok()) {
    writes_.clear();
    return st;
  }
  // Tags of one store call are consecutive; the pool counter moves past them.
  write_seq_ += n;
  return {};
}

// Every query of the step that reads (all, or the step's readers) reads the
// pool through the slot map's index rows: query p reads the min(p + 1,
// width) positions ending at p.
Status RingPool::run_pool_reads(std::int64_t state, std::int64_t first_position, std::int64_t rows,
                                const StepRows& in) {
  const auto n = static_cast<std::size_t>(reader_count(rows));
  if (n == 0) return {};
  const std::int64_t width = read_width();
  const SlotMap& map = addressing_->slot_map();
  const auto b = static_cast<std::size_t>(state);
  // The freed-state fault: the new occupant's index columns run over the
  // old occupant's (stale) rows up to its high-water length.
  const bool stale_reads = spec_.fault == Fault::kFreedStateReadable && reused_[b];
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t p = first_position + reader_index(static_cast<std::int64_t>(i));
    const std::int64_t len = std::min(p + 1, width);
    const std::int64_t length = stale_reads ? std::min(std::max(p + 1, high_water_[b]), width) : len;
    slot_map_index_row(map, state, p - len + 1, length, width,
                       index_.data() + i * static_cast<std::size_t>(width));
    rope_positions_[i] = ring_rope_position(p, spec_.ring_rows, spec_.fault);
  }
  if (!reads_.outputs) {
    // Without outputs: each index row's slots and the tags they hold, the
    // same report attend gives for a pool read (kept apart on purpose: a
    // caller that judges tags alone does not pay for attention).
    if (!spec_.track_tags) return {};
    const auto cells = n * static_cast<std::size_t>(width);
    for (std::size_t c = 0; c < cells; ++c) {
      const std::int64_t slot = index_[c];
      read_slots_[c] = slot < 0 ? -1 : slot;
      read_tags_[c] = slot < 0 ? Tag{} : backend_->slot_tag(slot);
    }
    return {};
  }
  std::span<const std::int64_t> index(index_.data(), n * static_cast<std::size_t>(width));
  return backend_->attend(KvSource::kPool, std::span<const std::int64_t>(rope_positions_.data(), n),
                          reader_rows(in), index, width, out_.data(),
                          spec_.track_tags ? read_tags_.data() : nullptr,
                          spec_.track_tags ? read_slots_.data() : nullptr);
}

void RingPool::fill_result(std::int64_t rows, std::int64_t readers, std::int64_t first_position,
                           KvSource source, std::int64_t duplicates, StepResult* result) const {
  if (result == nullptr) return;
  const auto n = static_cast<std::size_t>(readers);
  const std::int64_t width = read_width();
  const auto cells = n * static_cast<std::size_t>(width);
  result->queries = rows;
  result->width = width;
  result->source = source;
  result->first_position = first_position;
  result->readers = readers;
  result->out =
      std::span<const double>(out_.data(), reads_.outputs ? n * static_cast<std::size_t>(spec_.q_heads) *
                                                                static_cast<std::size_t>(spec_.head_dim)
                                                          : 0);
  if (spec_.track_tags) {
    result->read_slots = std::span<const std::int64_t>(read_slots_.data(), cells);
    result->read_tags = std::span<const Tag>(read_tags_.data(), cells);
  } else {
    result->read_slots = {};
    result->read_tags = {};
  }
  result->writes = std::span<const WriteRecord>(writes_.data(), writes_.size());
  result->duplicate_slots = duplicates;
}

Status RingPool::after_failed_read(std::int64_t state, std::int64_t first_position, Status failure) {
  // Inputs were validated before the store, so only the device can fail
  // here (kDeviceFailure). The logical length goes back; the stored rows may
  // be in the pool, so the state must be reset before it is used again.
  auto& s = states_[static_cast<std::size_t>(state)];
  s.length = first_position;
  failure.detail += " (after the step's rows were stored: reset the state)";
  return failure;
}

Status RingPool::prefill(std::int64_t state, std::int64_t rows, const StepRows& in, PrefillOrder order,
                         StepResult* result, const StepReads& reads) {
  if (auto st = prepare_step(state, rows, in, reads); !st.ok()) return st;
  if (spec_.fault == Fault::kStoreThenLoadPrefill) order = PrefillOrder::kStoreThenLoad;
  auto& s = states_[static_cast<std::size_t>(state)];
  const std::int64_t first = s.length;
  StoreReport report;
  if (order == PrefillOrder::kStoreThenLoad) {
    if (auto st = run_store(state, first, rows, in, &report); !st.ok()) return st;
    s.length = first + rows;
    note_length(state);
    if (auto st = run_pool_reads(state, first, rows, in); !st.ok())
      return after_failed_read(state, first, st);
    fill_result(rows, reader_count(rows), first, KvSource::kPool, report.duplicate_slots, result);
    return {};
  }
  // load_then_store: the old window (first query's index row minus its own
  // column) goes to scratch rows [0, m) before the chunk is stored.
  const std::int64_t width = read_width();
  const std::int64_t len0 = std::min(first + 1, width);
  const std::int64_t m = len0 - 1;  // old rows: positions first - m .. first - 1
  slot_map_index_row(addressing_->slot_map(), state, first - m, len0, width, index_.data());
  if (auto st = backend_->load(std::span<const std::int64_t>(index_.data(), static_cast<std::size_t>(m)), 0);
      !st.ok()) {
    return st;
  }
  if (auto st = run_store(state, first, rows, in, &report); !st.ok()) return st;
  s.length = first + rows;
  note_length(state);
  const auto n = static_cast<std::size_t>(rows);
  std::span<const Tag> tags(tags_.data(), spec_.track_tags ? n : 0);
  Status st = backend_->scratch_store(m, std::span<const std::int64_t>(slots_.data(), n),
                                      std::span<const std::int64_t>(rope_positions_.data(), n), in.k,
                                      spec_.shared_row ? nullptr : in.v, tags);
  if (!st.ok()) return after_failed_read(state, first, st);
  // Query i at position first + i sees scratch rows of positions
  // max(first + i - keys + 1, first - m) .. first + i; scratch row of
  // position p is p - (first - m). Only the step's readers attend.
  const std::int64_t reading = reader_count(rows);
  const auto nr = static_cast<std::size_t>(reading);
  for (std::size_t i = 0; i < nr; ++i) {
    const std::int64_t p = first + reader_index(static_cast<std::int64_t>(i));
    const std::int64_t len = std::min(p + 1, width);
    const std::int64_t lo = p - len + 1;
    std::int64_t* row = index_.data() + i * static_cast<std::size_t>(width);
    for (std::int64_t c = 0; c < width; ++c) row[c] = c < len ? lo + c - (first - m) : -1;
    rope_positions_[i] = ring_rope_position(p, spec_.ring_rows, spec_.fault);
  }
  if (nr > 0) {
    st = backend_->attend(KvSource::kScratch, std::span<const std::int64_t>(rope_positions_.data(), nr),
                          reader_rows(in),
                          std::span<const std::int64_t>(index_.data(), nr * static_cast<std::size_t>(width)),
                          width, out_.data(), spec_.track_tags ? read_tags_.data() : nullptr,
                          spec_.track_tags ? read_slots_.data() : nullptr);
    if (!st.ok()) return after_failed_read(state, first, st);
  }
  fill_result(rows, reading, first, KvSource::kScratch, report.duplicate_slots, result);
  return {};
}

Status RingPool::decode(std::int64_t state, const StepRows& in, StepResult* result, const StepReads& reads) {
  if (auto st = prepare_step(state, 1, in, reads); !st.ok()) return st;
  auto& s = states_[static_cast<std::size_t>(state)];
  const std::int64_t first = s.length;
  StoreReport report;
  if (auto st = run_store(state, first, 1, in, &report); !st.ok()) return st;
  s.length = first + 1;
  note_length(state);
  if (auto st = run_pool_reads(state, first, 1, in); !st.ok()) return after_failed_read(state, first, st);
  fill_result(1, reader_count(1), first, KvSource::kPool, report.duplicate_slots, result);
  return {};
}

Status RingPool::verify(std::int64_t state, std::int64_t drafts, const StepRows& in, StepResult* result,
                        const StepReads& reads) {
  if (drafts < 0) return Status::fail(CacheError::kBadAccept, "verify: negative draft count");
  if (drafts >= spec_.max_step_rows) {
    return Status::fail(CacheError::kTooManyRows, "verify: k + 1 rows exceed max_step_rows");
  }
  const std::int64_t rows = drafts + 1;
  if (auto st = prepare_step(state, rows, in, reads); !st.ok()) return st;
  auto& s = states_[static_cast<std::size_t>(state)];
  const std::int64_t first = s.length;
  StoreReport report;
  if (auto st = run_store(state, first, rows, in, &report); !st.ok()) return st;
  s.length = first + rows;
  note_length(state);
  if (auto st = run_pool_reads(state, first, rows, in); !st.ok()) return after_failed_read(state, first, st);
  s.pending_drafts = drafts;
  fill_result(rows, reader_count(rows), first, KvSource::kPool, report.duplicate_slots, result);
  return {};
}

Status RingPool::accept(std::int64_t state, std::int64_t accepted) {
  if (state < 0 || state >= spec_.states)
    return Status::fail(CacheError::kStateOutOfRange, "accept: state out of range");
  auto& s = states_[static_cast<std::size_t>(state)];
  if (!s.busy) return Status::fail(CacheError::kStateFree, "accept: state has no request");
  if (s.pending_drafts < 0) return Status::fail(CacheError::kBadAccept, "accept: no verify pending");
  if (accepted < 0 || accepted > s.pending_drafts) {
    return Status::fail(CacheError::kBadAccept, "accept: a must be in [0, k]");
  }
  // The pool keeps its own copy of the step semantics on purpose: kvcheck's
  // one place (scenarios/step_semantics.hpp) must not share a mistake with it.
  // verify at length p stored p..p+k and left length p+k+1.
  const std::int64_t p = s.length - s.pending_drafts - 1;
  if (spec_.fault != Fault::kAcceptNoRollback) s.length = p + 1 + accepted;
  s.pending_drafts = -1;
  return {};
}

Status RingPool::finish(std::int64_t state) {
  if (state < 0 || state >= spec_.states)
    return Status::fail(CacheError::kStateOutOfRange, "finish: state out of range");
  auto& s = states_[static_cast<std::size_t>(state)];
  if (!s.busy) return Status::fail(CacheError::kStateFree, "finish: state has no request");
  note_length(state);
  s.busy = false;
  s.pending_drafts = -1;
  addressing_->release(state);
  return {};
}

Status RingPool::reset(std::int64_t state) {
  if (state < 0 || state >= spec_.states)
    return Status::fail(CacheError::kStateOutOfRange, "reset: state out of range");
  auto& s = states_[static_cast<std::size_t>(state)];
  if (!s.busy) return Status::fail(CacheError::kStateFree, "reset: state has no request");
  s.length = 0;
  s.pending_drafts = -1;
  return {};
}

Status RingPool::trim(std::int64_t state, std::int64_t positions) {
  if (state < 0 || state >= spec_.states)
    return Status::fail(CacheError::kStateOutOfRange, "trim: state out of range");
  auto& s = states_[static_cast<std::size_t>(state)];
  if (!s.busy) return Status::fail(CacheError::kStateFree, "trim: state has no request");
  // A pending verify(k) at p left length p + k + 1; its rows go first, so
  // n counts committed positions (this pool's own copy of the rule).
  const std::int64_t committed = s.pending_drafts >= 0 ? s.length - s.pending_drafts - 1 : s.length;
  if (positions < 1 || positions > committed) {
    return Status::fail(CacheError::kBadArgument, "trim: n must be in [1, committed length]");
  }
  // The trimmed rows stay in their slots, stale: the next writes replace them.
  s.length = committed - positions;
  s.pending_drafts = -1;
  return {};
}

}  // namespace kvcheck::impl
