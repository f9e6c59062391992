// tpcli::dist — the MPI backend: devices are MPI processes started by `mpirun`/`srun` (each may host
// K thread devices), and every collective is non-blocking MPI, polled against a deadline:
//
//   all_sum              each member's slice from every member (point-to-point), summed in a fixed
//                        tree order (the thread backend's bits), then gathered back (point-to-point)
//   all_gather_v         point-to-point          all_to_all(_v)     point-to-point (counts: MPI_Ialltoall)
//   all_max              MPI_Iallreduce (MAX)    reduce_scatter_v   MPI_Ireduce_scatter
//   ppermute             MPI_Isend / MPI_Irecv (MPI_PROC_NULL where this member sends or receives nothing)
//   broadcast            MPI_Ibcast              barrier            MPI_Ibarrier
//
// The data-moving ones post every message at once instead of calling MPI_Ialltoallv/Iallgatherv:
// OpenMPI's non-blocking collectives took 1.3-1.7x its blocking ones on small messages.
//
// P processes (MPI_COMM_WORLD's size) run a mesh of N devices, K = N / P per process: process p
// hosts mesh ranks [p*K, p*K + K), as with ZeroMQ. A mesh sub-group with one device per process is
// an MPI communicator over those processes (MPI_Comm_create_group, made lazily by its members only);
// a sub-group inside one process is the thread backend's; a group with several devices in one
// process *and* members in others (the world of 2 processes x 2 devices) does all_sum, all_max,
// broadcast and barrier in three steps (threads, MPI between one leader per process, threads), and
// the data-moving collectives as one such all_sum of a zero-filled buffer (exact, S times the bytes).
// MPI is initialised with MPI_THREAD_MULTIPLE: with K > 1 the device threads call MPI concurrently,
// each on its own communicators (and even with K = 1 the device is not the main thread).
//
// Every wait polls MPI_Test against a deadline: TPCLI_TIMEOUT seconds (default 30, as on zmq). Half a
// second before it, the waiting process asks the others of its group who is still there (a roll
// call on a communicator of its own, answered by any process waiting in any collective); at the
// deadline it fails with "mpi: timed out after 3 s: device 0 in broadcast got nothing from rank 1
// (...)", naming those that did not answer (a frozen or dead-locked process).
//
// Failures: every communicator returns errors (MPI_ERRORS_RETURN); a failed call throws a one-line
// error naming the op, the device and the MPI error, and any device failure prints
// "mpi: process P (device D) failed: ..." and ends the job with MPI_Abort, so mpirun stops every
// process instead of leaving the others waiting in a collective. Not at once: the process's own
// waits end and its command has 2 s to report (a server answers its requests 500) and exit through
// mpi_abort_job. A process killed outright is mpirun's to report (it stops the job and names the rank).
//
// Built without MPI (CMake TPCLI_MPI=OFF or no MPI found), distributed/mpi/mpi_stub.cpp provides these
// functions: mpi_available() is false and the others throw "built without MPI".
#pragma once

#include <cstdlib>
#include <string>

#include "distributed/runtime.h"

namespace tpcli::dist {

// True when this binary was built with MPI.
bool mpi_available();

// This process's MPI rank and MPI_COMM_WORLD's size (initialises MPI on first use).
int mpi_process_rank();
int mpi_process_count();

// True when this process was started by an MPI launcher (mpirun/srun set these variables); does not
// initialise MPI.
inline bool started_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (const char* s = std::getenv(v); s && *s) return true;
  return false;
}

// When MPI is running in this process (initialised, not finalised), ends the whole job with
// MPI_Abort(code) so that no other rank waits for this one; otherwise does nothing.
void mpi_abort_job(int code);

// Makes run_on_mesh use MPI for a mesh of `mesh_devices` devices: sets options.make_backend and
// options.local_ranks. Throws a one-line error when the mesh does not split evenly over the processes.
void use_mpi_backend(RunOptions& options, int mesh_devices);

}  // namespace tpcli::dist
