#include "pipeline/grid.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"

namespace stateflow {

ProcessGrid make_grid(int world, int stages, int data_parallel) {
  SF_CHECK(stages >= 1, "--stages must be at least 1, got ", stages);
  SF_CHECK(data_parallel >= 0, "--data-parallel must be at least 1 (or 0: world size / --stages), got ",
           data_parallel);
  SF_CHECK(world % stages == 0, "the launch has ", world, " rank(s), not a multiple of --stages ", stages,
           ": start --stages x --data-parallel processes (e.g. mpirun -n ", stages * std::max(1, world / stages),
           ")");
  const int D = data_parallel ? data_parallel : world / stages;
  SF_CHECK(D >= 1 && stages * D == world, "--stages ", stages, " x --data-parallel ", D, " needs ", stages * D,
           " ranks but the launch has ", world, ": start ", stages * D, " processes, or use --data-parallel ",
           world / stages);
  return {stages, D};
}

void check_placement(const ProcessGrid& g, const std::vector<RankPlace>& places) {
  SF_CHECK(int(places.size()) == g.world(), "process grid: ", places.size(), " placements for ", g.world(), " ranks");
  std::map<std::string, std::vector<int>> by_host;
  for (int r = 0; r < g.world(); ++r) by_host[places[size_t(r)].host].push_back(r);
  for (auto& [host, ranks] : by_host) {
    std::map<int, int> gpu_owner;
    for (int r : ranks) {
      const int gpu = places[size_t(r)].gpu;
      if (gpu < 0) continue;
      auto [it, fresh] = gpu_owner.emplace(gpu, r);
      SF_CHECK(fresh, "ranks ", it->second, " and ", r, " both run on GPU ", gpu, " of host ", host,
               ": each rank needs a GPU of its own; check the launcher's local ranks (LOCAL_RANK, "
               "OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or --local-rank)");
    }
  }
  size_t smallest_host = places.size();
  for (auto& [host, ranks] : by_host) smallest_host = std::min(smallest_host, ranks.size());
  if (size_t(g.replicas) > smallest_host) return;  // a stage group must span hosts anyway
  for (int s = 0; s < g.stages; ++s) {
    std::set<std::string> hosts;
    for (int d = 0; d < g.replicas; ++d) hosts.insert(places[size_t(g.rank_of(s, d))].host);
    SF_CHECK(hosts.size() == 1, "stage ", s, "'s ", g.replicas, " replicas (ranks ", g.rank_of(s, 0), "..",
             g.rank_of(s, g.replicas - 1), ") are spread over ", hosts.size(),
             " hosts although every host runs at least ", smallest_host,
             " ranks: their gradient all-reduce, the largest transfer of a step, would cross the slow link between "
             "hosts. Place ranks on hosts in order (mpirun --map-by slot, srun --distribution=block, torchrun "
             "with one --node-rank per host)");
  }
}

std::string describe_grid(const ProcessGrid& g, const std::vector<RankPlace>& places) {
  std::string out = cat("process grid: ", g.stages, " stage(s) x ", g.replicas, " data-parallel replica(s) = ",
                        g.world(), " ranks (rank = stage * ", g.replicas, " + replica)\n");
  for (int r = 0; r < g.world(); ++r) {
    const RankPlace& p = places.at(size_t(r));
    out += cat("  rank ", r, ": stage ", g.stage_of(r), ", replica ", g.replica_of(r), ", host ", p.host,
               p.gpu >= 0 ? cat(", GPU ", p.gpu) : std::string(", CPU"), "\n");
  }
  return out;
}

}  // namespace stateflow
