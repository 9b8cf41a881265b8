#include "model/residual.h"

#include "kernels/cpu/norms.h"
#include "model/device_path.h"

namespace stateflow {

namespace {
struct ResidualStash : Stash {
  Tensor x, rstd;
  std::unique_ptr<Stash> inner;
};
}  // namespace

PreNormResidual::PreNormResidual(const std::string& prefix, const ModelConfig& cfg, DType dtype,
                                 std::unique_ptr<Layer> inner)
    : norm_(make_param(prefix + ".norm", {cfg.d_model}, dtype)), eps_(cfg.norm_eps), inner_(std::move(inner)) {
  fill_constant(norm_.value, 1.0);
}

std::vector<Param*> PreNormResidual::params() {
  std::vector<Param*> p{&norm_};
  for (Param* q : inner_->params()) p.push_back(q);
  return p;
}

Tensor PreNormResidual::forward(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                                std::unique_ptr<Stash>& stash) {
  if (!x.on_host()) return device_path("prenorm_residual").forward(*this, ctx, x, state_in, state_out, stash);
  auto s = std::make_unique<ResidualStash>();
  const int64_t rows = x.dim(0), D = x.dim(1);
  s->x = x;
  s->rstd = Tensor::zeros({rows}, x.dtype());
  Tensor h = Tensor::zeros({rows, D}, x.dtype());
  dispatch_float(x.dtype(), [&](auto z) {
    using T = decltype(z);
    rmsnorm_forward<T>(x.data<T>(), norm_.value.data<T>(), h.data<T>(), s->rstd.data<T>(), rows, D, eps_);
  });
  Tensor y = inner_->forward(ctx, h, state_in, state_out, s->inner);
  y.add_(x);
  stash = std::move(s);
  return y;
}

Tensor PreNormResidual::backward(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                                 Stash& stash) {
  if (!dy.on_host()) return device_path("prenorm_residual").backward(*this, ctx, dy, dstate_out, dstate_in, stash);
  auto& s = static_cast<ResidualStash&>(stash);
  Tensor dh = inner_->backward(ctx, dy, dstate_out, dstate_in, *s.inner);
  s.inner.reset();  // release the inner activations before allocating dx
  const int64_t rows = dy.dim(0), D = dy.dim(1);
  Tensor dx = Tensor::zeros({rows, D}, dy.dtype());
  dispatch_float(dy.dtype(), [&](auto z) {
    using T = decltype(z);
    rmsnorm_backward<T>(s.x.data<T>(), norm_.value.data<T>(), s.rstd.data<T>(), dh.data<T>(), dx.data<T>(),
                        norm_.grad.data<T>(), rows, D);
  });
  dx.add_(dy);
  return dx;
}

}  // namespace stateflow
