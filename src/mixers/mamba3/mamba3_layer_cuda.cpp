// The Mamba-3 mixer on the GPU: the CPU forward_impl/backward_impl (mamba3_layer.cpp) as
// kernel calls. bf16 projections, normalised and rotated B/C, core inputs and outputs; fp32
// gates, angles, norm statistics, boundary state (S, phi, b_prev, x_prev) and every
// gradient that feeds a sum. The core needs P = 64, N = 128 and rank 1, 2 or 4.
#include "core/op_scope.h"
#include "kernels/cuda/gemm_cuda.h"
#include "kernels/cuda/norms_cuda.h"
#include "mixers/mamba3/mamba3_core_cuda.h"
#include "mixers/mamba3/mamba3_layer.h"
#include "mixers/mamba3/mamba3_ops_cuda.h"
#include "mixers/mamba3/mamba3_stash.h"
#include "model/cuda/layer_cuda.h"
#include "model/device_path.h"

namespace stateflow {

namespace {


const float* f32_or_null_param(const Param& p) { return p.value.defined() ? f32_ptr(p.value) : nullptr; }
float* grad_or_null(Param& p) { return p.grad.defined() ? f32_ptr(p.grad) : nullptr; }

}  // namespace

// The four boundary-state tensors (or their gradients) of `batch` sequences, fp32, to be overwritten.
State Mamba3Mixer::device_state(int64_t batch) const {
  CategoryScope boundary(MemCategory::BoundaryState);
  State s(kStateSize);
  s[kS] = f32_out({batch, H_, P_, N_});
  s[kPhi] = f32_out({batch, H_, NA_});
  s[kBPrev] = f32_out({batch, H_, R_, N_});
  s[kXPrev] = f32_out({batch, H_, R_, P_});
  return s;
}

Tensor Mamba3Mixer::forward_cuda(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                                 std::unique_ptr<Stash>& stash) {
  check_input(ctx, x, state_in);
  const int64_t rows = x.dim(0), B = ctx.batch, L = rows / B;
  const Mamba3Dims d{B, L, H_, R_, P_, N_, cfg_.block_size};
  const size_t core_ws = mamba3_cuda_workspace_bytes(d);  // refuses the sizes the GPU core lacks, before any work
  const int64_t HP = H_ * P_, BC = R_ * G_ * N_, bc_rows = rows * R_ * G_;
  const CublasGemm& gemm = cublas_for_thread();
  const cudaStream_t st = gemm.stream();
  auto s = std::make_unique<Mamba3Stash>();
  s->x = x;
  s->state_in = state_in;
  auto proj = [&](const Param& W, int64_t out) {
    Tensor y = bf16_out({rows, out});
    linear_forward_cuda<bf16, bf16>(gemm, bf16_ptr(x), bf16_ptr(W.value_bf16), bf16_ptr(y), rows, D_, out, B);
    return y;
  };
  {
    OpScope part("mamba3.in_proj");
    s->z = proj(Wz_, HP), s->xr = proj(Wx_, HP), s->Bp = proj(WB_, BC), s->Cp = proj(WC_, BC);
    s->dd_dt = proj(Wdt_, H_), s->dd_A = proj(WA_, H_), s->trap = proj(Wtrap_, H_), s->ang = proj(Wang_, NA_);
  }
  {
    OpScope part("mamba3.gates");
    s->dt = f32_out({rows, H_}), s->adt = f32_out({rows, H_}), s->lam = f32_out({rows, H_});
    mamba3_gates_forward_cuda(bf16_ptr(s->dd_dt), bf16_ptr(s->dd_A), bf16_ptr(s->trap), f32_ptr(dt_bias_.value),
                              f32_ptr(s->dt), f32_ptr(s->adt), f32_ptr(s->lam), rows, H_, kMamba3AFloor, st);
  }

  state_out = device_state(B);
  {
    OpScope part("mamba3.angles");
    s->phi = f32_out({rows, H_, NA_});
    mamba3_angles_forward_cuda(bf16_ptr(s->ang), f32_ptr(s->dt), f32_or_null(state_at(state_in, kPhi)),
                               f32_ptr(s->phi), f32_ptr(state_out[kPhi]), B, L, H_, NA_, st);
  }

  // B and C: RMSNorm over N, per-head bias, rotation by the cumulative angle
  auto rotary_input = [&](const Tensor& raw, const Param& norm, const Param& bias, Tensor& rstd) {
    OpScope part("mamba3.bc_norm_rotary");
    Tensor normed = bf16_out({bc_rows, N_}), out = bf16_out({rows, H_, R_, N_});
    rstd = f32_out({bc_rows});
    rmsnorm_forward_cuda<bf16>(bf16_ptr(raw), f32_ptr(norm.value), bf16_ptr(normed), f32_ptr(rstd), bc_rows, N_,
                               norm_eps_, st);
    mamba3_rotary_bc_forward_cuda(bf16_ptr(normed), f32_ptr(bias.value), f32_ptr(s->phi), bf16_ptr(out), rows, H_,
                                  R_, G_, N_, NA_, st);
    return out;
  };
  s->b = rotary_input(s->Bp, B_norm_, B_bias_, s->rstd_B);
  s->c = rotary_input(s->Cp, C_norm_, C_bias_, s->rstd_C);
  if (R_ > 1) {
    OpScope part("mamba3.mimo");
    s->X = bf16_out({rows, H_, R_, P_});
    mamba3_expand_x_forward_cuda(bf16_ptr(s->xr), f32_ptr(mimo_x_.value), bf16_ptr(s->X), rows, H_, R_, P_, st);
  } else {
    s->X = s->xr;  // SISO: the core reads x itself
  }

  s->y = bf16_out({rows, H_, R_, P_});
  {
    OpScope part("mamba3.core");
    DeviceBuffer ws = cuda_scratch(core_ws);
    const Mamba3CudaInputs in{bf16_ptr(s->X),  bf16_ptr(s->b),   bf16_ptr(s->c),         f32_ptr(s->adt),
                              f32_ptr(s->dt), f32_ptr(s->lam), f32_ptr(D_skip_.value)};
    mamba3_chunk_forward_cuda(d, in,
                              {f32_or_null(state_at(state_in, kS)), f32_or_null(state_at(state_in, kXPrev)),
                               f32_or_null(state_at(state_in, kBPrev))},
                              bf16_ptr(s->y),
                              {f32_ptr(state_out[kS]), f32_ptr(state_out[kXPrev]), f32_ptr(state_out[kBPrev])},
                              ws.get(), st);
  }

  if (cfg_.output_norm) {
    OpScope part("mamba3.out_norm");
    s->yn = bf16_out({rows, H_, R_, P_}), s->rstd_y = f32_out({rows * H_ * R_});
    rmsnorm_forward_cuda<bf16>(bf16_ptr(s->y), f32_ptr(out_norm_.value), bf16_ptr(s->yn), f32_ptr(s->rstd_y),
                               rows * H_ * R_, P_, norm_eps_, st);
  }
  {
    OpScope part("mamba3.out_gate");
    s->o = bf16_out({rows, HP});
    mamba3_output_gate_forward_cuda(bf16_ptr(cfg_.output_norm ? s->yn : s->y), bf16_ptr(s->z), f32_or_null_param(mimo_z_),
                                    f32_or_null_param(mimo_o_), bf16_ptr(s->o), rows, H_, R_, P_, st);
  }
  Tensor out = bf16_out({rows, D_});
  {
    OpScope part("mamba3.out_proj");
    linear_forward_cuda<bf16, bf16>(gemm, bf16_ptr(s->o), bf16_ptr(Wo_.value_bf16), bf16_ptr(out), rows, HP, D_, B);
  }
  stash = std::move(s);
  return out;
}

Tensor Mamba3Mixer::backward_cuda(const ChunkCtx& ctx, const Tensor& dout, const State& dstate_out,
                                  State& dstate_in, Stash& stash) {
  SF_CHECK(dstate_out.empty() || dstate_out.size() == kStateSize, "mamba3: boundary-state gradient has ",
           dstate_out.size(), " tensors, expected ", int(kStateSize));
  auto& s = static_cast<Mamba3Stash&>(stash);
  const int64_t rows = dout.dim(0), B = ctx.batch, L = rows / B;
  const int64_t HP = H_ * P_, BC = R_ * G_ * N_, bc_rows = rows * R_ * G_;
  const CublasGemm& gemm = cublas_for_thread();
  const cudaStream_t st = gemm.stream();

  // output projection, then the gate and rank combination
  {
    OpScope part("mamba3.out_proj.wgrad");
    linear_backward_weight_cuda<bf16>(gemm, bf16_ptr(s.o), bf16_ptr(dout), f32_ptr(Wo_.grad), rows, HP, D_, B);
  }
  Tensor d_o = bf16_zeros({rows, HP});
  {
    OpScope part("mamba3.out_proj.dgrad");
    linear_backward_data_cuda<bf16, bf16>(gemm, bf16_ptr(dout), bf16_ptr(Wo_.value_bf16), bf16_ptr(d_o), rows, HP, D_, B);
  }
  Tensor dy = bf16_out({rows, H_, R_, P_}), dz = bf16_out({rows, HP});
  {
    OpScope part("mamba3.out_gate");
    DeviceBuffer ws;  // SISO has no rank parameters to reduce
    if (R_ > 1) ws = cuda_scratch(2 * mamba3_rank_params_workspace_bytes(rows, H_, R_, P_, B));
    mamba3_output_gate_backward_cuda(bf16_ptr(cfg_.output_norm ? s.yn : s.y), bf16_ptr(s.z),
                                     f32_or_null_param(mimo_z_), f32_or_null_param(mimo_o_), bf16_ptr(d_o),
                                     bf16_ptr(dy), bf16_ptr(dz), grad_or_null(mimo_z_), grad_or_null(mimo_o_), rows,
                                     H_, R_, P_, B, ws.get(), st);
  }
  if (cfg_.output_norm) {  // dy so far is the normalised output's gradient
    OpScope part("mamba3.out_norm");
    Tensor dyn = std::move(dy);
    dy = bf16_out({rows, H_, R_, P_});
    const TokenRows per_token{B, H_ * R_};  // H x R norm rows per token
    DeviceBuffer ws = cuda_scratch(norm_backward_workspace_bytes(rows * H_ * R_, P_, per_token));
    rmsnorm_backward_cuda<bf16>(bf16_ptr(s.y), f32_ptr(out_norm_.value), f32_ptr(s.rstd_y), bf16_ptr(dyn),
                                bf16_ptr(dy), f32_ptr(out_norm_.grad), rows * H_ * R_, P_, per_token, ws.get(), st);
  }

  // core: gradients of its inputs and of the edge that entered the chunk; dD added to D's gradient
  dstate_in = device_state(B);
  const Mamba3Dims d{B, L, H_, R_, P_, N_, cfg_.block_size};
  Tensor dX = bf16_out({rows, H_, R_, P_}), db = bf16_out({rows, H_, R_, N_}), dc = bf16_out({rows, H_, R_, N_});
  Tensor dadt = f32_out({rows, H_}), ddt = f32_out({rows, H_}), dlam = f32_out({rows, H_});
  {
    OpScope part("mamba3.core");
    DeviceBuffer ws = cuda_scratch(mamba3_cuda_workspace_bytes(d));
    const Mamba3CudaInputs in{bf16_ptr(s.X), bf16_ptr(s.b),   bf16_ptr(s.c),         f32_ptr(s.adt),
                              f32_ptr(s.dt), f32_ptr(s.lam), f32_ptr(D_skip_.value)};
    mamba3_chunk_backward_cuda(
        d, in,
        {f32_or_null(state_at(s.state_in, kS)), f32_or_null(state_at(s.state_in, kXPrev)),
         f32_or_null(state_at(s.state_in, kBPrev))},
        bf16_ptr(dy),
        {f32_or_null(state_at(dstate_out, kS)), f32_or_null(state_at(dstate_out, kXPrev)),
         f32_or_null(state_at(dstate_out, kBPrev))},
        {bf16_ptr(dX), bf16_ptr(db), bf16_ptr(dc), f32_ptr(dadt), f32_ptr(ddt), f32_ptr(dlam), f32_ptr(D_skip_.grad)},
        {f32_ptr(dstate_in[kS]), f32_ptr(dstate_in[kXPrev]), f32_ptr(dstate_in[kBPrev])}, ws.get(), st);
  }

  Tensor dxr = dX;  // SISO: X is x itself
  if (R_ > 1) {
    OpScope part("mamba3.mimo");
    dxr = bf16_out({rows, HP});
    DeviceBuffer ws = cuda_scratch(mamba3_rank_params_workspace_bytes(rows, H_, R_, P_, B));
    mamba3_expand_x_backward_cuda(bf16_ptr(s.xr), f32_ptr(mimo_x_.value), bf16_ptr(dX), bf16_ptr(dxr),
                                  f32_ptr(mimo_x_.grad), rows, H_, R_, P_, B, ws.get(), st);
  }

  // B and C: rotation, biases and norms; both rotations add to the angle's gradient
  Tensor dphi = f32_zeros({rows, H_, NA_});
  auto rotary_input_back = [&](const Tensor& dout_bc, const Tensor& out_bc, const Tensor& raw, const Tensor& rstd,
                               Param& norm, Param& bias) {
    OpScope part("mamba3.bc_norm_rotary");
    Tensor dnormed = bf16_out({bc_rows, N_}), draw = bf16_out({rows, BC});
    {
      DeviceBuffer ws = cuda_scratch(mamba3_rotary_bc_backward_workspace_bytes(rows, H_, R_, N_, B));
      mamba3_rotary_bc_backward_cuda(bf16_ptr(dout_bc), bf16_ptr(out_bc), f32_ptr(s.phi), bf16_ptr(dnormed),
                                     f32_ptr(bias.grad), f32_ptr(dphi), rows, H_, R_, G_, N_, NA_, B, ws.get(), st);
    }
    const TokenRows per_token{B, R_ * G_};  // R x G norm rows per token
    DeviceBuffer ws = cuda_scratch(norm_backward_workspace_bytes(bc_rows, N_, per_token));
    rmsnorm_backward_cuda<bf16>(bf16_ptr(raw), f32_ptr(norm.value), f32_ptr(rstd), bf16_ptr(dnormed),
                                bf16_ptr(draw), f32_ptr(norm.grad), bc_rows, N_, per_token, ws.get(), st);
    return draw;
  };
  Tensor dBp = rotary_input_back(db, s.b, s.Bp, s.rstd_B, B_norm_, B_bias_);
  Tensor dCp = rotary_input_back(dc, s.c, s.Cp, s.rstd_C, C_norm_, C_bias_);

  // the cumulative angle (adds its share of the step-size gradient to ddt), then the gates
  Tensor dang = bf16_out({rows, NA_});
  {
    OpScope part("mamba3.angles");
    DeviceBuffer ws = cuda_scratch(mamba3_angles_backward_workspace_bytes(rows, H_, NA_));
    mamba3_angles_backward_cuda(bf16_ptr(s.ang), f32_ptr(s.dt), f32_ptr(dphi), f32_or_null(state_at(dstate_out, kPhi)),
                                bf16_ptr(dang), f32_ptr(ddt), f32_ptr(dstate_in[kPhi]), B, L, H_, NA_, ws.get(), st);
  }
  Tensor d_dd_dt = bf16_out({rows, H_}), d_dd_A = bf16_out({rows, H_}), dtrap = bf16_out({rows, H_});
  {
    OpScope part("mamba3.gates");
    DeviceBuffer ws = cuda_scratch(mamba3_gates_backward_workspace_bytes(rows, H_, B));
    mamba3_gates_backward_cuda(bf16_ptr(s.dd_dt), bf16_ptr(s.dd_A), bf16_ptr(s.trap), f32_ptr(dt_bias_.value),
                               f32_ptr(ddt), f32_ptr(dadt), f32_ptr(dlam), bf16_ptr(d_dd_dt), bf16_ptr(d_dd_A),
                               bf16_ptr(dtrap), f32_ptr(dt_bias_.grad), rows, H_, B, kMamba3AFloor, ws.get(), st);
  }

  // input projections
  Tensor dx = bf16_zeros({rows, D_});
  auto proj_back = [&](Param& W, const Tensor& dY, int64_t out) {
    {
      OpScope part("mamba3.in_proj.wgrad");
      linear_backward_weight_cuda<bf16>(gemm, bf16_ptr(s.x), bf16_ptr(dY), f32_ptr(W.grad), rows, D_, out, B);
    }
    OpScope part("mamba3.in_proj.dgrad");
    linear_backward_data_cuda<bf16, bf16>(gemm, bf16_ptr(dY), bf16_ptr(W.value_bf16), bf16_ptr(dx), rows, D_, out, B);
  };
  proj_back(Wz_, dz, HP), proj_back(Wx_, dxr, HP), proj_back(WB_, dBp, BC), proj_back(WC_, dCp, BC);
  proj_back(Wdt_, d_dd_dt, H_), proj_back(WA_, d_dd_A, H_), proj_back(Wtrap_, dtrap, H_), proj_back(Wang_, dang, NA_);
  return dx;
}

static const DevicePathRegistration registered = device_path_of<Mamba3Mixer>("mamba3");

}  // namespace stateflow
