// Host-only view of tests/impl/cuda/ring_index_probe.cu: the ring index math
// of impl/ring_index.hpp evaluated by code that nvcc compiled (its host
// pass, and optionally a kernel), for comparison with the same functions
// compiled by the host C++ compiler and with the model's address oracle.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "impl/ring_index.hpp"

namespace kvcheck::impl::cuda_test {

/// One input of the probe grid.
struct ProbeCase {
  std::int64_t state = 0;
  std::int64_t position = 0;
  std::int64_t window_keys = 1;
  std::int64_t ring_rows = 1;
  std::int64_t states = 1;
  Fault fault = Fault::kNone;
};

/// What the shared functions answer for one case: ring_metadata, the first
/// `width` index columns (ring_index_column) and ring_rope_position.
struct ProbeResult {
  ReadMeta meta;
  std::vector<std::int64_t> index;
  std::int64_t rope_position = 0;
};

/// Evaluated in a host function of a .cu file (nvcc's host pass, where
/// KVCHECK_HOST_DEVICE is `__host__ __device__ inline`).
std::vector<ProbeResult> nvcc_host_probe(const std::vector<ProbeCase>& cases, std::int64_t width);

/// Evaluated by a kernel on device 0. Returns false and sets `why` when no
/// device is present or a CUDA call fails.
bool nvcc_device_probe(const std::vector<ProbeCase>& cases, std::int64_t width, std::vector<ProbeResult>* out,
                       std::string* why);

}  // namespace kvcheck::impl::cuda_test
