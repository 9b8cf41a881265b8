#include "model/param.h"

namespace stateflow {

Param make_param(const std::string& name, const Shape& shape, DType dtype) {
  return Param{name, Tensor::zeros(shape, dtype, MemCategory::Weights),
               Tensor::zeros(shape, dtype, MemCategory::Grads)};
}

void move_param_to(Param& p, Device d) {
  if (p.value.device() == d) return;
  SF_CHECK(d == Device::CPU || p.value.dtype() == DType::F32, "parameter ", p.name, " is ",
           dtype_name(p.value.dtype()), ": GPU master weights are f32, use --dtype f32 with --device cuda");
  p.value_bf16 = p.gemm_operand && d != Device::CPU ? p.value.cast(DType::BF16).to(d, MemCategory::Weights) : Tensor();
  p.value = p.value.to(d, MemCategory::Weights);
  p.grad = Tensor::zeros(p.grad.shape(), p.grad.dtype(), MemCategory::Grads, d);
}

}  // namespace stateflow

#include "core/rng.h"

namespace stateflow {

void fill_normal(Tensor& t, Rng& rng, double std) {
  dispatch_float(t.dtype(), [&](auto z) {
    using T = decltype(z);
    T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<T>(std * rng.normal());
  });
}

void fill_constant(Tensor& t, double value) {
  dispatch_float(t.dtype(), [&](auto z) {
    using T = decltype(z);
    T* p = t.data<T>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<T>(value);
  });
}

}  // namespace stateflow
