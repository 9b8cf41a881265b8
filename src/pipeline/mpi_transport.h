// MPI transport: one process per stage, launched by mpirun -n P, over MPI_COMM_WORLD.
// MPI is initialised on first use and finalised when the process exits, so a process may
// build several pipelines (verify builds one per chunking). Only the calling (main) thread
// talks to MPI. Nothing MPI-specific appears here, so callers compile without MPI headers.
//
// A received message is checked against the receiver's MessageSpec (it arrives on the host).
// Failure: every wait polls with short sleeps and gives up after timeout_s with an Error
// naming the peer; abort() prints "error: stage r: <reason>" to stderr and calls
// MPI_Abort(MPI_COMM_WORLD, 2), which ends this process and makes mpirun end every other
// rank promptly with a non-zero status (it does not return).
#pragma once
#include <memory>
#include <string>

#include "pipeline/grid.h"
#include "pipeline/transport.h"

namespace stateflow {

std::unique_ptr<Transport> make_mpi_transport(double timeout_s);

// Data parallelism: the process grid of MPI_COMM_WORLD (data_parallel 0: world / stages), every
// rank's host, and this rank's transports: its replica's pipeline (ranks = stages) and, when
// there are several replicas, its stage group (ranks = replicas; sums gradients).
GridTransports make_mpi_grid_transports(int stages, int data_parallel, double timeout_s);

// Rank 0's bytes on every rank of MPI_COMM_WORLD (how the NCCL id travels under mpirun), MPI
// initialised as for the transport; `rank` (found in the environment) must be MPI's rank.
// Every rank passes as many bytes. Gives up after timeout_s.
std::string mpi_broadcast_from_rank0(const std::string& bytes, int rank, double timeout_s);

}  // namespace stateflow
