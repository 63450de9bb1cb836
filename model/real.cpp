#include "model/real.hpp"

#include <mpfr.h>

namespace kvcheck::model {

void release_thread_caches() noexcept {
  mpfr_free_cache2(MPFR_FREE_LOCAL_CACHE);
}

}  // namespace kvcheck::model
