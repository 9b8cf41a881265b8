#include "mixers/sdecay/sdecay_layer.h"

#include <cmath>

#include "core/rng.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/gemm.h"
#include "mixers/sdecay/sdecay_core.h"

namespace stateflow {

namespace {
struct SdecayStash : Stash {
  Tensor x, q, k, v, a, g;  // layer input, projections, log-decay
  State state_in;           // what entered the chunk (empty = zeros)
  Tensor o;                 // recurrence output
};

}  // namespace

ScalarDecayAttention::ScalarDecayAttention(const std::string& p, const ModelConfig& cfg, DType dt, Rng& rng)
    : D_(cfg.d_model), H_(sdecay_config(cfg).heads), dk_(sdecay_config(cfg).head_dk),
      dv_(sdecay_config(cfg).head_dv), Wq_(make_param(p + ".Wq", {D_, H_ * dk_}, dt)),
      Wk_(make_param(p + ".Wk", {D_, H_ * dk_}, dt)), Wv_(make_param(p + ".Wv", {D_, H_ * dv_}, dt)),
      Wa_(make_param(p + ".Wa", {D_, H_}, dt)), A_log_(make_param(p + ".A_log", {H_}, dt)),
      dt_bias_(make_param(p + ".dt_bias", {H_}, dt)), Wo_(make_param(p + ".Wo", {H_ * dv_, D_}, dt)) {
  for (Param* w : {&Wq_, &Wk_, &Wv_, &Wa_}) fill_normal(w->value, rng, 1.0 / std::sqrt(double(D_)));
  dispatch_float(dt, [&](auto zero) {
    using T = decltype(zero);
    for (int64_t h = 0; h < H_; ++h) {  // decay rates spread over heads, as GDN's
      A_log_.value.data<T>()[h] = static_cast<T>(std::log(rng.uniform(1.0, 16.0)));
      const double dtv = std::exp(rng.uniform(std::log(1e-3), std::log(1e-1)));
      dt_bias_.value.data<T>()[h] = static_cast<T>(dtv + std::log(-std::expm1(-dtv)));  // softplus^-1
    }
  });
  fill_normal(Wo_.value, rng, 1.0 / std::sqrt(double(H_ * dv_)) / std::sqrt(2.0 * cfg.num_blocks()));
  for (Param* w : {&Wq_, &Wk_, &Wv_, &Wa_, &Wo_}) w->gemm_operand = true;
}

std::vector<Param*> ScalarDecayAttention::params() { return {&Wq_, &Wk_, &Wv_, &Wa_, &A_log_, &dt_bias_, &Wo_}; }

template <class T>
Tensor ScalarDecayAttention::forward_impl(const ChunkCtx& ctx, const Tensor& x, const State& state_in,
                                          State& state_out, std::unique_ptr<Stash>& stash) {
  SF_CHECK(state_in.size() <= 1, "sdecay: boundary state has ", state_in.size(), " tensors, expected 1");
  const int64_t rows = x.dim(0), B = ctx.batch, L = rows / B;
  SF_CHECK(B * L == rows && L == ctx.len, "sdecay: input has ", rows, " rows, expected batch ", B, " x len ", ctx.len);
  const DType dt = x.dtype();
  auto s = std::make_unique<SdecayStash>();
  s->x = x, s->state_in = state_in;
  auto proj = [&](Param& W, int64_t out) {
    Tensor y = Tensor::zeros({rows, out}, dt);
    linear_forward<T>(x.data<T>(), W.value.data<T>(), y.data<T>(), rows, D_, out);
    return y;
  };
  s->q = proj(Wq_, H_ * dk_), s->k = proj(Wk_, H_ * dk_), s->v = proj(Wv_, H_ * dv_), s->a = proj(Wa_, H_);
  s->g = Tensor::zeros({rows, H_}, dt);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < H_; ++h)
      s->g.data<T>()[r * H_ + h] =
          -std::exp(A_log_.value.data<T>()[h]) * softplus(s->a.data<T>()[r * H_ + h] + dt_bias_.value.data<T>()[h]);
  {
    CategoryScope boundary(MemCategory::BoundaryState);
    state_out.assign(1, Tensor::zeros({B, H_, dv_, dk_}, dt));
  }
  s->o = Tensor::zeros({rows, H_ * dv_}, dt);
  const SdecayDims d{B, L, H_, dk_, dv_, 1.0 / std::sqrt(double(dk_))};
  sdecay_forward<T>(d, s->q.data<T>(), s->k.data<T>(), s->v.data<T>(), s->g.data<T>(), state_ptr<T>(state_in, 0),
                    s->o.data<T>(), state_out[0].data<T>());
  Tensor out = Tensor::zeros({rows, D_}, dt);
  linear_forward<T>(s->o.data<T>(), Wo_.value.data<T>(), out.data<T>(), rows, H_ * dv_, D_);
  stash = std::move(s);
  return out;
}

