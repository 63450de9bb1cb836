// The CUDA backend's attention dispatch (impl/cuda/attend_dispatch.hpp) on
// the CPU: the host decision the launcher and `--impl cuda`'s coverage
// classes share, on device numbers given here (an H100/H200-like 132 SMs,
// one block of each fast configuration per SM), so it runs without a device.
// The expected splits are worked out by hand from the cost rule of
// ring_fast_splits (waves x (tiles per split + 2)).
#include <catch2/catch.hpp>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "impl/cuda/attend_dispatch.hpp"

namespace {

namespace kc = kvcheck::impl::cuda;
using kvcheck::impl::ElementFormat;
using kvcheck::impl::Fault;
using kvcheck::impl::PoolSpec;

kc::AttendDevice hopper() {
  kc::AttendDevice d;
  d.sm_count = 132;
  d.bf16 = {1, 1};
  d.fp8 = {1, 1};
  return d;
}

/// A pool of the production shape: head_dim 128, W = 4096, steps of up to
/// 16 rows (32 x 16 x 128 x 130 floats a split: the workspace holds 7).
PoolSpec production_pool(ElementFormat format, std::int32_t q_heads, std::int32_t kv_heads) {
  PoolSpec s;
  s.states = 2;
  s.ring_rows = 4200;
  s.window_keys = 4096;
  s.q_heads = q_heads;
  s.kv_heads = kv_heads;
  s.head_dim = 128;
  s.format = format;
  s.max_step_rows = 16;
  return s;
}

kc::AttendDispatch dispatch(const PoolSpec& spec, std::int64_t n, const kc::AttendDevice& device = hopper()) {
  const std::int32_t pool =
      kc::attend_max_splits(spec.format, spec.max_step_rows, spec.q_heads, spec.head_dim);
  return kc::ring_attend_dispatch(kc::pool_attend_launch(spec, n), device,
                                  kc::attend_launch_max_splits(pool, spec.max_step_rows, n));
}

}  // namespace

TEST_CASE("attend dispatch: one bf16 decode query runs warp-pipelined, a verify of 16 slot-major",
          "[cuda][dispatch]") {
  const PoolSpec spec = production_pool(ElementFormat::kBf16, 32, 8);
  // 8 (KV head, head tile) pairs: one slot-major block per query, 16 x 1 < 132 SMs.
  // One query has room for 7 x 16 splits (64 at most); 8 x 16 blocks of two
  // tiles each fill one wave at least cost.
  CHECK(dispatch(spec, 1) == kc::AttendDispatch{kc::AttendKernel::kWarpPipelined, 16});
  // 16 queries: 16 x 16 >= 132; 16 x 7 blocks still fit one wave.
  CHECK(dispatch(spec, 16) == kc::AttendDispatch{kc::AttendKernel::kSlotMajor, 7});
  // 64 queries (a pool without the cap): two splits of 2048 columns fill the device.
  CHECK(kc::ring_attend_dispatch(kc::pool_attend_launch(spec, 64), hopper(), 64) ==
        kc::AttendDispatch{kc::AttendKernel::kSlotMajor, 2});
  // The boundary: 9 x 16 >= 132 > 8 x 16.
  CHECK(dispatch(spec, 8).kernel == kc::AttendKernel::kWarpPipelined);
  CHECK(dispatch(spec, 9).kernel == kc::AttendKernel::kSlotMajor);
}

TEST_CASE("attend dispatch: f32, f64, head_dim 64 and unaligned fp8 rows run the general kernel",
          "[cuda][dispatch]") {
  // f32: 8 blocks per query, 2112 / 8 wanted, 64 by the width and the cap.
  CHECK(dispatch(production_pool(ElementFormat::kF32, 32, 8), 1) ==
        kc::AttendDispatch{kc::AttendKernel::kGeneral, 64});
  // 16 queries: the workspace's 7 splits.
  CHECK(dispatch(production_pool(ElementFormat::kF32, 32, 8), 16) ==
        kc::AttendDispatch{kc::AttendKernel::kGeneral, 7});
  CHECK(dispatch(production_pool(ElementFormat::kF64, 32, 8), 1).kernel == kc::AttendKernel::kGeneral);
  PoolSpec narrow = production_pool(ElementFormat::kBf16, 32, 8);
  narrow.head_dim = 64;
  CHECK(dispatch(narrow, 1).kernel == kc::AttendKernel::kGeneral);
  // fp8 rows of 2 KV heads: 256 codes + 8 scale bytes, not a multiple of 16.
  CHECK(dispatch(production_pool(ElementFormat::kFp8, 16, 2), 1).kernel == kc::AttendKernel::kGeneral);
  // 4 KV heads: 512 + 16 bytes, and the fast kernel takes it.
  CHECK(dispatch(production_pool(ElementFormat::kFp8, 16, 4), 1).kernel == kc::AttendKernel::kWarpPipelined);
}

