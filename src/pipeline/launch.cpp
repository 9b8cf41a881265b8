#include "pipeline/launch.h"

#include <iostream>

#include "pipeline/grid.h"
#include "pipeline/rendezvous.h"
#ifdef STATEFLOW_HAVE_MPI
#include "pipeline/mpi_transport.h"
#endif
#ifdef STATEFLOW_HAVE_NCCL
#include "pipeline/nccl_transport.h"
#endif

namespace stateflow {

int nccl_gpus() {
#ifdef STATEFLOW_HAVE_NCCL
  return cuda_device_count();
#else
  return 0;
#endif
}

namespace {

LaunchFlags g_flags;

// One process runs one pipeline: data parallelism needs a process per rank.
void check_one_replica(const PipelineConfig& cfg, const std::string& transport) {
  SF_CHECK(cfg.data_parallel <= 1, "--data-parallel ", cfg.data_parallel, " needs one process per stage and replica (",
           cfg.stages * cfg.data_parallel, " in all), but the ", transport,
           " transport runs one pipeline in this process: launch with mpirun -n ", cfg.stages * cfg.data_parallel,
           " ... --transport mpi on the CPU, or with mpirun, torchrun or srun ... --transport nccl on GPUs "
           "(docs/guide.md, \"Data parallelism\")");
}

// A rank of a grid: the table once (world rank 0), the placement checked on every rank.
[[maybe_unused]] std::unique_ptr<Pipeline> make_grid_pipeline(const PipelineConfig& cfg, GridTransports g) {
  check_placement(g.grid, g.places);
  static bool said = false;  // verify builds several pipelines: say it once
  if (!said && g.rank == 0) std::cerr << "stateflow: " << describe_grid(g.grid, g.places) << std::flush;
  said = true;
  std::vector<std::unique_ptr<Transport>> endpoints;
  endpoints.push_back(std::move(g.pipeline));
  return std::make_unique<Pipeline>(cfg, std::move(endpoints), std::move(g.group));
}

std::unique_ptr<Pipeline> make_nccl_pipeline(const PipelineConfig& cfg, const std::optional<RankInfo>& rank,
                                             const Environment& env) {
  SF_CHECK(cfg.device == Device::CUDA, "--transport nccl moves GPU tensors: use --device cuda, or --transport local "
                                       "(or mpi) on the CPU");
#ifdef STATEFLOW_HAVE_NCCL
  std::vector<std::unique_ptr<Transport>> endpoints;
  if (!rank) {
    check_one_replica(cfg, "nccl (one process, every GPU)");
    endpoints = make_nccl_transports(cfg.stages, cfg.timeout_s);
    return std::make_unique<Pipeline>(cfg, std::move(endpoints));
  }
  const ProcessGrid grid = make_grid(rank->world_size, cfg.stages, cfg.data_parallel);
  bool by_mpi = false;
#ifdef STATEFLOW_HAVE_MPI
  by_mpi = launched_by_mpirun(env);
#endif
  const std::string address = rendezvous_address(g_flags.rendezvous, env);
  std::cerr << "stateflow: rank " << rank->rank << " of " << rank->world_size << " from " << rank->source << ", GPU "
            << rank->local_rank << ", NCCL id by " << (by_mpi ? std::string("MPI") : "TCP rendezvous at " + address)
            << std::endl;
  auto share_id = [&](const std::string& id) {
#ifdef STATEFLOW_HAVE_MPI
    if (by_mpi) return mpi_broadcast_from_rank0(id, rank->rank, cfg.timeout_s);
#endif
    return rendezvous_broadcast(address, rank->rank, rank->world_size, id, cfg.timeout_s);
  };
  if (grid.replicas > 1)
    return make_grid_pipeline(cfg, make_nccl_grid_transports(rank->rank, rank->world_size, rank->local_rank,
                                                             cfg.stages, grid.replicas, cfg.timeout_s, share_id));
  endpoints.push_back(make_nccl_transport(rank->rank, rank->world_size, rank->local_rank, cfg.timeout_s, share_id));
  return std::make_unique<Pipeline>(cfg, std::move(endpoints));
#else
  (void)rank, (void)env;
  fail("this stateflow was built without NCCL: rebuild with CUDA and NCCL (nccl.h and libnccl, from the libnccl-dev "
       "package or NVIDIA's NCCL; point CMake at it with -DNCCL_ROOT=DIR), or use --transport local");
#endif
}

}  // namespace

void set_launch_flags(const LaunchFlags& flags) { g_flags = flags; }

TransportChoice choose_transport(const std::string& requested, Device device, int stages, int gpus,
                                 int launched_world) {
  if (requested != "auto") return {requested, ""};
  if (device != Device::CUDA) return {"local", ""};
  if (launched_world > 1 && gpus > 0)
    return {"nccl", cat("a launcher started ", launched_world, " ranks: one process per GPU")};
  if (stages > 1 && gpus >= stages) return {"nccl", cat(stages, " stages on ", gpus, " GPUs, one process")};
  if (stages > 1)
    return {"local", gpus == 0 ? "this stateflow has no NCCL: every stage on GPU 0"
                               : cat("only ", gpus, " GPU(s) for ", stages, " stages: every stage on GPU 0")};
  return {"local", ""};
}

std::unique_ptr<Pipeline> make_pipeline(const PipelineConfig& cfg, const std::string& transport) {
  // Only NCCL uses a launcher's rank: other runs ignore RANK and the like.
  const bool may_use_nccl = cfg.device == Device::CUDA && (transport == "auto" || transport == "nccl");
  const Environment env = may_use_nccl ? process_environment() : Environment{};
  const std::optional<RankInfo> rank = may_use_nccl ? detect_rank(g_flags.rank, env) : std::nullopt;
  const TransportChoice choice =
      choose_transport(transport, cfg.device, cfg.stages, nccl_gpus(), rank ? rank->world_size : 0);
  static bool said = false;  // verify builds several pipelines: say it once
  if (!choice.why.empty() && !said && (!rank || rank->rank == 0))
    std::cerr << "stateflow: --transport auto chose " << choice.name << " (" << choice.why << ")" << std::endl;
  said = true;
  SF_CHECK(!cfg.split_sms || choice.name == "local", "--sm-split shares GPU 0 between the stages of this process, but ",
           "the ", choice.name, " transport was chosen (", choice.why.empty() ? "asked for" : choice.why,
           "): add --transport local, or leave out --sm-split to give each stage a GPU of its own");
  if (choice.name == "local") {
    check_one_replica(cfg, "local");
    return make_local_pipeline(cfg);
  }
  if (choice.name == "nccl") return make_nccl_pipeline(cfg, rank, env);
  if (choice.name == "mpi") {
    SF_CHECK(cfg.device == Device::CPU,
             "--transport mpi sends host tensors only: use --device cpu with mpi, or --transport nccl on GPUs");
#ifdef STATEFLOW_HAVE_MPI
    return make_grid_pipeline(cfg, make_mpi_grid_transports(cfg.stages, cfg.data_parallel, cfg.timeout_s));
#else
    fail("this stateflow was built without MPI; install libopenmpi-dev and rebuild, or use --transport local");
#endif
  }
  fail("unknown transport '", transport, "'; use auto, local (threads, one process), mpi (CPU, launch with mpirun -n ",
       "P) or nccl (GPUs)");
}

bool is_reporting_rank(const Pipeline& p) { return p.first_rank() == 0 && p.replica() == 0; }

}  // namespace stateflow
