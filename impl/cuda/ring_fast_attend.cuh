// The production decode/verify attention kernel of the CUDA ring pool for
// bf16 and fp8 rows with head_dim 128: a gather over index rows at the memory
// roofline. impl/cuda/ring_kernels.cuh dispatches here when the pool fits
// (ring_fast_attend_fits) and keeps its general kernel for every other shape.
//
// Three kernels share the parts below; FastAuto (the backend's choice,
// measured on an H200, README "GPU") picks per launch:
// * ring_fast_slot_attend_kernel (batch decode: the blocks fill the device):
//   one block = (query, up to 8 (KV head, head tile) pairs) x one split, one
//   warp per pair, each warp streaming its pair's head rows of every column
//   of the split through its own ring of stages. The block's warps read the
//   heads of the same slots at about the same time, so HBM sees whole K and
//   V rows (1-4 KiB contiguous); with one block per KV head the same bytes
//   arrived as scattered 128/256-byte pieces from blocks that had drifted
//   apart, and the kernel topped out at ~1.1 G slots/s in both formats.
//   fp8 takes 32 rows per step (two 16-row halves, one softmax step) for
//   more independent work per warp: it is bound by issue latency, not bytes.
// * ring_fast_warp_attend_kernel (split-K: few queries, many splits): one
//   block = (query, KV head, head tile) x split, warp w streams tiles w,
//   w + warps, ... through its own ring (no block barrier in the loop).
// * ring_fast_attend_kernel (the first design, kept for the benchmark's
//   comparison): block-wide 64-row tiles, fp8 widened in shared memory.
//
// Design (why each part is there):
// * The query heads of a block (or warp) share every key/value row, so each
//   row crosses HBM once per (query, KV head).
// * Rows move HBM -> shared memory with cp.async (16-byte, L1-bypassing),
//   several stages in flight: data in flight occupies no registers. The
//   column's slot comes from the block's copy of its index range in shared
//   memory (int32); a skipped column (-1, or a slot past the pool) is a
//   zero-filled row that is masked. (Bulk copies through the Tensor Memory
//   Accelerator, one per 256-byte row, measured half as fast on an H200:
//   the TMA's rate of small copies, not bandwidth, bound them.)
// * Scores and the weighted sum run on tensor cores (mma.sync m16n8k16, f32
//   accumulate) fed by ldmatrix from XOR-swizzled rows, conflict-free for
//   both the plain and the transposed load. The 16 rows of the A operand
//   hold, for each query head g < 8, its 16-bit high part in row g and its
//   residual (x - hi(x)) in row g + 8, for the query in QK^T and for the
//   probabilities in PV. Row g and row g + 8 of the result land in the same
//   thread, so hi + lo is one add and no shuffle: the query and the
//   probabilities keep 16 (bf16) or 22 (f16) significant bits while every
//   multiply-add runs on tensor cores. Stored rows are exact operands.
// * fp8 (slot-major and warp kernels): the raw e4m3 codes are read with
//   ldmatrix as b16 pairs and converted in registers (hardware e4m3x2 ->
//   f16x2, exact). Q.K: the 4 codes a thread gets (dims 4t..4t+3 of a
//   k-step) are the B fragment's k = 2t, 2t+1 | 2t+8, 2t+9, and the query's
//   A fragment is built with the same permutation. P.V: the transposed
//   ldmatrix gives keys 2t, 2t+1 of dims 2g, 2g+1 in 4 bytes; two byte
//   permutes pair them per dim, so n-tile (chunk c, parity p) holds dims
//   16c + 2n + p. The ue8m0 scales (one per 32 dims) never touch the codes:
//   a key's scale multiplies its 32-dim partial score by 2^(e - R) (R the
//   step's largest key scale, returned in the score factor), a value's scale
//   multiplies the probability in that 32-dim block's A operand by
//   2^(e - V) (V the warp's running largest value scale; o is kept in units
//   of 2^(V - 127) and rescaled when V grows, like the softmax maximum).
//   2^(e - 127) is the scale byte shifted into an f32 exponent field. The
//   query is carried as f16 hi + lo after scaling it by a power of two to
//   put its largest element in [256, 512).
// * The online softmax runs per step of 16 (or 32) rows per warp: one max,
//   one rescale per step (skipped when no maximum moved).
// * Splits are combined in the same launch: the last block (slot-major: the
//   last warp of a pair) to finish a (query, head tile) (a counter,
//   threadfence pattern) merges every split's partial state with the sink
//   and writes the output, then resets the counter to 0 for the next
//   launch. The combine computes each split's weight once per head, then
//   sums the splits with independent loads.
// * Measured and not chosen (kept for the benchmark's comparison): the
//   slot-major kernel with many splits in thread block clusters of 8
//   (FastSlotGeometry's Cluster): the cluster's blocks merge their states
//   through distributed shared memory, so the combine reads one partial per
//   cluster. On the split-K shape it fixed the slot-major kernel's combine
//   (0.36 -> 0.59 of peak in bf16) but stayed below the warp-pipelined
//   kernel (0.67; fp8 0.33 against 0.34).
//
// Files: ring_fast_common.cuh (shared parts), ring_fast_block.cuh,
// ring_fast_warp.cuh and ring_fast_slot.cuh (one kernel each, included in that
// order), and this file: the policy that picks a kernel and the launch.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "impl/cuda/ring_fast_slot.cuh"

