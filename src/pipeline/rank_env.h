// Which rank of a multi-process launch this process is. A pure function of the flags and
// an environment (a map, so tests can fake one): the flags win, then torchrun's variables
// (RANK, WORLD_SIZE, LOCAL_RANK), then Open MPI's (OMPI_COMM_WORLD_RANK, _SIZE,
// _LOCAL_RANK), then Slurm's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID). A source that is
// present but incomplete or malformed is an error, not a reason to look further.
#pragma once
#include <map>
#include <optional>
#include <string>

namespace stateflow {

using Environment = std::map<std::string, std::string>;

// -1 = not given.
struct RankFlags {
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;  // default: the rank (one host)
};

struct RankInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;   // picks the GPU on the host
  std::string source;   // e.g. "torchrun (RANK, WORLD_SIZE, LOCAL_RANK)"
};

// nullopt when neither the flags nor any launcher's variables name a rank.
std::optional<RankInfo> detect_rank(const RankFlags& flags, const Environment& env);

// Started by Open MPI's mpirun (then the NCCL id can travel by MPI).
bool launched_by_mpirun(const Environment& env);

// Where rank 0 listens for the others when the NCCL id travels by TCP: the flag if given,
// else MASTER_ADDR:MASTER_PORT (torchrun), else 127.0.0.1:29500.
std::string rendezvous_address(const std::string& flag, const Environment& env);

// This process's environment.
Environment process_environment();

}  // namespace stateflow
