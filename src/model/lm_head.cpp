#include "model/lm_head.h"

#include <cmath>

#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/norms.h"
#include "model/device_path.h"

namespace stateflow {

namespace {
struct HeadStash : Stash {
  Tensor x, rstd, xn;
};
}  // namespace

LmHead::LmHead(const ModelConfig& cfg, DType dtype, Rng& rng)
    : norm_(make_param("final_norm", {cfg.d_model}, dtype)),
      proj_(make_param("lm_head.weight", {cfg.d_model, cfg.vocab_size}, dtype)),
      eps_(cfg.norm_eps) {
  fill_constant(norm_.value, 1.0);
  fill_normal(proj_.value, rng, 1.0 / std::sqrt(double(cfg.d_model)));
  proj_.gemm_operand = true;
}

template <class T>
Tensor LmHead::forward_impl(const ChunkCtx& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) {
  SF_CHECK(ctx.targets.defined() && ctx.targets.numel() == x.dim(0), "lm_head: targets missing or of the wrong size");
  const int64_t rows = x.dim(0), D = x.dim(1), V = proj_.value.dim(1);
  auto s = std::make_unique<HeadStash>();
  s->x = x;
  s->rstd = Tensor::zeros({rows}, x.dtype());
  s->xn = Tensor::zeros({rows, D}, x.dtype());
  rmsnorm_forward<T>(x.data<T>(), norm_.value.data<T>(), s->xn.data<T>(), s->rstd.data<T>(), rows, D, eps_);
  const Tensor xn = s->xn;  // the same storage
  stash = std::move(s);
  if (ctx.recomputing) return Tensor();  // backward recomputes the logits anyway
  Tensor logits = Tensor::zeros({rows, V}, x.dtype());
  linear_forward<T>(xn.data<T>(), proj_.value.data<T>(), logits.data<T>(), rows, D, V);
  LossStats st = cross_entropy_forward<T>(logits.data<T>(), ctx.targets.data<int32_t>(), rows, V);
  if (ctx.stats) ctx.stats->add(st);
  Tensor loss = Tensor::zeros({1}, x.dtype());
  loss.data<T>()[0] = static_cast<T>(st.loss_sum * ctx.loss_scale);
  return loss;
}

template <class T>
Tensor LmHead::backward_impl(const ChunkCtx& ctx, Stash& stash) {
  auto& s = static_cast<HeadStash&>(stash);
  const int64_t rows = s.x.dim(0), D = s.x.dim(1), V = proj_.value.dim(1);
  Tensor logits = Tensor::zeros({rows, V}, s.x.dtype());
  linear_forward<T>(s.xn.data<T>(), proj_.value.data<T>(), logits.data<T>(), rows, D, V);
  Tensor dlogits = Tensor::zeros({rows, V}, s.x.dtype());
  cross_entropy_backward<T>(logits.data<T>(), ctx.targets.data<int32_t>(), static_cast<T>(ctx.loss_scale),
                            dlogits.data<T>(), rows, V);
  logits = Tensor();
  Tensor dxn = Tensor::zeros({rows, D}, s.x.dtype());
  linear_backward_weight<T>(s.xn.data<T>(), dlogits.data<T>(), proj_.grad.data<T>(), rows, D, V);
  linear_backward_data<T>(dlogits.data<T>(), proj_.value.data<T>(), dxn.data<T>(), rows, D, V);
  Tensor dx = Tensor::zeros({rows, D}, s.x.dtype());
  rmsnorm_backward<T>(s.x.data<T>(), norm_.value.data<T>(), s.rstd.data<T>(), dxn.data<T>(), dx.data<T>(),
                      norm_.grad.data<T>(), rows, D);
  return dx;
}

Tensor LmHead::forward(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                       std::unique_ptr<Stash>& stash) {
  if (!x.on_host()) return device_path("lm_head").forward(*this, ctx, x, state_in, state_out, stash);
  return dispatch_float(x.dtype(), [&](auto z) { return forward_impl<decltype(z)>(ctx, x, stash); });
}

Tensor LmHead::backward(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                        Stash& stash) {
  if (!proj_.value.on_host()) return device_path("lm_head").backward(*this, ctx, dy, dstate_out, dstate_in, stash);
  return dispatch_float(static_cast<HeadStash&>(stash).x.dtype(), [&](auto z) { return backward_impl<decltype(z)>(ctx, stash); });
}

}  // namespace stateflow
