#include "model/optimizer.h"

#include <cmath>
#include <set>

#include "kernels/cpu/adamw.h"
#include "model/device_ops.h"

namespace stateflow {

bool takes_weight_decay(const Param& p) { return p.weight_decay && p.value.ndim() >= 2; }

AdamW::AdamW(std::vector<Param*> params, AdamWConfig cfg) : params_(std::move(params)), cfg_(cfg) {
  cfg_.validate();
  std::set<const Param*> seen;
  for (const Param* p : params_) {
    SF_CHECK(p != nullptr, "AdamW was given a null parameter");
    SF_CHECK(seen.insert(p).second, "parameter ", p->name, " was given to AdamW twice: it would be updated twice");
    SF_CHECK(p->value.defined() && p->grad.defined(), "parameter ", p->name, " has no value or grad tensor");
    SF_CHECK(p->value.dtype() == DType::F32 || p->value.dtype() == DType::F64, "parameter ", p->name, " is ",
             dtype_name(p->value.dtype()), ": AdamW updates f32 or f64 parameters");
    SF_CHECK(p->grad.shape() == p->value.shape() && p->grad.dtype() == p->value.dtype(), "parameter ", p->name,
             ": grad ", shape_str(p->grad.shape()), " ", dtype_name(p->grad.dtype()), " does not match value ",
             shape_str(p->value.shape()), " ", dtype_name(p->value.dtype()));
    m_.push_back(Tensor::zeros(p->value.shape(), p->value.dtype(), MemCategory::Optimizer, p->value.device()));
    v_.push_back(Tensor::zeros(p->value.shape(), p->value.dtype(), MemCategory::Optimizer, p->value.device()));
  }
}

void AdamW::step(double lr) {
  SF_CHECK(lr >= 0 && std::isfinite(lr), "learning rate ", lr, " must be finite and >= 0");
  ++steps_;
  for (size_t i = 0; i < params_.size(); ++i) {
    Param& p = *params_[i];
    double decay = takes_weight_decay(p) ? cfg_.weight_decay : 0.0;
    if (!p.value.on_host()) {
      adamw_update_device(p, m_[i], v_[i], lr, decay, cfg_, steps_);
      continue;
    }
    dispatch_float(p.value.dtype(), [&](auto z) {
      using T = decltype(z);
      adamw_update<T>(p.value.data<T>(), p.grad.data<T>(), m_[i].data<T>(), v_[i].data<T>(), p.value.numel(), lr,
                      decay, cfg_, steps_);
    });
  }
}

void AdamW::set_steps(int64_t steps) {
  SF_CHECK(steps >= 0, "optimizer step count ", steps, " must be >= 0");
  steps_ = steps;
}

double grad_sq_sum(const std::vector<Param*>& params) {
  double sum = 0;
  std::vector<const Tensor*> device_grads;  // reduced together: one wait for the GPU, not one per grad
  for (const Param* p : params) {
    if (!p->grad.on_host()) {
      device_grads.push_back(&p->grad);
      continue;
    }
    dispatch_float(p->grad.dtype(), [&](auto z) {
      using T = decltype(z);
      const T* g = p->grad.data<T>();
      for (int64_t i = 0; i < p->grad.numel(); ++i) sum += static_cast<double>(g[i]) * static_cast<double>(g[i]);
    });
  }
  if (!device_grads.empty()) sum += sq_sum_device(device_grads);
  return sum;
}

void scale_grads(std::vector<Param*>& params, double factor) {
  for (Param* p : params) {
    if (!p->grad.on_host()) {
      scale_device(p->grad, factor);
      continue;
    }
    dispatch_float(p->grad.dtype(), [&](auto z) {
      using T = decltype(z);
      T* g = p->grad.data<T>();
      for (int64_t i = 0; i < p->grad.numel(); ++i) g[i] = static_cast<T>(g[i] * factor);
    });
  }
}

double clip_grad_norm(std::vector<Param*>& params, double max_norm) {
  double norm = std::sqrt(grad_sq_sum(params));
  if (max_norm > 0 && std::isfinite(norm) && norm > max_norm) scale_grads(params, max_norm / norm);
  return norm;
}

void zero_grads(std::vector<Param*>& params) {
  for (Param* p : params) p->grad.zero_();
}

}  // namespace stateflow
