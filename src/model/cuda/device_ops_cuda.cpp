#include "model/device_ops.h"

#include <cuda_bf16.h>

#include <map>

#include "kernels/cuda/adamw_cuda.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/elementwise_cuda.h"
#include "kernels/cuda/gemm_cuda.h"
#include "kernels/cuda/levers.h"
#include "kernels/cuda/sm_partition_cuda.h"

namespace stateflow {

namespace {
// Where p's bf16 copy lives: its own [rows, cols], or its columns of a shared matrix (ld wider).
struct Bf16Copy {
  __nv_bfloat16* p = nullptr;
  int64_t cols = 0, ld = 0;
};
Bf16Copy bf16_copy_of(Param& p) {
  if (!p.value_bf16.defined()) return {};
  const int64_t cols = p.value.ndim() == 2 ? p.value.dim(1) : p.value.numel();
  auto* base = reinterpret_cast<__nv_bfloat16*>(p.value_bf16.data<BF16>());
  return {base + p.bf16_col, cols, p.bf16_ld > 0 ? p.bf16_ld : cols};
}
}  // namespace

bool& bf16_group_shared_for_thread(int group) {
  thread_local bool gdn_in_proj = !lever_off("fused_proj"), mlp_up_proj = !lever_off("fused_mlp");
  SF_CHECK(group == kGdnInProj || group == kMlpUpProj, "bf16 group ", group, " is none of model/device_ops.h's");
  return group == kGdnInProj ? gdn_in_proj : mlp_up_proj;
}

void share_bf16_copies(const std::vector<Param*>& params) {
  std::map<int, std::vector<Param*>> groups;
  for (Param* p : params)
    if (p->bf16_group > 0 && p->value_bf16.defined()) groups[p->bf16_group].push_back(p);
  for (auto& [group, members] : groups) {
    if (members.size() < 2 || !bf16_group_shared_for_thread(group)) continue;
    const int64_t rows = members[0]->value.dim(0);
    int64_t width = 0;
    for (const Param* p : members) {
      SF_CHECK(p->value.ndim() == 2 && p->value.dim(0) == rows, "share_bf16_copies: ", p->name, " has shape ",
               shape_str(p->value.shape()), ", but the params of its bf16 group have ", rows, " rows");
      width += p->value.dim(1);
    }
    const Tensor shared = Tensor::uninitialized({rows, width}, DType::BF16, MemCategory::Weights, Device::CUDA);
    int64_t col = 0;
    for (Param* p : members) {
      p->value_bf16 = shared, p->bf16_col = col, p->bf16_ld = width;
      col += p->value.dim(1);
      refresh_bf16_copy(*p);
    }
  }
}

void refresh_bf16_copy(Param& p) {
  const Bf16Copy c = bf16_copy_of(p);
  if (!c.p) return;
  cast_to_bf16_cuda(p.value.data<float>(), c.p, p.value.numel(), cublas_for_thread().stream(), c.cols, c.ld);
  synchronize_thread_stream();  // a load or a build: whichever thread runs the GEMMs next sees it
}

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
  const Bf16Copy copy = bf16_copy_of(p);
  adamw_update_cuda(p.value.data<float>(), p.grad.data<float>(), m.data<float>(), v.data<float>(), p.value.numel(), lr,
                    decay, cfg, step, copy.p, cublas_for_thread().stream(), copy.cols, copy.ld);
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
