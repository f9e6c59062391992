// tpcli::dist — the MPI backend's stand-in in a build without MPI (CMake TPCLI_MPI=OFF, or no MPI
// found): the same functions, and asking for the backend is a one-line error.
#include <cstdlib>
#include <stdexcept>

#include "distributed/mpi/mpi_backend.h"

namespace tpcli::dist {

namespace {
[[noreturn]] void built_without_mpi() {
  throw std::invalid_argument("backend mpi: this tpcli was built without MPI (install libopenmpi-dev and rebuild with -DTPCLI_MPI=ON)");
}
}  // namespace

bool mpi_available() { return false; }
int mpi_process_rank() { built_without_mpi(); }
int mpi_process_count() { built_without_mpi(); }
void mpi_abort_job(int) {}


void use_mpi_backend(RunOptions&, int) { built_without_mpi(); }

}  // namespace tpcli::dist
