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

/// Provider of ring pools over backend `backend` ("cpu" or "cuda") with `fault`.
/// Throws kvcheck::Error(kDevice) when the backend is unavailable.
std::unique_ptr<CacheProvider> make_ring_pool_provider(const std::string& backend, impl::Fault fault);

}  // namespace kvcheck::engines
