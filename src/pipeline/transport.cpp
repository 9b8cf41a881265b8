#include "pipeline/transport.h"

namespace stateflow {

std::string describe(const MessageTag& t) {
  return cat(t.payload == Payload::Activation ? "activation of F(" : "gradient of B(", t.microbatch, ",", t.chunk,
             ")");
}

void check_arrival(const Tensor& t, const MessageSpec& spec, int peer, const MessageTag& tag) {
  auto what = [](const Shape& s, DType d, Device dev) {
    return cat(dtype_name(d), " ", shape_str(s), " on ", device_name(dev));
  };
  SF_CHECK(t.shape() == spec.shape && t.dtype() == spec.dtype && t.device() == spec.device, "the ", describe(tag),
           " from stage ", peer, " arrived as ", what(t.shape(), t.dtype(), t.device()), " but the receiver expects ",
           what(spec.shape, spec.dtype, spec.device),
           "; both stages must run the same stateflow with the same model, batch, chunk and device settings");
}

void Transport::start_all_reduce_sum(const std::vector<Tensor>&, const std::string& what) {
  fail("the ", name(), " transport cannot sum the ", what, " over data-parallel replicas: use one process per rank ",
       "(--transport mpi on the CPU, nccl on GPUs)");
}

}  // namespace stateflow
