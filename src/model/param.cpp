#include "model/param.h"

namespace stateflow {

Param make_param(const std::string& name, const Shape& shape, DType dtype) {
  return Param{name, Tensor::zeros(shape, dtype, MemCategory::Weights),
               Tensor::zeros(shape, dtype, MemCategory::Grads)};
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
