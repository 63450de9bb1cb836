// The CUDA backend of impl/kv_cache.hpp, seen from host code that has no CUDA
// headers (the factory in impl/kv_cache.cpp, the tests, the CLI). The kernels
// live in impl/cuda/ring_kernels.cuh, their launchers and the KvBackend
// implementation in impl/cuda/cuda_backend.cu; this header only says whether a
// device is there and hands out a backend.
#pragma once

#include <memory>
#include <string>

#include "impl/kv_cache.hpp"

namespace kvcheck::impl {

/// Whether a usable CUDA device is present at run time. On false, `why` (if
/// non-null) receives one line naming the cause ("no CUDA device: ...").
/// Never throws and never aborts, also on a machine without a driver.
bool cuda_device_available(std::string* why);

/// A CUDA KvBackend bound to device 0, or nullptr with `why` set to one line
/// when no device is present (the same condition under which configure()
/// answers CacheError::kNoDevice).
std::unique_ptr<KvBackend> make_cuda_backend(std::string* why);

}  // namespace kvcheck::impl
