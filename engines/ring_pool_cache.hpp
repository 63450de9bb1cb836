// The ring pool (impl/ring_pool.hpp) over a backend's kernel table ("cpu",
// "cuda") as a step-level cache under test: one RingPool per layer, the
// pool's own write records and read slots reported as slots. Named faults
// (impl::Fault) are applied by the pool itself, unchanged.
#pragma once

#include <memory>
#include <string>

#include "engines/cache_under_test.hpp"
#include "impl/kv_cache.hpp"

namespace kvcheck::engines {

/// The backend's RoPE pairing of the scenario's spelling (the element
/// format is one type for both: support/formats.hpp).
impl::RopeStyle impl_rope_style(scenarios::RopeStyle style) noexcept;

/// The backend PoolSpec of a cache spec (what the ring pool is asked for).
impl::PoolSpec ring_pool_spec(const CacheSpec& spec, impl::Fault fault);

/// What a ring pool over backend `backend` ("cpu" or "cuda"; paged when
/// `block_rows` > 0) with `fault` declares: the step kinds, addressing and
/// features RingPool composes for every backend (trim, a window per layer,
/// no shared prefixes), the backend's own limits (CUDA: head_dim up to the
/// attention kernels' 512), and its kernel paths as `probe` (an instance of
/// the backend, unconfigured; null: none) answers them (KvBackend::
/// attend_paths, attend_paths_run over every layer's pool). No device needed.
Capabilities ring_pool_capabilities(const std::string& backend, impl::Fault fault, std::int64_t block_rows,
                                    std::shared_ptr<const impl::KvBackend> probe);

/// Provider of ring pools over backend `backend` ("cpu" or "cuda") with `fault`.
/// Throws kvcheck::Error(kDevice) when the backend is unavailable.
std::unique_ptr<CacheProvider> make_ring_pool_provider(const std::string& backend, impl::Fault fault);

/// The block size of `--impl paged`.
inline constexpr std::int64_t kPagedPoolBlockRows = 4;

/// Provider of paged pools (`--impl paged`): the same ring pool over a
/// block table (impl/block_table.hpp) of `block_rows`-row blocks on backend
/// `backend`, declaring paged addressing (Capabilities::block_size). Each
/// state has ceil(capacity / block_rows) table entries (reused in place as
/// its window slides), the pool the spec's pool_blocks (paged_pool_blocks
/// when 0); blocks go back to a shared free list, the last freed first, when
/// a request finishes, and the next request takes them.
std::unique_ptr<CacheProvider> make_paged_pool_provider(const std::string& backend, impl::Fault fault,
                                                        std::int64_t block_rows = kPagedPoolBlockRows);

}  // namespace kvcheck::engines