template <class T>
Tensor ScalarDecayAttention::backward_impl(const ChunkCtx& ctx, const Tensor& dout, const State& dstate_out,
                                           State& dstate_in, Stash& stash) {
  SF_CHECK(dstate_out.size() <= 1, "sdecay: boundary-state gradient has ", dstate_out.size(), " tensors, expected 1");
  auto& s = static_cast<SdecayStash&>(stash);
  const int64_t rows = dout.dim(0), B = ctx.batch, L = rows / B, HK = H_ * dk_, HV = H_ * dv_;
  const DType dt = dout.dtype();
  Tensor d_o = Tensor::zeros({rows, HV}, dt);
  linear_backward_weight<T>(s.o.data<T>(), dout.data<T>(), Wo_.grad.data<T>(), rows, HV, D_);
  linear_backward_data<T>(dout.data<T>(), Wo_.value.data<T>(), d_o.data<T>(), rows, HV, D_);
  {
    CategoryScope boundary(MemCategory::BoundaryState);
    dstate_in.assign(1, Tensor::zeros({B, H_, dv_, dk_}, dt));
  }
  Tensor dq = Tensor::zeros({rows, HK}, dt), dk = Tensor::zeros({rows, HK}, dt), dv = Tensor::zeros({rows, HV}, dt);
  Tensor dg = Tensor::zeros({rows, H_}, dt), da = Tensor::zeros({rows, H_}, dt);
  const SdecayDims d{B, L, H_, dk_, dv_, 1.0 / std::sqrt(double(dk_))};
  sdecay_backward<T>(d, s.q.data<T>(), s.k.data<T>(), s.v.data<T>(), s.g.data<T>(), state_ptr<T>(s.state_in, 0),
                     d_o.data<T>(), state_ptr<T>(dstate_out, 0), dq.data<T>(), dk.data<T>(), dv.data<T>(),
                     dg.data<T>(), dstate_in[0].data<T>());
  // g = -exp(A_log) softplus(a + dt_bias): dg/dA_log = g, dg/da = dg/d dt_bias = -exp(A_log) sigmoid(a + dt_bias).
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < H_; ++h) {
      const int64_t i = r * H_ + h;
      const T rate = std::exp(A_log_.value.data<T>()[h]);
      da.data<T>()[i] = -dg.data<T>()[i] * rate * sigmoid(s.a.data<T>()[i] + dt_bias_.value.data<T>()[h]);
      A_log_.grad.data<T>()[h] += dg.data<T>()[i] * s.g.data<T>()[i];
      dt_bias_.grad.data<T>()[h] += da.data<T>()[i];
    }
  Tensor dx = Tensor::zeros({rows, D_}, dt);
  auto proj_back = [&](Param& W, const Tensor& dY, int64_t out) {
    linear_backward_weight<T>(s.x.data<T>(), dY.data<T>(), W.grad.data<T>(), rows, D_, out);
    linear_backward_data<T>(dY.data<T>(), W.value.data<T>(), dx.data<T>(), rows, D_, out);
  };
  proj_back(Wq_, dq, HK), proj_back(Wk_, dk, HK), proj_back(Wv_, dv, HV), proj_back(Wa_, da, H_);
  return dx;
}

}  // namespace stateflow
