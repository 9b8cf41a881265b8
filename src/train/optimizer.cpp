#include "train/optimizer.h"

#include <cmath>
#include <set>

#include "train/device_ops.h"

namespace stateflow {

void AdamWConfig::validate() const {
  SF_CHECK(beta1 >= 0 && beta1 < 1, "AdamW beta1 = ", beta1, " must be in [0, 1)");
  SF_CHECK(beta2 >= 0 && beta2 < 1, "AdamW beta2 = ", beta2, " must be in [0, 1)");
  SF_CHECK(eps > 0 && std::isfinite(eps), "AdamW eps = ", eps, " must be positive");
  SF_CHECK(weight_decay >= 0 && std::isfinite(weight_decay), "AdamW weight_decay = ", weight_decay,
           " must be >= 0");
}

bool takes_weight_decay(const Param& p) { return p.value.ndim() >= 2; }

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

template <class T>
static void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, double lr, double decay,
                         const AdamWConfig& c, double bias1, double bias2) {
  for (int64_t i = 0; i < n; ++i) {
    double gi = g[i];
    double mi = c.beta1 * m[i] + (1 - c.beta1) * gi;
    double vi = c.beta2 * v[i] + (1 - c.beta2) * gi * gi;
    double pi = p[i] * (1 - lr * decay);
    p[i] = static_cast<T>(pi - lr * (mi / bias1) / (std::sqrt(vi / bias2) + c.eps));
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
  }
}

void AdamW::step(double lr) {
  SF_CHECK(lr >= 0 && std::isfinite(lr), "learning rate ", lr, " must be finite and >= 0");
  ++steps_;
  double bias1 = 1 - std::pow(cfg_.beta1, static_cast<double>(steps_));
  double bias2 = 1 - std::pow(cfg_.beta2, static_cast<double>(steps_));
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
                      decay, cfg_, bias1, bias2);
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
