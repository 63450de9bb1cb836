// The backend conformance suite (tests/impl/conformance.hpp), run over the
// CUDA backend. Skipped by name without a device (cuda_skip_listener.cpp).
#include "tests/impl/conformance.hpp"

KVCHECK_CONFORMANCE_SUITE("cuda")
