// Builds the pipeline a run asks for: every stage in this process on threads ("local"), this
// process's one stage of an mpirun launch ("mpi"), or stages on GPUs over NCCL ("nccl": one
// process driving GPUs 0..P-1, or one process per GPU when a launcher or the flags give this
// process a rank). "auto" picks nccl for --device cuda when the GPUs suffice, else local.
#pragma once
#include <memory>
#include <string>

#include "pipeline/pipeline.h"
#include "pipeline/rank_env.h"

namespace stateflow {

// How this process joins a multi-process run: the CLI's --rank, --world-size, --local-rank
// and --rendezvous. A property of the process, not of one pipeline: set once at start-up.
struct LaunchFlags {
  RankFlags rank;
  std::string rendezvous;  // "" = MASTER_ADDR:MASTER_PORT, else 127.0.0.1:29500
};
void set_launch_flags(const LaunchFlags& flags);

struct TransportChoice {
  std::string name;  // local, mpi or nccl
  std::string why;   // for "auto": the reason, printed once
};
// What `requested` means for a run: gpus = CUDA devices usable by NCCL (0 without NCCL),
// launched_world = world size a launcher or the flags gave this process (0: none).
TransportChoice choose_transport(const std::string& requested, Device device, int stages, int gpus,
                                 int launched_world);

// CUDA devices NCCL can use (0 in a build without NCCL).
int nccl_gpus();

std::unique_ptr<Pipeline> make_pipeline(const PipelineConfig& cfg, const std::string& transport);
// The rank whose output a run prints (0 with the local transport).
bool is_reporting_rank(const Pipeline& p);

}  // namespace stateflow
