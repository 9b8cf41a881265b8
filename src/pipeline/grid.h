// The process grid of a data-parallel pipelined run: world = D replicas x P stages. Every
// rank runs one stage of one replica; each replica is a whole pipeline and sees its own
// slice of the global batch; the D ranks of one stage (its "stage group") sum their
// gradients before the optimizer step.
//
// Layout: rank = stage * D + replica. A stage group is D neighbouring ranks, so when a
// launcher packs ranks onto hosts in order (mpirun's default --map-by slot, srun's block
// distribution, torchrun's node ranks) the gradient all-reduce, every step's largest
// transfer (all of a stage's gradients), stays on one host, and the pipeline's chunk
// activations are what cross the slow link between hosts.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "pipeline/transport.h"

namespace stateflow {

struct ProcessGrid {
  int stages = 1;    // P
  int replicas = 1;  // D
  int world() const { return stages * replicas; }
  int rank_of(int stage, int replica) const { return stage * replicas + replica; }
  int stage_of(int rank) const { return rank / replicas; }
  int replica_of(int rank) const { return rank % replicas; }
};

// The grid for `world` ranks and P stages; data_parallel 0 means world / P. Throws an Error
// naming the fix when the world is not D x P.
ProcessGrid make_grid(int world, int stages, int data_parallel);

// Where a rank runs: its host name and its GPU (-1: none, a CPU run).
struct RankPlace {
  std::string host;
  int gpu = -1;
};

// Throws an Error naming the ranks and the fix when the launcher placed them badly: a stage
// group spread over several hosts although D ranks fit on one (its gradient all-reduce would
// cross the slow link; the launcher did not pack ranks in order), or two ranks of one host
// on the same GPU. places: by rank, world() of them.
void check_placement(const ProcessGrid& g, const std::vector<RankPlace>& places);

// The rank -> stage, replica, host, GPU table, printed once by rank 0.
std::string describe_grid(const ProcessGrid& g, const std::vector<RankPlace>& places);

// What a multi-process launcher's factory (MPI, NCCL) hands the pipeline.
struct GridTransports {
  ProcessGrid grid;
  int rank = 0;                          // in the world
  std::vector<RankPlace> places;         // by world rank
  std::unique_ptr<Transport> pipeline;   // this rank's replica: rank = stage
  std::unique_ptr<Transport> group;      // this rank's stage group: rank = replica (null when D = 1)
};

}  // namespace stateflow