namespace kvcheck::impl::cuda {

/// The configuration the backend runs (measured on an H200, see README):
/// the slot-major kernel where its blocks fill the device (batch decode),
/// else the warp-pipelined kernel with 8 warps (the split-K case). (The
/// slot-major kernel in clusters of 8 splits, FastSlotGeometry<..., 8>,
/// measured slower on the split-K shape: 0.59 / 0.33 of peak against 0.67 /
/// 0.34 in the same run.)
template <ElementFormat F>
struct FastAuto {
  using Slot = FastSlotGeometry<F, 8, F == ElementFormat::kFp8 ? 3 : 2, F != ElementFormat::kFp8, 1,
                                F == ElementFormat::kFp8 ? 2 : 1>;
  using Warp = FastWarpGeometry<F, 8, 2>;
};
template <ElementFormat F>
using FastDefault = FastAuto<F>;

// Whether a fast kernel fits a launch, its head tiles and its split count
// (ring_fast_attend_fits, ring_fast_head_tiles, ring_fast_splits) are host
// functions of impl/cuda/attend_dispatch.hpp, the one dispatch decision.
template <ElementFormat F>
constexpr bool fast_policy_is_fast_auto() {
  constexpr FastPolicy p = fast_policy(F);
  using S = typename FastAuto<F>::Slot;
  using W = typename FastAuto<F>::Warp;
  return S::kWarps == p.slot_warps && S::kTileRows == p.slot_tile_rows &&
         S::kMostSplits == p.slot_most_splits && W::kTileRows == p.warp_tile_rows &&
         W::kMostSplits == p.warp_most_splits;
}
static_assert(fast_policy_is_fast_auto<ElementFormat::kBf16>() &&
                  fast_policy_is_fast_auto<ElementFormat::kFp8>(),
              "the host dispatch's sizes (fast_policy) are FastAuto's");

/// The kernel of configuration G: the warp-pipelined one for FastWarpGeometry.
template <ElementFormat F, class G, class Args>
inline auto ring_fast_kernel_of() {
  if constexpr (G::kSlotMajor) {
    return ring_fast_slot_attend_kernel<F, G, Args>;
  } else if constexpr (G::kWarpPipe) {
    return ring_fast_warp_attend_kernel<F, G, Args>;
  } else {
    return ring_fast_attend_kernel<F, G, Args>;
  }
}

/// Blocks of configuration G resident per SM (occupancy query, once per
/// configuration; the shared-memory carveout is asked at its maximum so two
/// 110 KiB blocks fit). 0 when G cannot run here (the error is cleared).
template <ElementFormat F, class G, class Args>
inline int ring_fast_blocks_per_sm() {
  static const int blocks = [] {
    const auto kernel = ring_fast_kernel_of<F, G, Args>();
    int n = 0;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, G::kSharedBytes) !=
            cudaSuccess ||
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, G::kThreads, G::kSharedBytes) !=
            cudaSuccess) {
      cudaGetLastError();  // a configuration that does not fit is an answer, not an error
      return 0;
    }
    return n;
  }();
  return blocks;
}

/// Blocks per cluster of configuration G (1: launched without clusters).
template <class G>
constexpr int fast_cluster_of() {
  if constexpr (requires { G::kCluster; }) {
    return G::kCluster;
  } else {
    return 1;
  }
}

/// Clusters of configuration G (kCluster > 1) the device holds at once
/// (occupancy query, once per configuration; 0 when none fits: the error is
/// cleared).
template <ElementFormat F, class G, class Args>
inline int ring_fast_resident_clusters() {
  static const int clusters = [] {
    if (ring_fast_blocks_per_sm<F, G, Args>() < 1) return 0;
    cudaLaunchConfig_t config = {};
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = 1;
    attribute[0].val.clusterDim.y = G::kCluster;
    attribute[0].val.clusterDim.z = 1;
    config.gridDim = dim3(1, G::kCluster, 1);
    config.blockDim = dim3(G::kThreads, 1, 1);
    config.dynamicSmemBytes = G::kSharedBytes;
    config.attrs = attribute;
    config.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, ring_fast_kernel_of<F, G, Args>(), &config) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  }();
  return clusters;
}

