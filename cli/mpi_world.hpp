// The MPI side of a split check (`mpirun -n R kvcheck check ...`): each rank
// runs one shard and rank 0 gathers the shard documents and writes the
// report. Built with Boost.MPI when CMake finds OpenMPI and Boost.MPI
// (KVCHECK_HAVE_MPI); without them a run under mpirun is refused instead of
// every rank running the whole check.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace kvcheck::cli {

/// The ranks of one `mpirun` job. Initializes MPI on construction and
/// finalizes it on destruction.
class MpiWorld {
 public:
  virtual ~MpiWorld() = default;
  /// This process's rank, 0 .. size() - 1.
  virtual int rank() const = 0;
  /// The number of ranks.
  virtual int size() const = 0;
  /// Every rank's `mine`, in rank order, on rank 0; empty on the others.
  /// Collective: every rank must call it exactly once.
  virtual std::vector<std::string> gather(const std::string& mine) = 0;
};

/// True when an MPI launcher (OpenMPI's mpirun, a PMI launcher) started this
/// process as one of more than one rank.
bool launched_by_mpi();

/// The MPI world when launched_by_mpi(), else nullptr. Throws
/// kvcheck::Error(kUsage) when kvcheck was built without MPI but runs under
/// a launcher (every rank would run the whole check).
std::unique_ptr<MpiWorld> join_mpi_world(int argc, char** argv);

}  // namespace kvcheck::cli
