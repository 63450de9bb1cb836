// Fallback while the sweep library is not part of the build.
#include "cli/commands.hpp"
#include "support/error.hpp"

namespace kvcheck::cli {

int command_sweep(int, char**) {
  throw Error(ErrorId::kUsage, "sweep", "this build has no sweep library");
}

}  // namespace kvcheck::cli