/// Blocks of the grid's x dimension of configuration G over `a`: (query, KV
/// head, head tile), or for the slot-major kernel (query, group of kWarps
/// (KV head, head tile) pairs).
template <class G, class Args>
inline std::int64_t ring_fast_grid_x(const Args& a) {
  const std::int64_t pairs =
      static_cast<std::int64_t>(a.layout.kv_heads) * ring_fast_head_tiles(a.q_heads, a.layout.kv_heads);
  if constexpr (G::kSlotMajor) {
    return a.n * ((pairs + G::kWarps - 1) / G::kWarps);
  } else {
    return a.n * pairs;
  }
}

/// Splits configuration G runs `a` with (0: it cannot), for `sm_count` SMs
/// (the benchmark's configurations; the backend's come from ring_attend_dispatch).
template <ElementFormat F, class G, class Args>
inline std::int32_t ring_fast_choose_splits(const Args& a, int sm_count, std::int32_t max_splits) {
  if constexpr (fast_cluster_of<G>() > 1) {
    // One wave of clusters: the most splits (a multiple of the cluster) whose
    // blocks the device holds at once, at least enough that no split passes
    // kFastMaxSplitColumns, no more than one tile per split; max_splits and
    // kMostSplits bound the partial states (one per cluster).
    (void)sm_count;
    constexpr std::int64_t kC = G::kCluster;
    const std::int64_t resident = static_cast<std::int64_t>(ring_fast_resident_clusters<F, G, Args>()) * kC;
    const std::int64_t base = ring_fast_grid_x<G>(a);
    if (resident <= 0 || base <= 0 || a.width <= 0) return 0;
    std::int64_t s = resident / base / kC * kC;
    const std::int64_t need = (a.width + kFastMaxSplitColumns - 1) / kFastMaxSplitColumns;
    const std::int64_t most = (a.width + G::kTileRows - 1) / G::kTileRows;
    if (s > most) s = most / kC * kC;
    if (s < need) s = need;
    s = (s + kC - 1) / kC * kC;
    if (s / kC > max_splits || s / kC > G::kMostSplits || s > 65535) return 0;
    return static_cast<std::int32_t>(s);
  } else {
    const int per_sm = ring_fast_blocks_per_sm<F, G, Args>();
    if (per_sm <= 0) return 0;
    if (max_splits > G::kMostSplits) max_splits = G::kMostSplits;
    return ring_fast_splits(ring_fast_grid_x<G>(a), a.width,
                            static_cast<std::int64_t>(per_sm) * (sm_count > 0 ? sm_count : 1), max_splits,
                            G::kTileRows);
  }
}

/// Launches configuration G of the fast kernel. a.splits must be one it can
/// run (ring_fast_choose_splits), part_acc/part_ml hold that many splits,
/// counters hold one zeroed word per block of the grid's x dimension.
template <ElementFormat F, class G, class Args>
cudaError_t ring_fast_attend_launch_one(const Args& a, cudaStream_t stream) {
  FastExtra extra;
  extra.head_tiles = ring_fast_head_tiles(a.q_heads, a.layout.kv_heads);
  const std::int64_t blocks = ring_fast_grid_x<G>(a);
  if (blocks <= 0) return cudaSuccess;
  constexpr int kC = fast_cluster_of<G>();
  if (blocks > 0x7fffffff || a.splits < 1 || a.splits > 65535 || a.splits % kC != 0 ||
      a.splits / kC > G::kMostSplits || (a.width + a.splits - 1) / a.splits > kFastMaxSplitColumns) {
    return cudaErrorInvalidConfiguration;
  }
  if (ring_fast_blocks_per_sm<F, G, Args>() < 1) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(a.splits));
  if constexpr (kC > 1) {
    cudaLaunchConfig_t config = {};
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = 1;
    attribute[0].val.clusterDim.y = kC;
    attribute[0].val.clusterDim.z = 1;
    config.gridDim = grid;
    config.blockDim = dim3(G::kThreads, 1, 1);
    config.dynamicSmemBytes = G::kSharedBytes;
    config.stream = stream;
    config.attrs = attribute;
    config.numAttrs = 1;
    const cudaError_t err = cudaLaunchKernelEx(&config, ring_fast_kernel_of<F, G, Args>(), a, extra);
    return err != cudaSuccess ? err : cudaGetLastError();
  } else {
    ring_fast_kernel_of<F, G, Args>()<<<grid, G::kThreads, G::kSharedBytes, stream>>>(a, extra);
    return cudaGetLastError();
  }
}

/// Launches configuration G (the backend picks FastAuto's Slot or Warp by
/// ring_attend_dispatch, impl/cuda/attend_dispatch.hpp).
template <ElementFormat F, class G, class Args>
cudaError_t ring_fast_attend_launch(const Args& a, cudaStream_t stream) {
  return ring_fast_attend_launch_one<F, G>(a, stream);
}

}  // namespace kvcheck::impl::cuda
