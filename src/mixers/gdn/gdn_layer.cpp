#include "mixers/gdn/gdn_layer.h"

#include <cmath>

#include "core/rng.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/norms.h"
#include "kernels/cpu/short_conv.h"
#include "mixers/gdn/gdn_core.h"
#include "mixers/gdn/gdn_gates.h"
#include "mixers/gdn/gdn_groups.h"
#include "model/device_ops.h"

namespace stateflow {

namespace {
constexpr double kL2Eps = 1e-6;

struct GdnStash : Stash {
  Tensor x;                         // layer input [rows, D]
  Tensor qp, kp, vp;                // projections before the conv
  Tensor a, b, z;                   // gate and output-gate projections
  State state_in;                   // what entered the chunk (empty = zeros)
  Tensor q, rq, k, rk, v;           // core inputs (q, k L2-normalised) and the L2 rstd
  Tensor g, beta;                   // gates
  Tensor o, rstd_o, y;              // core output, its norm rstd, gated-norm output
};

}  // namespace

GatedDeltaNet::GatedDeltaNet(const std::string& p, const ModelConfig& cfg, DType dt, Rng& rng)
    : GatedDeltaNet(p, cfg, gdn_config(cfg), dt, rng) {}

GatedDeltaNet::GatedDeltaNet(const std::string& p, const ModelConfig& cfg, const GdnConfig& g, DType dt, Rng& rng)
    : D_(cfg.d_model), H_(g.heads), Hv_(g.value_heads), dk_(g.head_dk), dv_(g.head_dv), K_(g.conv_size),
      C_(g.block_size), norm_eps_(cfg.norm_eps), keep_sweep_(g.keep_sweep),
      Wq_(make_param(p + ".Wq", {D_, H_ * dk_}, dt)), Wk_(make_param(p + ".Wk", {D_, H_ * dk_}, dt)),
      Wv_(make_param(p + ".Wv", {D_, Hv_ * dv_}, dt)), Wa_(make_param(p + ".Wa", {D_, Hv_}, dt)),
      Wb_(make_param(p + ".Wb", {D_, Hv_}, dt)), Wg_(make_param(p + ".Wg", {D_, Hv_ * dv_}, dt)),
      conv_q_(make_param(p + ".conv_q", {H_ * dk_, K_}, dt)), conv_k_(make_param(p + ".conv_k", {H_ * dk_, K_}, dt)),
      conv_v_(make_param(p + ".conv_v", {Hv_ * dv_, K_}, dt)), A_log_(make_param(p + ".A_log", {Hv_}, dt)),
      dt_bias_(make_param(p + ".dt_bias", {Hv_}, dt)), out_norm_(make_param(p + ".out_norm", {dv_}, dt)),
      Wo_(make_param(p + ".Wo", {Hv_ * dv_, D_}, dt)) {
  const double in_std = 1.0 / std::sqrt(double(D_));
  for (Param* w : {&Wq_, &Wk_, &Wv_, &Wa_, &Wb_, &Wg_}) fill_normal(w->value, rng, in_std);
  for (Param* c : {&conv_q_, &conv_k_, &conv_v_}) fill_normal(c->value, rng, 1.0 / std::sqrt(double(K_)));
  // Decay rates spread over value heads (as in fla): A in [1, 16], dt in [1e-3, 1e-1] log-uniform.
  dispatch_float(dt, [&](auto zero) {
    using T = decltype(zero);
    for (int64_t h = 0; h < Hv_; ++h) {
      A_log_.value.data<T>()[h] = static_cast<T>(std::log(rng.uniform(1.0, 16.0)));
      double dtv = std::exp(rng.uniform(std::log(1e-3), std::log(1e-1)));
      dt_bias_.value.data<T>()[h] = static_cast<T>(dtv + std::log(-std::expm1(-dtv)));  // softplus^-1
    }
  });
  fill_constant(out_norm_.value, 1.0);
  // Residual branch output starts small so the stack is near identity at init.
  fill_normal(Wo_.value, rng, 1.0 / std::sqrt(double(Hv_ * dv_)) / std::sqrt(2.0 * cfg.num_blocks()));
  for (Param* w : {&Wq_, &Wk_, &Wv_, &Wa_, &Wb_, &Wg_, &Wo_}) w->gemm_operand = true;
  // q, k, v and the output gate project the same x: on the GPU one GEMM (gdn_layer_cuda.cpp)
  for (Param* w : {&Wq_, &Wk_, &Wv_, &Wg_}) w->bf16_group = kGdnInProj;
}

std::vector<Param*> GatedDeltaNet::params() {
  return {&Wq_, &Wk_, &Wv_, &Wa_, &Wb_, &Wg_, &conv_q_, &conv_k_, &conv_v_, &A_log_, &dt_bias_, &out_norm_, &Wo_};
}

template <class T>
Tensor GatedDeltaNet::per_value_head(const Tensor& qk) const {
  if (Hv_ == H_) return qk;
  const int64_t rows = qk.dim(0);
  Tensor out = Tensor::zeros({rows, Hv_ * dk_}, qk.dtype());
  gdn_expand_groups<T>(qk.data<T>(), out.data<T>(), rows, H_, Hv_ / H_, dk_);
  return out;
}

template <class T>
Tensor GatedDeltaNet::sum_over_groups(const Tensor& dqk) const {
  if (Hv_ == H_) return dqk;
  const int64_t rows = dqk.dim(0);
  Tensor out = Tensor::zeros({rows, H_ * dk_}, dqk.dtype());
  gdn_sum_groups<T>(dqk.data<T>(), out.data<T>(), rows, H_, Hv_ / H_, dk_);
  return out;
}

template <class T>
Tensor GatedDeltaNet::forward_impl(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                                   std::unique_ptr<Stash>& stash) {
  SF_CHECK(state_in.empty() || state_in.size() == kStateSize, "gdn: boundary state has ", state_in.size(),
           " tensors, expected ", int(kStateSize));
  const int64_t rows = x.dim(0), B = ctx.batch, L = rows / B;
  SF_CHECK(B * L == rows && L == ctx.len, "gdn: input has ", rows, " rows, expected batch ", B, " x len ", ctx.len);
  const DType dt = x.dtype();
  const int64_t HK = H_ * dk_, HV = Hv_ * dv_;
  auto s = std::make_unique<GdnStash>();
  s->x = x;
  s->state_in = state_in;
  auto proj = [&](Param& W, int64_t out) {
    Tensor y = Tensor::zeros({rows, out}, dt);
    linear_forward<T>(x.data<T>(), W.value.data<T>(), y.data<T>(), rows, D_, out);
    return y;
  };
  s->qp = proj(Wq_, HK), s->kp = proj(Wk_, HK), s->vp = proj(Wv_, HV);
  s->a = proj(Wa_, Hv_), s->b = proj(Wb_, Hv_), s->z = proj(Wg_, HV);

  state_out.assign(kStateSize, Tensor());
  {
    CategoryScope boundary(MemCategory::BoundaryState);
    state_out[kS] = Tensor::zeros({B, Hv_, dv_, dk_}, dt);
    state_out[kPrefixQ] = Tensor::zeros({B, K_ - 1, HK}, dt);
    state_out[kPrefixK] = Tensor::zeros({B, K_ - 1, HK}, dt);
    state_out[kPrefixV] = Tensor::zeros({B, K_ - 1, HV}, dt);
  }
  Tensor qc = Tensor::zeros({rows, HK}, dt), kc = Tensor::zeros({rows, HK}, dt);
  s->v = Tensor::zeros({rows, HV}, dt);
  short_conv_forward<T>(s->qp.data<T>(), state_ptr<T>(state_in, kPrefixQ), conv_q_.value.data<T>(), qc.data<T>(),
                        state_out[kPrefixQ].data<T>(), B, L, HK, K_);
  short_conv_forward<T>(s->kp.data<T>(), state_ptr<T>(state_in, kPrefixK), conv_k_.value.data<T>(), kc.data<T>(),
                        state_out[kPrefixK].data<T>(), B, L, HK, K_);
  short_conv_forward<T>(s->vp.data<T>(), state_ptr<T>(state_in, kPrefixV), conv_v_.value.data<T>(),
                        s->v.data<T>(), state_out[kPrefixV].data<T>(), B, L, HV, K_);

  s->q = Tensor::zeros({rows, HK}, dt), s->k = Tensor::zeros({rows, HK}, dt);
  s->rq = Tensor::zeros({rows * H_}, dt), s->rk = Tensor::zeros({rows * H_}, dt);
  l2norm_forward<T>(qc.data<T>(), s->q.data<T>(), s->rq.data<T>(), rows * H_, dk_, kL2Eps);
  l2norm_forward<T>(kc.data<T>(), s->k.data<T>(), s->rk.data<T>(), rows * H_, dk_, kL2Eps);

  s->g = Tensor::zeros({rows, Hv_}, dt), s->beta = Tensor::zeros({rows, Hv_}, dt);
  gdn_gates_forward<T>(s->a.data<T>(), s->b.data<T>(), A_log_.value.data<T>(), dt_bias_.value.data<T>(),
                       s->g.data<T>(), s->beta.data<T>(), rows, Hv_);

  GdnDims d{B, L, Hv_, dk_, dv_, C_, 1.0 / std::sqrt(double(dk_))};
  s->o = Tensor::zeros({rows, HV}, dt);
  const Tensor q = per_value_head<T>(s->q), k = per_value_head<T>(s->k);
  gdn_chunk_forward<T>(d, q.data<T>(), k.data<T>(), s->v.data<T>(), s->beta.data<T>(), s->g.data<T>(),
                       state_ptr<T>(state_in, kS), s->o.data<T>(), state_out[kS].data<T>());

  s->rstd_o = Tensor::zeros({rows * Hv_}, dt), s->y = Tensor::zeros({rows, HV}, dt);
  gated_rmsnorm_forward<T>(s->o.data<T>(), s->z.data<T>(), out_norm_.value.data<T>(), s->y.data<T>(),
                           s->rstd_o.data<T>(), rows * Hv_, dv_, norm_eps_);
  Tensor out = Tensor::zeros({rows, D_}, dt);
  linear_forward<T>(s->y.data<T>(), Wo_.value.data<T>(), out.data<T>(), rows, HV, D_);
  stash = std::move(s);
  return out;
}

template <class T>
Tensor GatedDeltaNet::backward_impl(const ChunkCtx& ctx, const Tensor& dout, const State& dstate_out,
                                    State& dstate_in, Stash& stash) {
  SF_CHECK(dstate_out.empty() || dstate_out.size() == kStateSize, "gdn: boundary-state gradient has ",
           dstate_out.size(), " tensors, expected ", int(kStateSize));
  auto& s = static_cast<GdnStash&>(stash);
  const int64_t rows = dout.dim(0), B = ctx.batch, L = rows / B;
  const DType dt = dout.dtype();
  const int64_t HK = H_ * dk_, HV = Hv_ * dv_;
  auto zeros = [&](int64_t n, int64_t m) { return Tensor::zeros({n, m}, dt); };

  // output projection and gated norm
  linear_backward_weight<T>(s.y.data<T>(), dout.data<T>(), Wo_.grad.data<T>(), rows, HV, D_);
  Tensor dy = zeros(rows, HV);
  linear_backward_data<T>(dout.data<T>(), Wo_.value.data<T>(), dy.data<T>(), rows, HV, D_);
  Tensor do_ = zeros(rows, HV), dz = zeros(rows, HV);
  gated_rmsnorm_backward<T>(s.o.data<T>(), s.z.data<T>(), out_norm_.value.data<T>(), s.rstd_o.data<T>(),
                            dy.data<T>(), do_.data<T>(), dz.data<T>(), out_norm_.grad.data<T>(), rows * Hv_, dv_);

  // core: gradients of q, k, v, beta, g and of the state that entered the chunk
  dstate_in.assign(kStateSize, Tensor());
  {
    CategoryScope boundary(MemCategory::BoundaryState);
    dstate_in[kS] = Tensor::zeros({B, Hv_, dv_, dk_}, dt);
    dstate_in[kPrefixQ] = Tensor::zeros({B, K_ - 1, HK}, dt);
    dstate_in[kPrefixK] = Tensor::zeros({B, K_ - 1, HK}, dt);
    dstate_in[kPrefixV] = Tensor::zeros({B, K_ - 1, HV}, dt);
  }
  // (per value head: q and k copied to their groups, the gradients summed back)
  GdnDims d{B, L, Hv_, dk_, dv_, C_, 1.0 / std::sqrt(double(dk_))};
  Tensor dqv = zeros(rows, Hv_ * dk_), dkv = zeros(rows, Hv_ * dk_), dv = zeros(rows, HV);
  Tensor dbeta = zeros(rows, Hv_), dg = zeros(rows, Hv_);
  const Tensor q = per_value_head<T>(s.q), k = per_value_head<T>(s.k);
  gdn_chunk_backward<T>(d, q.data<T>(), k.data<T>(), s.v.data<T>(), s.beta.data<T>(), s.g.data<T>(),
                        state_ptr<T>(s.state_in, kS), do_.data<T>(), state_ptr<T>(dstate_out, kS), dqv.data<T>(),
                        dkv.data<T>(), dv.data<T>(), dbeta.data<T>(), dg.data<T>(), dstate_in[kS].data<T>());
  const Tensor dq = sum_over_groups<T>(dqv), dk = sum_over_groups<T>(dkv);

  // gates
  Tensor da = zeros(rows, Hv_), db = zeros(rows, Hv_);
  gdn_gates_backward<T>(s.a.data<T>(), s.b.data<T>(), A_log_.value.data<T>(), dt_bias_.value.data<T>(),
                        dg.data<T>(), dbeta.data<T>(), da.data<T>(), db.data<T>(), A_log_.grad.data<T>(),
                        dt_bias_.grad.data<T>(), rows, Hv_);

  // L2 norms, then the convs (which also route the next chunk's prefix gradient)
  Tensor dqc = zeros(rows, HK), dkc = zeros(rows, HK);
  l2norm_backward<T>(s.q.data<T>(), s.rq.data<T>(), dq.data<T>(), dqc.data<T>(), rows * H_, dk_);
  l2norm_backward<T>(s.k.data<T>(), s.rk.data<T>(), dk.data<T>(), dkc.data<T>(), rows * H_, dk_);
  Tensor dqp = zeros(rows, HK), dkp = zeros(rows, HK), dvp = zeros(rows, HV);
  short_conv_backward<T>(s.qp.data<T>(), state_ptr<T>(s.state_in, kPrefixQ), conv_q_.value.data<T>(),
                         dqc.data<T>(), state_ptr<T>(dstate_out, kPrefixQ), dqp.data<T>(),
                         dstate_in[kPrefixQ].data<T>(), conv_q_.grad.data<T>(), B, L, HK, K_);
  short_conv_backward<T>(s.kp.data<T>(), state_ptr<T>(s.state_in, kPrefixK), conv_k_.value.data<T>(),
                         dkc.data<T>(), state_ptr<T>(dstate_out, kPrefixK), dkp.data<T>(),
                         dstate_in[kPrefixK].data<T>(), conv_k_.grad.data<T>(), B, L, HK, K_);
  short_conv_backward<T>(s.vp.data<T>(), state_ptr<T>(s.state_in, kPrefixV), conv_v_.value.data<T>(),
                         dv.data<T>(), state_ptr<T>(dstate_out, kPrefixV), dvp.data<T>(),
                         dstate_in[kPrefixV].data<T>(), conv_v_.grad.data<T>(), B, L, HV, K_);

  // input projections
  Tensor dx = zeros(rows, D_);
  auto proj_back = [&](Param& W, const Tensor& dY, int64_t out) {
    linear_backward_weight<T>(s.x.data<T>(), dY.data<T>(), W.grad.data<T>(), rows, D_, out);
    linear_backward_data<T>(dY.data<T>(), W.value.data<T>(), dx.data<T>(), rows, D_, out);
  };
  proj_back(Wq_, dqp, HK), proj_back(Wk_, dkp, HK), proj_back(Wv_, dvp, HV);
  proj_back(Wa_, da, Hv_), proj_back(Wb_, db, Hv_), proj_back(Wg_, dz, HV);
  return dx;
}

}  // namespace stateflow