TEST_CASE("attend dispatch: a fast configuration the device cannot hold, or no split count, means general",
          "[cuda][dispatch]") {
  const PoolSpec spec = production_pool(ElementFormat::kBf16, 32, 8);
  kc::AttendDevice device = hopper();
  device.bf16.warp_pipelined = 0;  // FastAuto needs both of its configurations
  CHECK(dispatch(spec, 16, device).kernel == kc::AttendKernel::kGeneral);
  CHECK(dispatch(production_pool(ElementFormat::kFp8, 32, 8), 16, device).kernel ==
        kc::AttendKernel::kSlotMajor);
  // A window of 64 splits of 2048 columns and one more: no split count <= 64 fits.
  kc::AttendLaunch wide = kc::pool_attend_launch(spec, 1);
  wide.width = 64 * kc::kFastMaxSplitColumns + 1;
  CHECK(kc::ring_attend_dispatch(wide, hopper(), 64) == kc::AttendDispatch{kc::AttendKernel::kGeneral, 64});
  wide.width -= 1;
  CHECK(kc::ring_attend_dispatch(wide, hopper(), 64).kernel == kc::AttendKernel::kWarpPipelined);
  // No counter buffer: the fast kernels cannot combine their splits.
  kc::AttendLaunch bare = kc::pool_attend_launch(spec, 1);
  bare.counters = false;
  CHECK(kc::ring_attend_dispatch(bare, hopper(), 64).kernel == kc::AttendKernel::kGeneral);
}

TEST_CASE("attend dispatch: a pool's paths are the union over its steps, and a named fault's window counts",
          "[cuda][dispatch]") {
  PoolSpec small;
  small.window_keys = 64;
  small.head_dim = 8;
  small.format = ElementFormat::kF32;
  small.max_step_rows = 1;
  const std::vector<std::int64_t> decode = {1};
  // 64 columns are one split of the general kernel: no split-K.
  CHECK(kc::pool_attend_paths(small, decode, hopper()) == std::vector<bool>{true, false, false, false});
  small.fault = Fault::kWindowTooWide;  // 65 columns: two splits
  CHECK(kc::pool_attend_paths(small, decode, hopper()) == std::vector<bool>{true, false, false, true});
  CHECK(kc::pool_attend_paths(small, {}, hopper()) == std::vector<bool>{false, false, false, false});

  const PoolSpec spec = production_pool(ElementFormat::kBf16, 32, 8);
  const std::vector<std::int64_t> one = {1, 1}, both = {1, 16, 0};
  CHECK(kc::pool_attend_paths(spec, one, hopper()) == std::vector<bool>{false, false, true, true});
  CHECK(kc::pool_attend_paths(spec, both, hopper()) == std::vector<bool>{false, true, true, true});
}

TEST_CASE("attend dispatch: the workspace bounds the splits as configure sizes it", "[cuda][dispatch]") {
  // A long chunked prefill's pool holds one split of its full step: the
  // chunk's launch runs the general kernel over a window past 2048 columns
  // even in bf16, and a decode in the same pool has room for 64 splits.
  PoolSpec chunked = production_pool(ElementFormat::kBf16, 32, 8);
  chunked.max_step_rows = 1024;
  CHECK(dispatch(chunked, 1024) == kc::AttendDispatch{kc::AttendKernel::kGeneral, 1});
  CHECK(dispatch(chunked, 1) == kc::AttendDispatch{kc::AttendKernel::kWarpPipelined, 16});
  // n x splits stays within what the workspace holds.
  CHECK(kc::attend_launch_max_splits(7, 16, 1) == 64);
  CHECK(kc::attend_launch_max_splits(7, 16, 3) == 37);
  CHECK(kc::attend_launch_max_splits(7, 16, 16) == 7);
  CHECK(kc::attend_launch_max_splits(1, 1024, 1000) == 1);
  // 1 x 32 x 128 x 130 floats a split: 126 fit in 256 MiB, capped at 64.
  CHECK(kc::attend_max_splits(ElementFormat::kF32, 1, 32, 128) == 64);
  // 2048 rows: one split takes 4.3 GB: still one split.
  CHECK(kc::attend_max_splits(ElementFormat::kBf16, 2048, 32, 128) == 1);
  // 48 rows x 32 heads x 128 x 130 x 4 bytes = 102 MB: two splits.
  CHECK(kc::attend_max_splits(ElementFormat::kBf16, 48, 32, 128) == 2);
  // f64 accumulates in 8 bytes: half as many.
  CHECK(kc::attend_max_splits(ElementFormat::kF64, 24, 32, 128) == 2);
  CHECK(kc::attend_max_splits(ElementFormat::kF64, 48, 32, 128) == 1);
  CHECK(kc::attend_max_splits(ElementFormat::kF64, std::int64_t{1} << 62, 32, 128) == 1);  // no overflow
}

TEST_CASE("attend dispatch: four path names, the kernels first, split-K last", "[cuda][dispatch]") {
  std::set<std::string> names;
  for (int i = 0; i < kc::kAttendPathCount; ++i)
    names.insert(kc::attend_path_name(static_cast<kc::AttendPath>(i)));
  CHECK(names.size() == 4);
  CHECK(std::string(kc::attend_path_name(kc::AttendPath::kGeneral)) == "cuda_general_kernel");
  CHECK(std::string(kc::attend_path_name(kc::AttendPath::kSplitK)) == "cuda_split_k");
  CHECK(kc::attend_paths_of({kc::AttendKernel::kSlotMajor, 1}) ==
        std::array<bool, kc::kAttendPathCount>{false, true, false, false});
  CHECK(kc::attend_paths_of({kc::AttendKernel::kGeneral, 3}) ==
        std::array<bool, kc::kAttendPathCount>{true, false, false, true});
}
