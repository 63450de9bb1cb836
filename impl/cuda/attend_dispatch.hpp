// Which attention kernel the CUDA backend launches, decided on the host by
// plain functions with no CUDA header, so the launcher (impl/cuda/
// ring_kernels.cuh), the backend's declaration of what a pool reaches
// (CudaBackend::attend_paths_run, the coverage classes of `--impl cuda`) and
// the CPU-only tests run the same decision. The device contributes numbers
// only (its SM count and how many blocks of each fast configuration an SM
// holds, AttendDevice), queried once by the backend and passed in.
//
// The kernels (ring_fast_attend.cuh has the design):
//   general          ring_attend_split_kernel + combine: every format and
//                    head_dim up to kAttendMaxHeadDim;
//   slot-major       ring_fast_slot_attend_kernel: bf16/fp8, head_dim 128,
//                    when its (query, group of 8 (KV head, head tile) pairs)
//                    blocks fill the device (batch decode, long verifies);
//   warp-pipelined   ring_fast_warp_attend_kernel: the same pools otherwise
//                    (few queries: decode of one request);
// and any of them with more than one split of the index columns, combined
// after (split-K).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "impl/kv_cache.hpp"
#include "impl/ring_index.hpp"
#include "support/formats.hpp"

namespace kvcheck::impl::cuda {

/// head_dim the fast kernels take (every other width runs the general kernel).
inline constexpr std::int32_t kFastHeadDim = 128;
/// Query heads per fast-kernel head tile (the 8 upper rows of the mma A operand hold their residuals).
inline constexpr int kFastHeads = 8;
/// Most index columns one fast-kernel split reads (its index range is held in shared memory).
inline constexpr std::int64_t kFastMaxSplitColumns = 2048;
/// Query heads of one KV head processed together by one general-kernel block.
inline constexpr int kAttendHeadTile = 4;
/// Largest head_dim the attention kernels take.
inline constexpr std::int32_t kAttendMaxHeadDim = 512;
/// Most splits of one launch, and the bytes of partial sums they may take.
inline constexpr std::int32_t kAttendMaxSplits = 64;
inline constexpr std::int64_t kAttendWorkspaceBytes = std::int64_t{256} << 20;

/// The kernel one attention launch runs.
enum class AttendKernel : std::uint8_t { kGeneral, kSlotMajor, kWarpPipelined };

/// The dispatch classes a run reports (coverage classes of `--impl cuda`):
/// X(enumerator, name, description). One list for the enum, the names and
/// the count; the three kernels first, in AttendKernel order, then split-K.
#define KVCHECK_CUDA_ATTEND_PATHS(X)                                                                    \
  X(kGeneral, "cuda_general_kernel", "the general split kernel and its combine (any format, head_dim)") \
  X(kSlotMajor, "cuda_slot_major_kernel", "the slot-major fast kernel (bf16/fp8, head_dim 128, batch)") \
  X(kWarpPipelined, "cuda_warp_pipelined_kernel",                                                       \
    "the warp-pipelined fast kernel (bf16/fp8, head_dim 128, few queries)")                             \
  X(kSplitK, "cuda_split_k", "a launch of any kernel over more than one split of the window")

enum class AttendPath : std::uint8_t {
#define KVCHECK_CUDA_ATTEND_PATH_ENUMERATOR(id, name, description) id,
  KVCHECK_CUDA_ATTEND_PATHS(KVCHECK_CUDA_ATTEND_PATH_ENUMERATOR)
#undef KVCHECK_CUDA_ATTEND_PATH_ENUMERATOR
};

/// Number of AttendPath values, counted from the list.
inline constexpr int kAttendPathCount = 0
#define KVCHECK_CUDA_ATTEND_PATH_COUNT(id, name, description) +1
    KVCHECK_CUDA_ATTEND_PATHS(KVCHECK_CUDA_ATTEND_PATH_COUNT)
#undef KVCHECK_CUDA_ATTEND_PATH_COUNT
    ;

/// "cuda_general_kernel", ... (the coverage class names).
constexpr const char* attend_path_name(AttendPath path) noexcept {
  switch (path) {
#define KVCHECK_CUDA_ATTEND_PATH_NAME(id, name, description) \
  case AttendPath::id: return name;
    KVCHECK_CUDA_ATTEND_PATHS(KVCHECK_CUDA_ATTEND_PATH_NAME)
#undef KVCHECK_CUDA_ATTEND_PATH_NAME
  }
  return "";
}

/// The shape of one attention launch, as the launcher sees it.
struct AttendLaunch {
  ElementFormat format = ElementFormat::kF32;
  std::int64_t n = 0;      ///< queries
  std::int64_t width = 0;  ///< index columns per query
  std::int32_t q_heads = 1;
  std::int32_t kv_heads = 1;
  std::int32_t head_dim = 1;
  std::int64_t row_elements = 1;  ///< kv_heads * head_dim
  std::int64_t row_bytes = 0;     ///< bytes of one key (or value) row
  std::int64_t slot_bytes = 0;    ///< row_bytes (shared row) or 2 * row_bytes
  bool rows_aligned = true;       ///< the row buffer starts 16-byte aligned (cudaMalloc: always)
  bool counters = true;           ///< a split-counter buffer is there (the fast kernels need one)
};

/// Blocks of one fast configuration an SM holds (0: it cannot run here).
struct FastOccupancy {
  int slot_major = 0;
  int warp_pipelined = 0;
};

/// What the dispatch needs of the device: SMs and, per fast format, the
/// occupancy of FastAuto's two configurations.
struct AttendDevice {
  int sm_count = 1;
  FastOccupancy bf16;
  FastOccupancy fp8;
};

/// One launch's decision.
struct AttendDispatch {
  AttendKernel kernel = AttendKernel::kGeneral;
  std::int32_t splits = 1;
  friend bool operator==(const AttendDispatch&, const AttendDispatch&) = default;
};

/// The split and tile sizes of FastAuto's configurations for format F
/// (ring_fast_attend.cuh asserts they match the geometry structs).
struct FastPolicy {
  int slot_warps = 8;
  int slot_tile_rows = 16;
  int slot_most_splits = 0;
  int warp_tile_rows = 128;
  int warp_most_splits = 0;
};
constexpr FastPolicy fast_policy(ElementFormat format) noexcept {
  const bool fp8 = format == ElementFormat::kFp8;
  const int raw_row_bytes = fp8 ? kFastHeadDim : 2 * kFastHeadDim;
  FastPolicy p;
  // Slot-major: 8 warps, fp8 3 stages of 32 rows, bf16 2 stages of 16.
  const int slot_stages = fp8 ? 3 : 2;
  p.slot_tile_rows = fp8 ? 32 : 16;
  const int slot_stage_bytes = 2 * p.slot_tile_rows * raw_row_bytes + (fp8 ? 2 * p.slot_tile_rows * 4 : 0);
  p.slot_most_splits = slot_stages * slot_stage_bytes / (4 * kFastHeads) - 1;
  // Warp-pipelined: 8 warps of 16-row tiles, 2 stages each.
  const int warp_stage_bytes = 2 * 16 * raw_row_bytes + (fp8 ? 2 * 16 * 4 : 0);
  p.warp_tile_rows = 16 * 8;
  p.warp_most_splits = 8 * 2 * warp_stage_bytes / (4 * kFastHeads) - 1;
  return p;
}

/// Query heads per block tile of the general kernel.
inline std::int32_t ring_attend_head_tiles(std::int32_t q_heads, std::int32_t kv_heads) {
  const std::int32_t group = q_heads / kv_heads;
  return (group + kAttendHeadTile - 1) / kAttendHeadTile;
}

/// Head tiles of the fast kernels (8 query heads each).
inline std::int32_t ring_fast_head_tiles(std::int32_t q_heads, std::int32_t kv_heads) {
  const std::int32_t group = q_heads / kv_heads;
  return (group + kFastHeads - 1) / kFastHeads;
}

/// Splits of the general kernel: enough blocks for about two full waves on
/// `sm_count` multiprocessors, at least 64 columns per split, at most
/// `max_splits`.
inline std::int32_t ring_attend_splits(std::int64_t n, std::int32_t kv_heads, std::int32_t head_tiles,
                                       std::int64_t width, int sm_count, std::int32_t max_splits) {
  const std::int64_t base = n * kv_heads * head_tiles;
  const std::int64_t target = static_cast<std::int64_t>(sm_count > 0 ? sm_count : 1) * 16;
  std::int64_t splits = (target + base - 1) / (base > 0 ? base : 1);
  const std::int64_t by_width = (width + 63) / 64;
  if (splits > by_width) splits = by_width;
  if (splits > max_splits) splits = max_splits;
  return static_cast<std::int32_t>(splits < 1 ? 1 : splits);
}

/// Splits for a fast kernel: the fewest splits whose waves of `resident`
/// blocks (blocks per SM x SMs) cost least, each split at most
/// kFastMaxSplitColumns columns, whole tiles of `tile_rows`, at most
/// max_splits (0: none fits). The cost of a choice is waves x (tiles per
/// split + 2), the 2 standing for a block's pipeline fill and merge.
inline std::int32_t ring_fast_splits(std::int64_t base_blocks, std::int64_t width, std::int64_t resident,
                                     std::int32_t max_splits, std::int64_t tile_rows) {
  if (width <= 0 || base_blocks <= 0) return 1;
  if (resident < 1) resident = 1;
  const std::int64_t min_splits = (width + kFastMaxSplitColumns - 1) / kFastMaxSplitColumns;
  const std::int64_t most = (width + tile_rows - 1) / tile_rows;
  std::int64_t best = -1, best_cost = 0;
  for (std::int64_t s = min_splits; s <= most && s <= max_splits; ++s) {
    const std::int64_t per = (width + s - 1) / s;
    const std::int64_t tiles = (per + tile_rows - 1) / tile_rows;
    const std::int64_t real = (width + tiles * tile_rows - 1) / (tiles * tile_rows);
    const std::int64_t waves = (base_blocks * real + resident - 1) / resident;
    const std::int64_t cost = waves * (tiles + 2);
    if (best < 0 || cost < best_cost) {
      best = real;
      best_cost = cost;
    }
  }
  return static_cast<std::int32_t>(best < 0 ? 0 : best);
}

/// Whether a fast kernel can take the launch at all: bf16 or fp8 rows,
/// head_dim 128, 16-byte aligned rows and slots (cp.async), a counter buffer.
inline bool ring_fast_attend_fits(const AttendLaunch& l) {
  return (l.format == ElementFormat::kBf16 || l.format == ElementFormat::kFp8) && l.counters &&
         l.head_dim == kFastHeadDim && l.row_bytes % 16 == 0 && l.slot_bytes % 16 == 0 &&
         l.row_elements % 16 == 0 && l.rows_aligned && l.kv_heads > 0 && l.q_heads % l.kv_heads == 0;
}

/// Blocks of the slot-major kernel's grid x dimension (query, group of
/// slot_warps (KV head, head tile) pairs), and of the warp-pipelined one's
/// (query, KV head, head tile).
inline std::int64_t ring_fast_slot_blocks(const AttendLaunch& l) {
  const std::int64_t pairs =
      static_cast<std::int64_t>(l.kv_heads) * ring_fast_head_tiles(l.q_heads, l.kv_heads);
  const int warps = fast_policy(l.format).slot_warps;
  return l.n * ((pairs + warps - 1) / warps);
}
inline std::int64_t ring_fast_warp_blocks(const AttendLaunch& l) {
  return l.n * static_cast<std::int64_t>(l.kv_heads) * ring_fast_head_tiles(l.q_heads, l.kv_heads);
}

/// The kernel and splits of one launch (max_splits: what the workspace
/// holds, attend_max_splits). The production policy (FastAuto, measured on
/// an H200): where a fast kernel fits and both its configurations run here,
/// slot-major when its blocks fill the device with at most 16 splits, else
/// warp-pipelined; a fast kernel that finds no split count within
/// max_splits, or a pool it does not fit, runs the general kernel.
inline AttendDispatch ring_attend_dispatch(const AttendLaunch& l, const AttendDevice& device,
                                           std::int32_t max_splits) {
  if (ring_fast_attend_fits(l)) {
    const FastOccupancy occ = l.format == ElementFormat::kFp8 ? device.fp8 : device.bf16;
    if (std::min(occ.slot_major, occ.warp_pipelined) > 0) {
      const FastPolicy p = fast_policy(l.format);
      const bool slot = ring_fast_slot_blocks(l) * 16 >= device.sm_count;
      const int per_sm = slot ? occ.slot_major : occ.warp_pipelined;
      const std::int32_t most = std::min(max_splits, slot ? p.slot_most_splits : p.warp_most_splits);
      const std::int32_t splits =
          ring_fast_splits(slot ? ring_fast_slot_blocks(l) : ring_fast_warp_blocks(l), l.width,
                           static_cast<std::int64_t>(per_sm) * std::max(device.sm_count, 1), most,
                           slot ? p.slot_tile_rows : p.warp_tile_rows);
      if (splits > 0) return {slot ? AttendKernel::kSlotMajor : AttendKernel::kWarpPipelined, splits};
    }
  }
  return {AttendKernel::kGeneral,
          ring_attend_splits(l.n, l.kv_heads, ring_attend_head_tiles(l.q_heads, l.kv_heads), l.width,
                             device.sm_count, max_splits)};
}

/// The splits a pool's workspace holds for a full step (max_step_rows
/// queries of q_heads heads): at least 1, at most kAttendMaxSplits.
inline std::int32_t attend_max_splits(ElementFormat format, std::int64_t max_step_rows, std::int32_t q_heads,
                                      std::int32_t head_dim) {
  const std::int64_t acc_bytes = format == ElementFormat::kF64 ? 8 : 4;
  std::int64_t per_split = 0;
  // A pool too large to size is refused by configure(); one split here.
  if (__builtin_mul_overflow(max_step_rows, std::int64_t{q_heads} * head_dim * (head_dim + 2), &per_split) ||
      __builtin_mul_overflow(per_split, acc_bytes, &per_split)) {
    return 1;
  }
  const std::int64_t splits = kAttendWorkspaceBytes / std::max<std::int64_t>(1, per_split);
  return static_cast<std::int32_t>(std::clamp<std::int64_t>(splits, 1, kAttendMaxSplits));
}

/// The splits one launch of `n` queries may use in a pool whose workspace
/// holds `pool_splits` splits of a full step of `max_step_rows` queries
/// (attend_max_splits): the partial sums are packed by the launch's own
/// queries and splits ([n, q_heads, splits, head_dim] and [n, q_heads,
/// splits, 2]), so n x splits <= pool_splits x max_step_rows fits, and a
/// decode in a pool sized for long chunks has room for many splits. At most
/// kAttendMaxSplits; at least 1 (n <= max_step_rows: attend refuses more).
inline std::int32_t attend_launch_max_splits(std::int32_t pool_splits, std::int64_t max_step_rows,
                                             std::int64_t n) {
  if (n <= 0) return pool_splits;
  const std::int64_t room = std::int64_t{pool_splits} * max_step_rows / n;
  return static_cast<std::int32_t>(std::clamp<std::int64_t>(room, 1, kAttendMaxSplits));
}

/// The classes one launch reaches, in KVCHECK_CUDA_ATTEND_PATHS order.
inline std::array<bool, kAttendPathCount> attend_paths_of(const AttendDispatch& d) {
  std::array<bool, kAttendPathCount> paths{};
  paths[static_cast<std::size_t>(d.kernel)] = true;
  paths[static_cast<std::size_t>(AttendPath::kSplitK)] = d.splits > 1;
  return paths;
}

/// The launch shape of `n` queries of a pool of `spec` (index rows as wide
/// as RingPool reads: the window, or the faulty window of a named fault).
inline AttendLaunch pool_attend_launch(const PoolSpec& spec, std::int64_t n) {
  AttendLaunch l;
  l.format = spec.format;
  l.n = n;
  l.width = ring_window_keys(spec.window_keys, spec.fault);
  l.q_heads = spec.q_heads;
  l.kv_heads = spec.kv_heads;
  l.head_dim = spec.head_dim;
  l.row_elements = std::int64_t{spec.kv_heads} * spec.head_dim;
  l.row_bytes = format_row_bytes(spec.format, l.row_elements);
  l.slot_bytes = spec.shared_row ? l.row_bytes : 2 * l.row_bytes;
  return l;
}

/// Which classes (KVCHECK_CUDA_ATTEND_PATHS order) a pool of `spec` on
/// `device` reaches when its steps attend `step_queries` queries each (one
/// entry per step that reads; 0 entries attend nothing): the dispatch of
/// every such launch, as CudaBackend::attend makes it.
inline std::vector<bool> pool_attend_paths(const PoolSpec& spec, std::span<const std::int64_t> step_queries,
                                           const AttendDevice& device) {
  std::vector<bool> reached(kAttendPathCount, false);
  const std::int32_t pool_splits =
      attend_max_splits(spec.format, spec.max_step_rows, spec.q_heads, spec.head_dim);
  for (const std::int64_t n : step_queries) {
    if (n <= 0) continue;
    const std::int32_t max_splits = attend_launch_max_splits(pool_splits, spec.max_step_rows, n);
    const auto paths = attend_paths_of(ring_attend_dispatch(pool_attend_launch(spec, n), device, max_splits));
    for (std::size_t i = 0; i < paths.size(); ++i) reached[i] = reached[i] || paths[i];
  }
  return reached;
}

}  // namespace kvcheck::impl::cuda
