#include "pipeline/launch.h"

#ifdef STATEFLOW_HAVE_MPI
#include "pipeline/mpi_transport.h"
#endif

namespace stateflow {

std::unique_ptr<Pipeline> make_pipeline(const PipelineConfig& cfg, const std::string& transport) {
  if (transport == "local") return make_local_pipeline(cfg);
  if (transport == "mpi") {
    SF_CHECK(cfg.device == Device::CPU,
             "--transport mpi sends host tensors only: use --device cpu with mpi, or --transport local on the GPU");
#ifdef STATEFLOW_HAVE_MPI
    std::vector<std::unique_ptr<Transport>> endpoints;
    endpoints.push_back(make_mpi_transport(cfg.timeout_s));
    return std::make_unique<Pipeline>(cfg, std::move(endpoints));
#else
    fail("this stateflow was built without MPI; install libopenmpi-dev and rebuild, or use --transport local");
#endif
  }
  fail("unknown transport '", transport, "'; use local (threads, one process) or mpi (launch with mpirun -n P)");
}

bool is_reporting_rank(const Pipeline& p) { return p.first_rank() == 0; }

}  // namespace stateflow
