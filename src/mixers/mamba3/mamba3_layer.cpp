#include "mixers/mamba3/mamba3_layer.h"

#include <cmath>

#include "core/rng.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/norms.h"
#include "mixers/mamba3/mamba3_core.h"
#include "mixers/mamba3/mamba3_ops.h"
#include "mixers/mamba3/mamba3_stash.h"

namespace stateflow {

namespace {

template <class T> T* mut_or_null(Tensor& t) { return t.defined() ? t.data<T>() : nullptr; }

}  // namespace

Mamba3Mixer::Mamba3Mixer(const std::string& p, const ModelConfig& model, DType dt, Rng& rng)
    : cfg_(mamba3_config(model)), D_(model.d_model), H_(cfg_.heads), P_(cfg_.head_dim), N_(cfg_.state_size),
      R_(cfg_.rank), G_(cfg_.groups), NA_(cfg_.angles()), norm_eps_(model.norm_eps) {
  const int64_t HP = H_ * P_, BC = R_ * G_ * N_;
  Wz_ = make_param(p + ".Wz", {D_, HP}, dt), Wx_ = make_param(p + ".Wx", {D_, HP}, dt);
  WB_ = make_param(p + ".WB", {D_, BC}, dt), WC_ = make_param(p + ".WC", {D_, BC}, dt);
  Wdt_ = make_param(p + ".Wdt", {D_, H_}, dt), WA_ = make_param(p + ".WA", {D_, H_}, dt);
  Wtrap_ = make_param(p + ".Wtrap", {D_, H_}, dt), Wang_ = make_param(p + ".Wang", {D_, NA_}, dt);
  dt_bias_ = make_param(p + ".dt_bias", {H_}, dt);
  B_norm_ = make_param(p + ".B_norm", {N_}, dt), C_norm_ = make_param(p + ".C_norm", {N_}, dt);
  B_bias_ = make_param(p + ".B_bias", {H_, R_, N_}, dt), C_bias_ = make_param(p + ".C_bias", {H_, R_, N_}, dt);
  D_skip_ = make_param(p + ".D", {H_}, dt);
  Wo_ = make_param(p + ".Wo", {HP, D_}, dt);
  if (R_ > 1) {
    mimo_x_ = make_param(p + ".mimo_x", {H_, R_, P_}, dt);
    mimo_z_ = make_param(p + ".mimo_z", {H_, R_, P_}, dt);
    mimo_o_ = make_param(p + ".mimo_o", {H_, R_, P_}, dt);
    // As the reference: X and the output start as the means over ranks, the gate as SISO's.
    fill_constant(mimo_x_.value, 1.0 / double(R_));
    fill_constant(mimo_z_.value, 1.0);
    fill_constant(mimo_o_.value, 1.0 / double(R_));
  }
  if (cfg_.output_norm) {
    out_norm_ = make_param(p + ".out_norm", {P_}, dt);
    fill_constant(out_norm_.value, 1.0);
  }
  const double in_std = 1.0 / std::sqrt(double(D_));
  for (Param* w : {&Wz_, &Wx_, &WB_, &WC_, &Wdt_, &WA_, &Wtrap_, &Wang_}) fill_normal(w->value, rng, in_std);
  // Step sizes spread over heads: dt log-uniform in [dt_min, dt_max] (by default [1e-3, 1e-1], as GDN,
  // Mamba-2 and the Mamba-3 reference).
  dispatch_float(dt, [&](auto zero) {
    using T = decltype(zero);
    for (int64_t h = 0; h < H_; ++h) {
      const double dtv = std::exp(rng.uniform(std::log(cfg_.dt_min), std::log(cfg_.dt_max)));
      dt_bias_.value.data<T>()[h] = static_cast<T>(dtv + std::log(-std::expm1(-dtv)));  // softplus^-1
    }
  });
  for (Param* w : {&B_norm_, &C_norm_, &B_bias_, &C_bias_, &D_skip_}) fill_constant(w->value, 1.0);
  // The B/C biases are [H, R, N] tables of biases: no weight decay, as in the reference.
  B_bias_.weight_decay = C_bias_.weight_decay = false;
  // Residual branch output starts small so the stack is near identity at init.
  fill_normal(Wo_.value, rng, 1.0 / std::sqrt(double(HP)) / std::sqrt(2.0 * double(model.num_blocks())));
  for (Param* w : {&Wz_, &Wx_, &WB_, &WC_, &Wdt_, &WA_, &Wtrap_, &Wang_, &Wo_}) w->gemm_operand = true;
}

std::vector<Param*> Mamba3Mixer::params() {
  std::vector<Param*> ps{&Wz_,      &Wx_,     &WB_,     &WC_,     &Wdt_,    &WA_,     &Wtrap_, &Wang_,
                         &dt_bias_, &B_norm_, &C_norm_, &B_bias_, &C_bias_, &D_skip_, &Wo_};
  if (R_ > 1) ps.insert(ps.end(), {&mimo_x_, &mimo_z_, &mimo_o_});
  if (cfg_.output_norm) ps.push_back(&out_norm_);
  return ps;
}

State Mamba3Mixer::zero_state(int64_t batch, DType dt) const {
  CategoryScope boundary(MemCategory::BoundaryState);
  State s(kStateSize);
  s[kS] = Tensor::zeros({batch, H_, P_, N_}, dt);
  s[kPhi] = Tensor::zeros({batch, H_, NA_}, dt);
  s[kBPrev] = Tensor::zeros({batch, H_, R_, N_}, dt);
  s[kXPrev] = Tensor::zeros({batch, H_, R_, P_}, dt);
  return s;
}

void Mamba3Mixer::check_input(const ChunkCtx& ctx, const Tensor& x, const State& state_in) const {
  SF_CHECK(state_in.empty() || state_in.size() == kStateSize, "mamba3: boundary state has ", state_in.size(),
           " tensors, expected ", int(kStateSize));
  const int64_t rows = x.dim(0), B = ctx.batch;
  SF_CHECK(B >= 1 && rows % B == 0 && rows / B == ctx.len, "mamba3: input has ", rows, " rows, expected batch ", B,
           " x len ", ctx.len);
}

template <class T>
Tensor Mamba3Mixer::forward_impl(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                                 std::unique_ptr<Stash>& stash) {
  check_input(ctx, x, state_in);
  const int64_t rows = x.dim(0), B = ctx.batch, L = rows / B;
  const DType dt = x.dtype();
  const int64_t HP = H_ * P_;
  auto s = std::make_unique<Mamba3Stash>();
  s->x = x;
  s->state_in = state_in;
  auto proj = [&](Param& W, int64_t out) {
    Tensor y = Tensor::zeros({rows, out}, dt);
    linear_forward<T>(x.data<T>(), W.value.data<T>(), y.data<T>(), rows, D_, out);
    return y;
  };
  s->z = proj(Wz_, HP), s->xr = proj(Wx_, HP), s->Bp = proj(WB_, R_ * G_ * N_), s->Cp = proj(WC_, R_ * G_ * N_);
  s->dd_dt = proj(Wdt_, H_), s->dd_A = proj(WA_, H_), s->trap = proj(Wtrap_, H_), s->ang = proj(Wang_, NA_);

  s->dt = Tensor::zeros({rows, H_}, dt), s->adt = Tensor::zeros({rows, H_}, dt), s->lam = Tensor::zeros({rows, H_}, dt);
  mamba3_gates_forward<T>(s->dd_dt.data<T>(), s->dd_A.data<T>(), s->trap.data<T>(), dt_bias_.value.data<T>(),
                          s->dt.data<T>(), s->adt.data<T>(), s->lam.data<T>(), rows, H_, kMamba3AFloor);

  state_out = zero_state(B, dt);
  s->phi = Tensor::zeros({rows, H_, NA_}, dt);
  mamba3_angles_forward<T>(s->ang.data<T>(), s->dt.data<T>(), state_ptr<T>(state_in, kPhi), s->phi.data<T>(),
                           state_out[kPhi].data<T>(), B, L, H_, NA_);

  // B and C: RMSNorm over N, per-head bias, rotation by the cumulative angle
  const int64_t bc_rows = rows * R_ * G_;
  auto rotary_input = [&](const Tensor& raw, Param& norm, Param& bias, Tensor& rstd) {
    Tensor normed = Tensor::zeros({bc_rows, N_}, dt), out = Tensor::zeros({rows, H_, R_, N_}, dt);
    rstd = Tensor::zeros({bc_rows}, dt);
    rmsnorm_forward<T>(raw.data<T>(), norm.value.data<T>(), normed.data<T>(), rstd.data<T>(), bc_rows, N_,
                       norm_eps_);
    mamba3_rotary_bc_forward<T>(normed.data<T>(), bias.value.data<T>(), s->phi.data<T>(), out.data<T>(), rows, H_,
                                R_, G_, N_, NA_);
    return out;
  };
  s->b = rotary_input(s->Bp, B_norm_, B_bias_, s->rstd_B);
  s->c = rotary_input(s->Cp, C_norm_, C_bias_, s->rstd_C);
  s->X = Tensor::zeros({rows, H_, R_, P_}, dt);
  mamba3_expand_x_forward<T>(s->xr.data<T>(), ptr_or_null<T>(mimo_x_.value), s->X.data<T>(), rows, H_, R_, P_);

  const Mamba3Dims d{B, L, H_, R_, P_, N_, cfg_.block_size};
  const Mamba3CoreInputs<T> in{s->X.data<T>(),   s->b.data<T>(),   s->c.data<T>(),         s->adt.data<T>(),
                               s->dt.data<T>(),  s->lam.data<T>(), D_skip_.value.data<T>()};
  s->y = Tensor::zeros({rows, H_, R_, P_}, dt);
  mamba3_chunk_forward<T>(d, in,
                          {state_ptr<T>(state_in, kS), state_ptr<T>(state_in, kXPrev), state_ptr<T>(state_in, kBPrev)},
                          s->y.data<T>(),
                          {state_out[kS].data<T>(), state_out[kXPrev].data<T>(), state_out[kBPrev].data<T>()});

  if (cfg_.output_norm) {  // each head's P channels, per rank, normalised before the gate
    s->yn = Tensor::zeros({rows, H_, R_, P_}, dt), s->rstd_y = Tensor::zeros({rows * H_ * R_}, dt);
    rmsnorm_forward<T>(s->y.data<T>(), out_norm_.value.data<T>(), s->yn.data<T>(), s->rstd_y.data<T>(),
                       rows * H_ * R_, P_, norm_eps_);
  }
  const Tensor& gate_in = cfg_.output_norm ? s->yn : s->y;
  s->o = Tensor::zeros({rows, HP}, dt);
  mamba3_output_gate_forward<T>(gate_in.data<T>(), s->z.data<T>(), ptr_or_null<T>(mimo_z_.value),
                                ptr_or_null<T>(mimo_o_.value), s->o.data<T>(), rows, H_, R_, P_);
  Tensor out = Tensor::zeros({rows, D_}, dt);
  linear_forward<T>(s->o.data<T>(), Wo_.value.data<T>(), out.data<T>(), rows, HP, D_);
  stash = std::move(s);
  return out;
}

template <class T>
Tensor Mamba3Mixer::backward_impl(const ChunkCtx& ctx, const Tensor& dout, const State& dstate_out,
                                  State& dstate_in, Stash& stash) {
  SF_CHECK(dstate_out.empty() || dstate_out.size() == kStateSize, "mamba3: boundary-state gradient has ",
           dstate_out.size(), " tensors, expected ", int(kStateSize));
  auto& s = static_cast<Mamba3Stash&>(stash);
  const int64_t rows = dout.dim(0), B = ctx.batch, L = rows / B;
  const DType dt = dout.dtype();
  const int64_t HP = H_ * P_, BC = R_ * G_ * N_;
  auto zeros = [&](Shape shape) { return Tensor::zeros(shape, dt); };

  // output projection, then the gate and rank combination
  linear_backward_weight<T>(s.o.data<T>(), dout.data<T>(), Wo_.grad.data<T>(), rows, HP, D_);
  Tensor d_o = zeros({rows, HP});
  linear_backward_data<T>(dout.data<T>(), Wo_.value.data<T>(), d_o.data<T>(), rows, HP, D_);
  const Tensor& gate_in = cfg_.output_norm ? s.yn : s.y;
  Tensor dy = zeros({rows, H_, R_, P_}), dz = zeros({rows, HP});
  mamba3_output_gate_backward<T>(gate_in.data<T>(), s.z.data<T>(), ptr_or_null<T>(mimo_z_.value),
                                 ptr_or_null<T>(mimo_o_.value), d_o.data<T>(), dy.data<T>(), dz.data<T>(),
                                 mut_or_null<T>(mimo_z_.grad), mut_or_null<T>(mimo_o_.grad), rows, H_, R_, P_);
  if (cfg_.output_norm) {
    Tensor dyn = std::move(dy);
    dy = zeros({rows, H_, R_, P_});
    rmsnorm_backward<T>(s.y.data<T>(), out_norm_.value.data<T>(), s.rstd_y.data<T>(), dyn.data<T>(), dy.data<T>(),
                        out_norm_.grad.data<T>(), rows * H_ * R_, P_);
  }

  // core: gradients of its inputs and of the edge that entered the chunk
  dstate_in = zero_state(B, dt);
  const Mamba3Dims d{B, L, H_, R_, P_, N_, cfg_.block_size};
  const Mamba3CoreInputs<T> in{s.X.data<T>(),  s.b.data<T>(),   s.c.data<T>(),         s.adt.data<T>(),
                               s.dt.data<T>(), s.lam.data<T>(), D_skip_.value.data<T>()};
  Tensor dX = zeros({rows, H_, R_, P_}), db = zeros({rows, H_, R_, N_}), dc = zeros({rows, H_, R_, N_});
  Tensor dadt = zeros({rows, H_}), ddt = zeros({rows, H_}), dlam = zeros({rows, H_}), dD = zeros({H_});
  mamba3_chunk_backward<T>(
      d, in, {state_ptr<T>(s.state_in, kS), state_ptr<T>(s.state_in, kXPrev), state_ptr<T>(s.state_in, kBPrev)},
      dy.data<T>(),
      {state_ptr<T>(dstate_out, kS), state_ptr<T>(dstate_out, kXPrev), state_ptr<T>(dstate_out, kBPrev)},
      {dX.data<T>(), db.data<T>(), dc.data<T>(), dadt.data<T>(), ddt.data<T>(), dlam.data<T>(), dD.data<T>()},
      {dstate_in[kS].data<T>(), dstate_in[kXPrev].data<T>(), dstate_in[kBPrev].data<T>()});
  for (int64_t h = 0; h < H_; ++h) D_skip_.grad.data<T>()[h] += dD.data<T>()[h];

  Tensor dxr = zeros({rows, HP});
  mamba3_expand_x_backward<T>(s.xr.data<T>(), ptr_or_null<T>(mimo_x_.value), dX.data<T>(), dxr.data<T>(),
                              mut_or_null<T>(mimo_x_.grad), rows, H_, R_, P_);

  // B and C: rotation, biases and norms; both rotations add to the angle's gradient
  Tensor dphi = zeros({rows, H_, NA_});
  auto rotary_input_back = [&](const Tensor& dout_bc, const Tensor& out_bc, const Tensor& raw, const Tensor& rstd,
                               Param& norm, Param& bias) {
    Tensor dnormed = zeros({rows * R_ * G_, N_}), draw = zeros({rows, BC});
    mamba3_rotary_bc_backward<T>(dout_bc.data<T>(), out_bc.data<T>(), s.phi.data<T>(), dnormed.data<T>(),
                                 bias.grad.data<T>(), dphi.data<T>(), rows, H_, R_, G_, N_, NA_);
    rmsnorm_backward<T>(raw.data<T>(), norm.value.data<T>(), rstd.data<T>(), dnormed.data<T>(), draw.data<T>(),
                        norm.grad.data<T>(), rows * R_ * G_, N_);
    return draw;
  };
  Tensor dBp = rotary_input_back(db, s.b, s.Bp, s.rstd_B, B_norm_, B_bias_);
  Tensor dCp = rotary_input_back(dc, s.c, s.Cp, s.rstd_C, C_norm_, C_bias_);

  // the cumulative angle (adds its share of the step-size gradient to ddt), then the gates
  Tensor dang = zeros({rows, NA_});
  mamba3_angles_backward<T>(s.ang.data<T>(), s.dt.data<T>(), dphi.data<T>(), state_ptr<T>(dstate_out, kPhi),
                            dang.data<T>(), ddt.data<T>(), dstate_in[kPhi].data<T>(), B, L, H_, NA_);
  Tensor d_dd_dt = zeros({rows, H_}), d_dd_A = zeros({rows, H_}), dtrap = zeros({rows, H_});
  mamba3_gates_backward<T>(s.dd_dt.data<T>(), s.dd_A.data<T>(), s.trap.data<T>(), dt_bias_.value.data<T>(),
                           ddt.data<T>(), dadt.data<T>(), dlam.data<T>(), d_dd_dt.data<T>(), d_dd_A.data<T>(),
                           dtrap.data<T>(), dt_bias_.grad.data<T>(), rows, H_, kMamba3AFloor);

  // input projections
  Tensor dx = zeros({rows, D_});
  auto proj_back = [&](Param& W, const Tensor& dY, int64_t out) {
    linear_backward_weight<T>(s.x.data<T>(), dY.data<T>(), W.grad.data<T>(), rows, D_, out);
    linear_backward_data<T>(dY.data<T>(), W.value.data<T>(), dx.data<T>(), rows, D_, out);
  };
  proj_back(Wz_, dz, HP), proj_back(Wx_, dxr, HP), proj_back(WB_, dBp, BC), proj_back(WC_, dCp, BC);
  proj_back(Wdt_, d_dd_dt, H_), proj_back(WA_, d_dd_A, H_), proj_back(Wtrap_, dtrap, H_), proj_back(Wang_, dang, NA_);
  return dx;
}

}  // namespace stateflow
