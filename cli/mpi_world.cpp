#include "cli/mpi_world.hpp"

#include <cstdlib>

#include "support/error.hpp"

#ifdef KVCHECK_HAVE_MPI
#include <boost/mpi/collectives.hpp>
#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>
#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>
#endif

namespace kvcheck::cli {

namespace {

#ifdef KVCHECK_HAVE_MPI
class BoostMpiWorld final : public MpiWorld {
 public:
  BoostMpiWorld(int argc, char** argv) : env_(argc, argv, /*abort_on_exception=*/false) {}
  int rank() const override { return world_.rank(); }
  int size() const override { return world_.size(); }
  std::vector<std::string> gather(const std::string& mine) override {
    std::vector<std::string> all;
    if (world_.rank() == 0) {
      boost::mpi::gather(world_, mine, all, 0);
    } else {
      boost::mpi::gather(world_, mine, 0);
    }
    return all;
  }

 private:
  boost::mpi::environment env_;  // MPI_Init here, MPI_Finalize in its destructor
  boost::mpi::communicator world_;
};
#endif

}  // namespace

bool launched_by_mpi() {
  // OpenMPI's mpirun, and PMI launchers (MPICH's, Slurm's srun). A job of
  // one rank is an ordinary run: `srun kvcheck check --shard I/N` inside a
  // job array must not need MPI.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && std::atoi(value) > 1) return true;
  }
  return false;
}

std::unique_ptr<MpiWorld> join_mpi_world([[maybe_unused]] int argc, [[maybe_unused]] char** argv) {
  if (!launched_by_mpi()) return nullptr;
#ifdef KVCHECK_HAVE_MPI
  return std::make_unique<BoostMpiWorld>(argc, argv);
#else
  throw Error(ErrorId::kUsage, "mpirun",
              "this kvcheck was built without MPI (install libboost-mpi-dev and reconfigure), so every rank "
              "would run the whole check; use --shard I/N and kvcheck merge instead");
#endif
}

}  // namespace kvcheck::cli
