#include "model/param.h"

namespace stateflow {

Param make_param(const std::string& name, const Shape& shape, DType dtype) {
  return Param{name, Tensor::zeros(shape, dtype, MemCategory::Weights),
               Tensor::zeros(shape, dtype, MemCategory::Grads)};
}

}  // namespace stateflow
