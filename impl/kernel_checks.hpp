// Argument checks of the KvBackend kernels, shared by the CPU and CUDA
// backends so both refuse the same calls with the same CacheError and detail,
// before anything is written. Host only.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

#include "impl/kv_cache.hpp"

namespace kvcheck::impl {

/// The sizes a backend's kernels are checked against.
struct KernelBounds {
  std::int64_t slots = 0;          ///< pool slots (pool_slot_count)
  std::int64_t scratch_rows = 0;   ///< rows of the assembled-input scratch
  std::int64_t max_step_rows = 0;  ///< most queries one attend takes
  std::int64_t width_max = 0;      ///< widest index row attend takes
  std::int64_t q_elements = 0;     ///< q_heads * head_dim
  bool track_tags = false;
};

/// store(): slots inside the pool, one tag per slot when tracking.
inline Status check_store(const KernelBounds& b, std::span<const std::int64_t> slots,
                          std::span<const Tag> tags) {
  for (auto s : slots) {
    if (s < 0 || s >= b.slots)
      return Status::fail(CacheError::kSlotOutOfRange, "store: slot outside the pool");
  }
  if (b.track_tags && tags.size() != slots.size()) {
    return Status::fail(CacheError::kBadArgument, "store: tags size != slots size");
  }
  return {};
}

/// load(): scratch rows in range, slots inside the pool or -1.
inline Status check_load(const KernelBounds& b, std::span<const std::int64_t> index,
                         std::int64_t scratch_first) {
  const auto n = static_cast<std::int64_t>(index.size());
  if (scratch_first < 0 || scratch_first + n > b.scratch_rows) {
    return Status::fail(CacheError::kSlotOutOfRange, "load: scratch rows out of range");
  }
  for (auto s : index) {
    if (s < -1 || s >= b.slots)
      return Status::fail(CacheError::kSlotOutOfRange, "load: slot outside the pool");
  }
  return {};
}

/// scratch_store(): scratch rows in range, origins inside the pool or -1,
/// one tag per row when tracking.
inline Status check_scratch_store(const KernelBounds& b, std::int64_t scratch_first,
                                  std::span<const std::int64_t> origin_slots, std::span<const Tag> tags) {
  const auto rows = static_cast<std::int64_t>(origin_slots.size());
  if (scratch_first < 0 || scratch_first + rows > b.scratch_rows) {
    return Status::fail(CacheError::kSlotOutOfRange, "scratch_store: scratch rows out of range");
  }
  for (auto s : origin_slots) {
    if (s < -1 || s >= b.slots) {
      return Status::fail(CacheError::kSlotOutOfRange, "scratch_store: origin slot outside the pool");
    }
  }
  if (b.track_tags && tags.size() != origin_slots.size()) {
    return Status::fail(CacheError::kBadArgument, "scratch_store: tags size != rows");
  }
  return {};
}

/// attend(): at most max_step_rows queries, index [n, width] inside the
/// source, positions >= 0, finite query rows.
inline Status check_attend(const KernelBounds& b, KvSource source,
                           std::span<const std::int64_t> rope_positions, const double* q,
                           std::span<const std::int64_t> index, std::int64_t width) {
  const auto n = static_cast<std::int64_t>(rope_positions.size());
  if (n > b.max_step_rows) {
    return Status::fail(CacheError::kTooManyRows, "attend: more queries than max_step_rows");
  }
  if (width < 0 || width > b.width_max || index.size() != static_cast<std::size_t>(n * width)) {
    return Status::fail(CacheError::kBadArgument, "attend: index size != queries * width");
  }
  const std::int64_t limit = source == KvSource::kScratch ? b.scratch_rows : b.slots;
  for (auto s : index) {
    if (s < -1 || s >= limit)
      return Status::fail(CacheError::kSlotOutOfRange, "attend: index outside the source");
  }
  for (auto p : rope_positions) {
    if (p < 0) return Status::fail(CacheError::kNegativePosition, "attend: negative rope position");
  }
  const std::int64_t qn = n * b.q_elements;
  if (n > 0 && q == nullptr) return Status::fail(CacheError::kBadArgument, "attend: no query rows");
  for (std::int64_t i = 0; i < qn; ++i) {
    if (!std::isfinite(q[i])) return Status::fail(CacheError::kNonFinite, "attend: non-finite query element");
  }
  return {};
}

}  // namespace kvcheck::impl
