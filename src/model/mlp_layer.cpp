#include "model/mlp_layer.h"

#include <cmath>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/swiglu.h"
#include "model/device_ops.h"
#include "model/device_path.h"

namespace stateflow {

namespace {
struct MlpStash : Stash {
  Tensor x, a, b, h;
};
}  // namespace

SwiGluMlp::SwiGluMlp(const std::string& prefix, const ModelConfig& cfg, DType dtype, Rng& rng)
    : w1_(make_param(prefix + ".W1", {cfg.d_model, cfg.mlp_hidden}, dtype)),
      w3_(make_param(prefix + ".W3", {cfg.d_model, cfg.mlp_hidden}, dtype)),
      w2_(make_param(prefix + ".W2", {cfg.mlp_hidden, cfg.d_model}, dtype)) {
  fill_normal(w1_.value, rng, 1.0 / std::sqrt(double(cfg.d_model)));
  fill_normal(w3_.value, rng, 1.0 / std::sqrt(double(cfg.d_model)));
  // Residual branch output starts small so the stack is near identity at init.
  fill_normal(w2_.value, rng, 1.0 / std::sqrt(double(cfg.mlp_hidden)) / std::sqrt(2.0 * cfg.num_blocks()));
  for (Param* w : params()) w->gemm_operand = true;
  w1_.bf16_group = w3_.bf16_group = kMlpUpProj;  // x W1 and x W3: on the GPU one GEMM (mlp_layer_cuda.cpp)
}

template <class T>
Tensor SwiGluMlp::forward_impl(const Tensor& x, std::unique_ptr<Stash>& stash) {
  const int64_t rows = x.dim(0), D = w1_.value.dim(0), F = w1_.value.dim(1);
  auto s = std::make_unique<MlpStash>();
  s->x = x;
  s->a = Tensor::zeros({rows, F}, x.dtype());
  s->b = Tensor::zeros({rows, F}, x.dtype());
  s->h = Tensor::zeros({rows, F}, x.dtype());
  Tensor y = Tensor::zeros({rows, D}, x.dtype());
  linear_forward<T>(x.data<T>(), w1_.value.data<T>(), s->a.data<T>(), rows, D, F);
  linear_forward<T>(x.data<T>(), w3_.value.data<T>(), s->b.data<T>(), rows, D, F);
  swiglu_forward<T>(s->a.data<T>(), s->b.data<T>(), s->h.data<T>(), rows * F);
  linear_forward<T>(s->h.data<T>(), w2_.value.data<T>(), y.data<T>(), rows, F, D);
  stash = std::move(s);
  return y;
}

template <class T>
Tensor SwiGluMlp::backward_impl(const Tensor& dy, Stash& stash) {
  auto& s = static_cast<MlpStash&>(stash);
  const int64_t rows = dy.dim(0), D = w1_.value.dim(0), F = w1_.value.dim(1);
  Tensor dh = Tensor::zeros({rows, F}, dy.dtype());
  Tensor da = Tensor::zeros({rows, F}, dy.dtype());
  Tensor db = Tensor::zeros({rows, F}, dy.dtype());
  Tensor dx = Tensor::zeros({rows, D}, dy.dtype());
  linear_backward_weight<T>(s.h.data<T>(), dy.data<T>(), w2_.grad.data<T>(), rows, F, D);
  linear_backward_data<T>(dy.data<T>(), w2_.value.data<T>(), dh.data<T>(), rows, F, D);
  swiglu_backward<T>(s.a.data<T>(), s.b.data<T>(), dh.data<T>(), da.data<T>(), db.data<T>(), rows * F);
  linear_backward_weight<T>(s.x.data<T>(), da.data<T>(), w1_.grad.data<T>(), rows, D, F);
  linear_backward_weight<T>(s.x.data<T>(), db.data<T>(), w3_.grad.data<T>(), rows, D, F);
  linear_backward_data<T>(da.data<T>(), w1_.value.data<T>(), dx.data<T>(), rows, D, F);
  linear_backward_data<T>(db.data<T>(), w3_.value.data<T>(), dx.data<T>(), rows, D, F);
  return dx;
}

Tensor SwiGluMlp::forward(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                          std::unique_ptr<Stash>& stash) {
  if (!x.on_host()) return device_path("mlp").forward(*this, ctx, x, state_in, state_out, stash);
  return dispatch_float(x.dtype(), [&](auto z) { return forward_impl<decltype(z)>(x, stash); });
}

Tensor SwiGluMlp::backward(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                           Stash& stash) {
  if (!dy.on_host()) return device_path("mlp").backward(*this, ctx, dy, dstate_out, dstate_in, stash);
  return dispatch_float(dy.dtype(), [&](auto z) { return backward_impl<decltype(z)>(dy, stash); });
}

}  // namespace stateflow
