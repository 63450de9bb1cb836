// Every test case of impl_cuda_test needs a CUDA device. Without one, this
// listener prints "SKIPPED (no CUDA device): <test name>" as each case starts
// and exits with code 4, which ctest (SKIP_RETURN_CODE 4, one ctest per case)
// reports as that case skipped, by name, rather than passed.
// Listener and reporter bases are Catch2 v2's "external interfaces".
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "impl/cuda/cuda_backend.hpp"

namespace {

struct CudaSkipListener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(Catch::TestCaseInfo const& info) override {
    std::string why;
    if (kvcheck::impl::cuda_device_available(&why)) return;
    std::printf("SKIPPED (no CUDA device): %s\n", info.name.c_str());
    std::fflush(stdout);
    std::exit(4);
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(CudaSkipListener)
