// NCCL transport (CUDA builds with NCCL): stages on GPUs, tensors sent device to device.
// Each endpoint owns a non-blocking communicator on its GPU, a non-blocking comm stream and
// events: a send or receive waits (on the GPU) for the work queued on the stage's compute
// stream, runs on the comm stream, and a receive makes the compute stream wait for its data,
// so the host never blocks on a transfer. Send/receive calls between begin_batch() and
// end_batch() form one NCCL group. A sent tensor is kept alive until its transfer is done.
//
// Failure: every host wait polls (event/stream queries and the communicator's async error)
// against the timeout and throws an Error naming the peer and what it waited for, after
// aborting the communicator. In one process, abort() (or a timeout) aborts every endpoint's
// communicator, which also stops GPU transfers that wait for a failed stage; with one
// process per GPU the others fail at their own timeout. A host blocked in a CUDA
// synchronisation polls nothing: a watchdog (pipeline/watchdog.h) aborts the communicators
// when a transfer is not done after the timeout, which ends that wait; the stage then fails
// naming the peer, or the process exits with code 1 after another timeout.
//
// Nothing NCCL-specific appears here, so callers compile without NCCL headers.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pipeline/grid.h"
#include "pipeline/transport.h"

namespace stateflow {

int cuda_device_count();

// One process drives GPUs 0..world_size-1, one endpoint (stage) each; fewer GPUs is an error
// naming the fix. The calling thread keeps its current GPU.
std::vector<std::unique_ptr<Transport>> make_nccl_transports(int world_size, double timeout_s);

// One process per GPU: this process is `rank` of `world_size` on GPU `device`, which becomes
// the calling thread's current GPU.
// share_id(bytes) must return rank 0's bytes on every rank (MPI broadcast or TCP rendezvous).
std::unique_ptr<Transport> make_nccl_transport(int rank, int world_size, int device, double timeout_s,
                                               const std::function<std::string(const std::string&)>& share_id);

// Data parallelism, one process per GPU: the grid of world_size ranks (data_parallel 0:
// world / stages), every rank's host and GPU, and this rank's transports over two
// communicators split from the world's: its replica's pipeline (ranks = stages) and its
// stage group (ranks = replicas, one rank when D = 1).
GridTransports make_nccl_grid_transports(int rank, int world_size, int device, int stages, int data_parallel,
                                         double timeout_s,
                                         const std::function<std::string(const std::string&)>& share_id);

}  // namespace stateflow
