// A trainable parameter: its value and the gradient accumulated over every unit of a step.
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"

namespace stateflow {

struct Param {
  std::string name;  // e.g. "blocks.3.mixer.Wq": stable, used in checkpoints and reports
  Tensor value;      // MemCategory::Weights
  Tensor grad;       // MemCategory::Grads, same shape
};

// Creates value and grad with the given shape; values are filled by the caller.
Param make_param(const std::string& name, const Shape& shape, DType dtype);

}  // namespace stateflow

namespace stateflow {
class Rng;
// Initialisers used by the layers' constructors.
void fill_normal(Tensor& t, Rng& rng, double std);
void fill_constant(Tensor& t, double value);
}  // namespace stateflow
