#include "distributed/select_backend.h"

#include <stdexcept>
#include <string>

#include "distributed/mpi/mpi_backend.h"
#include "distributed/zmq/zmq_backend.h"

namespace tpcli::dist {

void select_backend(RunOptions& options, std::string_view backend, int mesh_devices) {
  if (backend.empty() || backend == "threads") return;
  if (backend == "zmq") return use_zmq_backend(options, ZmqConfig::from_env());
  if (backend == "mpi") return use_mpi_backend(options, mesh_devices);
  throw std::invalid_argument("unknown backend '" + std::string(backend) + "' (threads, zmq or mpi)");
}

}  // namespace tpcli::dist
