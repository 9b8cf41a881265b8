#include "model/device_ops.h"

#include <cuda_bf16.h>

#include "kernels/cuda/adamw_cuda.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/elementwise_cuda.h"
#include "kernels/cuda/sm_partition_cuda.h"

namespace stateflow {

void init_device(Device d) {
  if (d == Device::CUDA) init_cuda_backend();
}

int use_gpu_sm_partition(int part, int parts) {
  init_cuda_backend();
  use_sm_partition(part, parts);
  return sm_count_of_thread();
}

void synchronize_gpu_thread() { synchronize_thread_stream(); }

void adamw_update_device(Param& p, Tensor& m, Tensor& v, double lr, double decay, const AdamWConfig& cfg,
                         int64_t step) {
  auto* bf16_copy = p.value_bf16.defined() ? reinterpret_cast<__nv_bfloat16*>(p.value_bf16.data<BF16>()) : nullptr;
  adamw_update_cuda(p.value.data<float>(), p.grad.data<float>(), m.data<float>(), v.data<float>(), p.value.numel(), lr,
                    decay, cfg, step, bf16_copy, cublas_for_thread().stream());
}

double sq_sum_device(const std::vector<const Tensor*>& ts) {
  std::vector<DeviceFloats> xs;
  for (const Tensor* t : ts) xs.push_back({t->data<float>(), t->numel()});
  return sum_squares_cuda(xs, cublas_for_thread().stream());
}

void scale_device(Tensor& t, double factor) {
  scale_inplace_cuda(t.data<float>(), factor, t.numel(), cublas_for_thread().stream());
}

}  // namespace stateflow
