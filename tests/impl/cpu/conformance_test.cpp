// The backend conformance suite, run over the CPU backend.
#include "tests/impl/conformance.hpp"

KVCHECK_CONFORMANCE_SUITE("cpu")
