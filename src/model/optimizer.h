// AdamW with decoupled weight decay, and the gradient utilities a training step needs
// around it (global-norm clipping, zeroing).
//
// One step, with g the gradient, t the step number counted from 1, lr the step's rate:
//   m = beta1*m + (1-beta1)*g            v = beta2*v + (1-beta2)*g^2
//   p -= lr*wd*p                         (decoupled decay; matrices only, see below)
//   p -= lr * (m/(1-beta1^t)) / (sqrt(v/(1-beta2^t)) + eps)
// The arithmetic is done in double and stored in the parameter's dtype (float or double).
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/adamw.h"
#include "model/param.h"

namespace stateflow {

// Weight decay goes to matrices (ndim >= 2: projections, embeddings) only; vectors such as
// norm scales, biases, A_log and dt_bias are left undecayed, as is usual for these models, and so
// is a matrix-shaped parameter whose layer cleared Param::weight_decay (a table of biases).
bool takes_weight_decay(const Param& p);

class AdamW {
 public:
  // Keeps the pointers (the params must outlive the optimizer) and allocates m and v,
  // zero, in each param's dtype, charged to MemCategory::Optimizer.
  AdamW(std::vector<Param*> params, AdamWConfig cfg);

  // One update of every param from its grad, at learning rate lr (>= 0).
  void step(double lr);

  int64_t steps() const { return steps_; }  // updates done so far
  const AdamWConfig& config() const { return cfg_; }
  const std::vector<Param*>& params() const { return params_; }

  // Optimizer state of params()[i], for checkpoints: read it, or copy_from() into it.
  Tensor& exp_avg(size_t i) { return m_.at(i); }     // m
  Tensor& exp_avg_sq(size_t i) { return v_.at(i); }  // v
  const Tensor& exp_avg(size_t i) const { return m_.at(i); }
  const Tensor& exp_avg_sq(size_t i) const { return v_.at(i); }
  // Restores the step count (it sets the bias correction of the next step).
  void set_steps(int64_t steps);

 private:
  std::vector<Param*> params_;
  AdamWConfig cfg_;
  std::vector<Tensor> m_, v_;
  int64_t steps_ = 0;
};

// Sum of squares of every grad, in double. Split out of clip_grad_norm so that a pipeline
// stage can all-reduce its partial sum before taking the square root.
double grad_sq_sum(const std::vector<Param*>& params);
// grad *= factor for every param.
void scale_grads(std::vector<Param*>& params, double factor);

// Returns the global L2 norm of all grads before clipping; when it exceeds max_norm the
// grads are scaled so that it equals max_norm. max_norm <= 0 disables clipping. A
// non-finite norm is returned as is and the grads are left alone (the caller decides to
// skip the step).
double clip_grad_norm(std::vector<Param*>& params, double max_norm);

void zero_grads(std::vector<Param*>& params);

}  // namespace stateflow
