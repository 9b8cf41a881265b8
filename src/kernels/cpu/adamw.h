// AdamW's update of one tensor (decoupled weight decay), the formula the GPU kernel
// (kernels/cuda/adamw_cuda.h) reproduces bitwise:
//   m = beta1*m + (1-beta1)*g            v = beta2*v + (1-beta2)*g^2
//   p = p*(1 - lr*decay) - lr * (m/(1-beta1^t)) / (sqrt(v/(1-beta2^t)) + eps)
// in double, stored back in T. The optimizer over a model's parameters is model/optimizer.h.
#pragma once
#include <cstdint>

namespace stateflow {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  void validate() const;  // throws Error naming the bad field
};

// `decay` is the weight decay this tensor takes; `step` counts from 1.
template <class T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, double lr, double decay, const AdamWConfig& c,
                  int64_t step);

}  // namespace stateflow
