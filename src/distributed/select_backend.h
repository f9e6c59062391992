// tpcli::dist — the transport named by --backend or [mesh] backend, for a command's run_on_mesh.
#pragma once

#include <string_view>

#include "distributed/runtime.h"

namespace tpcli::dist {

// "threads" (or "") leaves `options` as they are; "zmq" is use_zmq_backend with ZmqConfig::from_env()
// (this process was started by `tpcli launch`); "mpi" is use_mpi_backend for a mesh of
// `mesh_devices` devices (this process was started by mpirun). Anything else is an error.
void select_backend(RunOptions& options, std::string_view backend, int mesh_devices);

}  // namespace tpcli::dist
