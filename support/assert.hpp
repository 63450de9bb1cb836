// KVCHECK_ASSERT: tier 1 of the error model. A broken invariant is a
// programmer error; the check stays on in every build type.
#pragma once

#include <cstdio>
#include <cstdlib>

#define KVCHECK_ASSERT(cond)                                                                 \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "%s:%d: KVCHECK_ASSERT(%s) failed\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                          \
    }                                                                                        \
  } while (0)
