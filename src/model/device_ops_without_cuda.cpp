// CPU-only builds: no parameter lives on a GPU, so these are unreachable; they name the fix.
#include "model/device_ops.h"

namespace stateflow {

[[noreturn]] static void no_cuda() { fail("this build has no CUDA support: rebuild with nvcc found by CMake"); }

void init_device(Device d) {
  if (d != Device::CPU) no_cuda();
}

int use_gpu_sm_partition(int, int) { no_cuda(); }
void synchronize_gpu_thread() { no_cuda(); }
// Without CUDA nothing is shared (a host-backed test device keeps separate bf16 copies).
void share_bf16_copies(const std::vector<Param*>&) {}
bool& bf16_group_shared_for_thread(int) {
  thread_local bool shared = false;
  return shared;
}
void refresh_bf16_copy(Param&) { no_cuda(); }
void adamw_update_device(Param&, Tensor&, Tensor&, double, double, const AdamWConfig&, int64_t) { no_cuda(); }
double sq_sum_device(const std::vector<const Tensor*>&) { no_cuda(); }
void scale_device(Tensor&, double) { no_cuda(); }

}  // namespace stateflow
