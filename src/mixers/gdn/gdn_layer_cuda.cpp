// GatedDeltaNet on the GPU: the CPU forward_impl/backward_impl as kernel calls, bf16
// activations and GEMM weights, fp32 gates, norm statistics and weight gradients. Boundary
// state: S fp32 (the core keeps it fp32), conv prefixes bf16 (the conv's input type, so
// carrying them is exact); the state gradients are all fp32.
#include <cmath>

#include "mixers/gdn/gdn_core_cuda.h"
#include "mixers/gdn/gdn_gates_cuda.h"
#include "mixers/gdn/gdn_groups_cuda.h"
#include "kernels/cuda/gemm_cuda.h"
#include "kernels/cuda/levers.h"
#include "kernels/cuda/norms_cuda.h"
#include "kernels/cuda/short_conv_cuda.h"
#include "kernels/cuda/side_stream_cuda.h"
#include "model/cuda/layer_cuda.h"
#include "mixers/gdn/gdn_layer.h"
#include "model/device_path.h"
#include "core/op_scope.h"

namespace stateflow {

namespace {
constexpr double kL2Eps = 1e-6;  // as the CPU path

struct GdnCudaStash : Stash {
  Tensor x;
  Tensor qp, kp, vp;
  Tensor a, b, z;
  State state_in;
  Tensor q, rq, k, rk, v;
  Tensor g, beta;
  Tensor o, rstd_o, y;
  // The core's per-sub-chunk T = (I + A)^-1 (bf16, 128 bytes per token and value head), kept so the
  // backward need not invert again (GdnCudaConfig::kept_T); empty with the keep_t lever off.
  Tensor T;
  // The core's forward sweep, G, W, V_new and each sub-chunk's entering state (1028 bytes per token
  // and value head; GdnCudaConfig::sweep_buffer), kept so the backward neither sweeps forward again
  // nor re-runs Pre (kept_sweep with kept_T); empty unless gdn.keep_sweep.
  Tensor sweep;
};

// Grouped values (mixers/gdn/gdn_groups_cuda.h): the core runs per value head, so q and k go in
// as one copy per value head, made for the call and not stashed (the backward makes them again),
// and their gradients come out per value head and are summed over each group. Ungrouped, both
// hand the tensor through.
Tensor per_value_head_cuda(const Tensor& qk, int64_t heads, int64_t value_heads, int64_t dk, cudaStream_t st) {
  if (value_heads == heads) return qk;
  const int64_t rows = qk.dim(0);
  Tensor out = bf16_out({rows, value_heads * dk});
  gdn_expand_groups_cuda<bf16>(bf16_ptr(qk), bf16_ptr(out), rows, heads, value_heads / heads, dk, st);
  return out;
}
Tensor sum_over_groups_cuda(const Tensor& dqk, int64_t heads, int64_t value_heads, int64_t dk, cudaStream_t st) {
  if (value_heads == heads) return dqk;
  const int64_t rows = dqk.dim(0);
  Tensor out = bf16_out({rows, heads * dk});
  gdn_sum_groups_cuda<bf16>(bf16_ptr(dqk), bf16_ptr(out), rows, heads, value_heads / heads, dk, st);
  return out;
}
}  // namespace

Tensor GatedDeltaNet::forward_cuda(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                                   std::unique_ptr<Stash>& stash) {
  SF_CHECK(state_in.empty() || state_in.size() == kStateSize, "gdn: boundary state has ", state_in.size(),
           " tensors, expected ", int(kStateSize));
  const int64_t rows = x.dim(0), B = ctx.batch, L = rows / B;
  SF_CHECK(B * L == rows && L == ctx.len, "gdn: input has ", rows, " rows, expected batch ", B, " x len ", ctx.len);
  const int64_t HK = H_ * dk_, HV = Hv_ * dv_;
  const CublasGemm& gemm = cublas_for_thread();
  const cudaStream_t st = gemm.stream();
  auto s = std::make_unique<GdnCudaStash>();
  s->x = x;
  s->state_in = state_in;
  // The gates (projections and kernel) run on the side stream beside the q, k, v projections,
  // convs and L2 norms: neither reads the other's outputs until the core. The output gate's
  // projection runs beside the core, which leaves most SMs idle (before the out_gate_by_core
  // lever, beside the q, k, v projections). The side's outputs are made before the fork (a
  // zero-fill or test poison of them runs on the main stream, so the fork orders it first).
  s->qp = bf16_out({rows, HK}), s->kp = bf16_out({rows, HK}), s->vp = bf16_out({rows, HV});
  s->z = bf16_out({rows, HV}), s->a = bf16_out({rows, Hv_}), s->b = bf16_out({rows, Hv_});
  s->g = f32_out({rows, Hv_}), s->beta = f32_out({rows, Hv_});
  SideWork side;
  const CublasGemm& beside = side.fork();
  auto proj = [&](const CublasGemm& on, const Param& W, const Tensor& y, int64_t out) {
    linear_forward_cuda<bf16, bf16>(on, bf16_ptr(x), bf16_ptr(W.value_bf16), bf16_ptr(y), rows, D_, out);
  };
  const bool out_gate_by_core = !lever_off("out_gate_by_core");
  {
    OpScope part("gdn.in_proj");
    if (!out_gate_by_core) proj(beside, Wg_, s->z, HV);
    proj(gemm, Wq_, s->qp, HK), proj(gemm, Wk_, s->kp, HK), proj(gemm, Wv_, s->vp, HV);
  }
  {
    OpScope part("gdn.gate_proj");
    proj(beside, Wa_, s->a, Hv_), proj(beside, Wb_, s->b, Hv_);
  }
  {
    OpScope part("gdn.gates");
    gdn_gates_forward_cuda<bf16>(bf16_ptr(s->a), bf16_ptr(s->b), f32_ptr(A_log_.value), f32_ptr(dt_bias_.value),
                                 f32_ptr(s->g), f32_ptr(s->beta), rows, Hv_, beside.stream());
  }

  state_out.assign(kStateSize, Tensor());
  {
    CategoryScope boundary(MemCategory::BoundaryState);
    state_out[kS] = f32_out({B, Hv_, dv_, dk_});
    // the conv writes every row of its prefix_out
    state_out[kPrefixQ] = bf16_out({B, K_ - 1, HK});
    state_out[kPrefixK] = bf16_out({B, K_ - 1, HK});
    state_out[kPrefixV] = bf16_out({B, K_ - 1, HV});
  }
  Tensor qc = bf16_out({rows, HK}), kc = bf16_out({rows, HK});
  s->v = bf16_out({rows, HV});
  auto conv = [&](const Tensor& in, int i, const Param& w, const Tensor& out, int64_t ch) {
    return ShortConvForward<bf16>{bf16_ptr(in), bf16_or_null(state_at(state_in, i)), f32_ptr(w.value),
                                  bf16_ptr(out), bf16_ptr(state_out[i]), ch};
  };
  {
    OpScope part("gdn.conv");
    const ShortConvForward<bf16> convs[] = {conv(s->qp, kPrefixQ, conv_q_, qc, HK),
                                            conv(s->kp, kPrefixK, conv_k_, kc, HK),
                                            conv(s->vp, kPrefixV, conv_v_, s->v, HV)};
    short_conv_forward_group_cuda<bf16>(convs, 3, B, L, K_, st);
  }

  s->q = bf16_out({rows, HK}), s->k = bf16_out({rows, HK});
  s->rq = f32_out({rows * H_}), s->rk = f32_out({rows * H_});
  {
    OpScope part("gdn.l2norm");
    l2norm_forward_cuda<bf16>(bf16_ptr(qc), bf16_ptr(s->q), f32_ptr(s->rq), rows * H_, dk_, kL2Eps, st);
    l2norm_forward_cuda<bf16>(bf16_ptr(kc), bf16_ptr(s->k), f32_ptr(s->rk), rows * H_, dk_, kL2Eps, st);
  }
  side.join();  // the core reads g and beta
  SideWork by_core;
  if (out_gate_by_core) {
    OpScope part("gdn.in_proj");
    proj(by_core.fork(), Wg_, s->z, HV);
  }

  const GdnDims d{B, L, Hv_, dk_, dv_, C_, 1.0 / std::sqrt(double(dk_))};
  s->o = bf16_out({rows, HV});
  GdnCudaConfig core;
  if (!lever_off("keep_t")) {
    CategoryScope kept(MemCategory::Activations);  // held to the backward like the rest of the stash
    s->T = bf16_out({int64_t(gdn_cuda_kept_T_bytes(d) / 2)});
    core.T_buffer = bf16_ptr(s->T);
  }
  if (keep_sweep_) {
    CategoryScope kept(MemCategory::Activations);
    s->sweep = bf16_out({int64_t(gdn_cuda_kept_sweep_bytes(d) / 2)});
    core.sweep_buffer = bf16_ptr(s->sweep);
  }
  {
    OpScope part("gdn.core");
    const Tensor q = per_value_head_cuda(s->q, H_, Hv_, dk_, st), k = per_value_head_cuda(s->k, H_, Hv_, dk_, st);
    DeviceBuffer ws = cuda_scratch(gdn_cuda_workspace_bytes(d, core));  // less with the sweep kept
    gdn_chunk_forward_cuda(d, bf16_ptr(q), bf16_ptr(k), bf16_ptr(s->v), f32_ptr(s->beta), f32_ptr(s->g),
                           f32_or_null(state_at(state_in, kS)), bf16_ptr(s->o), f32_ptr(state_out[kS]), ws.get(), st,
                           core);
  }
  by_core.join();  // the gated norm reads z

  s->rstd_o = f32_out({rows * Hv_}), s->y = bf16_out({rows, HV});
  {
    OpScope part("gdn.out_norm");
    gated_rmsnorm_forward_cuda<bf16>(bf16_ptr(s->o), bf16_ptr(s->z), f32_ptr(out_norm_.value), bf16_ptr(s->y),
                                     f32_ptr(s->rstd_o), rows * Hv_, dv_, norm_eps_, st);
  }
  Tensor out = bf16_out({rows, D_});
  {
    OpScope part("gdn.out_proj");
    linear_forward_cuda<bf16, bf16>(gemm, bf16_ptr(s->y), bf16_ptr(Wo_.value_bf16), bf16_ptr(out), rows, HV, D_);
  }
  stash = std::move(s);
  return out;
}

Tensor GatedDeltaNet::backward_cuda(const ChunkCtx& ctx, const Tensor& dout, const State& dstate_out,
                                    State& dstate_in, Stash& stash) {
  SF_CHECK(dstate_out.empty() || dstate_out.size() == kStateSize, "gdn: boundary-state gradient has ",
           dstate_out.size(), " tensors, expected ", int(kStateSize));
  // Weight gradients run on the side stream beside the rest (kernels/cuda/side_stream_cuda.h)
  SideWork side;
  auto& s = static_cast<GdnCudaStash&>(stash);
  const int64_t rows = dout.dim(0), B = ctx.batch, L = rows / B;
  const int64_t HK = H_ * dk_, HV = Hv_ * dv_;
  const CublasGemm& gemm = cublas_for_thread();
  const cudaStream_t st = gemm.stream();

  // output projection and gated norm
  {
    OpScope part("gdn.out_proj.wgrad");
    linear_backward_weight_cuda<bf16>(side.fork(), bf16_ptr(s.y), bf16_ptr(dout), f32_ptr(Wo_.grad), rows, HV, D_,
                                      B);
  }
  Tensor dy = bf16_out({rows, HV});
  {
    OpScope part("gdn.out_proj.dgrad");
    linear_backward_data_cuda<bf16, bf16>(gemm, bf16_ptr(dout), bf16_ptr(Wo_.value_bf16), bf16_ptr(dy), rows, HV,
                                          D_, /*accumulate=*/false);
  }
  Tensor do_ = bf16_out({rows, HV}), dz = bf16_out({rows, HV});
  {
    OpScope part("gdn.out_norm");
    const TokenRows per_head{B, Hv_};  // one norm row per token and value head
    DeviceBuffer ws = cuda_scratch(norm_backward_workspace_bytes(rows * Hv_, dv_, per_head));
    gated_rmsnorm_backward_cuda<bf16>(bf16_ptr(s.o), bf16_ptr(s.z), f32_ptr(out_norm_.value), f32_ptr(s.rstd_o),
                                      bf16_ptr(dy), bf16_ptr(do_), bf16_ptr(dz), f32_ptr(out_norm_.grad), rows * Hv_,
                                      dv_, per_head, ws.get(), st);
  }
  // Each input projection's weight gradient is forked as soon as its dY is issued: the output
  // gate's beside the core, the gates' beside the L2 norms and convs, q, k, v's beside dx.
  auto wgrad = [&](Param& W, const Tensor& dY, int64_t out) {
    linear_backward_weight_cuda<bf16>(side.fork(), bf16_ptr(s.x), bf16_ptr(dY), f32_ptr(W.grad), rows, D_, out, B);
  };
  {
    OpScope part("gdn.in_proj.wgrad");
    wgrad(Wg_, dz, HV);
  }

  // core: gradients of q, k, v, beta, g and of the state that entered the chunk
  dstate_in.assign(kStateSize, Tensor());
  {
    CategoryScope boundary(MemCategory::BoundaryState);
    dstate_in[kS] = f32_out({B, Hv_, dv_, dk_});
    dstate_in[kPrefixQ] = f32_out({B, K_ - 1, HK});
    dstate_in[kPrefixK] = f32_out({B, K_ - 1, HK});
    dstate_in[kPrefixV] = f32_out({B, K_ - 1, HV});
  }
  const GdnDims d{B, L, Hv_, dk_, dv_, C_, 1.0 / std::sqrt(double(dk_))};
  Tensor dq, dk, dv = bf16_out({rows, HV});
  Tensor dbeta = f32_out({rows, Hv_}), dg = f32_out({rows, Hv_});
  GdnCudaConfig core;
  if (s.T.defined()) core.T_buffer = bf16_ptr(s.T), core.kept_T = true;
  if (s.sweep.defined()) core.sweep_buffer = bf16_ptr(s.sweep), core.kept_sweep = true;
  {
    OpScope part("gdn.core");
    const Tensor q = per_value_head_cuda(s.q, H_, Hv_, dk_, st), k = per_value_head_cuda(s.k, H_, Hv_, dk_, st);
    const Tensor dqv = bf16_out({rows, Hv_ * dk_}), dkv = bf16_out({rows, Hv_ * dk_});
    DeviceBuffer ws = cuda_scratch(gdn_cuda_workspace_bytes(d, core));
    gdn_chunk_backward_cuda(d, bf16_ptr(q), bf16_ptr(k), bf16_ptr(s.v), f32_ptr(s.beta), f32_ptr(s.g),
                            f32_or_null(state_at(s.state_in, kS)), bf16_ptr(do_), f32_or_null(state_at(dstate_out, kS)),
                            bf16_ptr(dqv), bf16_ptr(dkv), bf16_ptr(dv), f32_ptr(dbeta), f32_ptr(dg),
                            f32_ptr(dstate_in[kS]), ws.get(), st, core);
    dq = sum_over_groups_cuda(dqv, H_, Hv_, dk_, st), dk = sum_over_groups_cuda(dkv, H_, Hv_, dk_, st);
  }

  // gates
  Tensor da = bf16_out({rows, Hv_}), db = bf16_out({rows, Hv_});
  {
    OpScope part("gdn.gates");
    DeviceBuffer ws = cuda_scratch(gdn_gates_backward_workspace_bytes(rows, Hv_, B));
    gdn_gates_backward_cuda<bf16>(bf16_ptr(s.a), bf16_ptr(s.b), f32_ptr(A_log_.value), f32_ptr(dt_bias_.value),
                                  f32_ptr(dg), f32_ptr(dbeta), bf16_ptr(da), bf16_ptr(db), f32_ptr(A_log_.grad),
                                  f32_ptr(dt_bias_.grad), rows, Hv_, B, ws.get(), st);
  }
  {
    OpScope part("gdn.gate_proj.wgrad");
    wgrad(Wa_, da, Hv_), wgrad(Wb_, db, Hv_);
  }

  // L2 norms, then the convs (which also route the next chunk's prefix gradient)
  Tensor dqc = bf16_out({rows, HK}), dkc = bf16_out({rows, HK});
  {
    OpScope part("gdn.l2norm");
    l2norm_backward_cuda<bf16>(bf16_ptr(s.q), f32_ptr(s.rq), bf16_ptr(dq), bf16_ptr(dqc), rows * H_, dk_, st);
    l2norm_backward_cuda<bf16>(bf16_ptr(s.k), f32_ptr(s.rk), bf16_ptr(dk), bf16_ptr(dkc), rows * H_, dk_, st);
  }
  Tensor dqp = bf16_out({rows, HK}), dkp = bf16_out({rows, HK}), dvp = bf16_out({rows, HV});
  {
    OpScope part("gdn.conv");
    const size_t ws_q = short_conv_backward_workspace_bytes(B, L, HK, K_);
    DeviceBuffer ws = cuda_scratch(2 * ws_q + short_conv_backward_workspace_bytes(B, L, HV, K_));
    auto conv_back = [&](const Tensor& in, int i, Param& w, const Tensor& dconv, const Tensor& dinput, int64_t ch,
                         size_t ws_at) {
      return ShortConvBackward<bf16>{bf16_ptr(in), bf16_or_null(state_at(s.state_in, i)), f32_ptr(w.value),
                                     bf16_ptr(dconv), f32_or_null(state_at(dstate_out, i)), bf16_ptr(dinput),
                                     f32_ptr(dstate_in[i]), f32_ptr(w.grad), ch, ws.get<char>() + ws_at};
    };
    const ShortConvBackward<bf16> convs[] = {conv_back(s.qp, kPrefixQ, conv_q_, dqc, dqp, HK, 0),
                                             conv_back(s.kp, kPrefixK, conv_k_, dkc, dkp, HK, ws_q),
                                             conv_back(s.vp, kPrefixV, conv_v_, dv, dvp, HV, 2 * ws_q)};
    short_conv_backward_group_cuda<bf16>(convs, 3, B, L, K_, st);
  }

  // input projections
  Tensor dx = bf16_out({rows, D_});  // the first product overwrites it
  auto dgrad = [&](Param& W, const Tensor& dY, int64_t out, bool accumulate = true) {
    linear_backward_data_cuda<bf16, bf16>(gemm, bf16_ptr(dY), bf16_ptr(W.value_bf16), bf16_ptr(dx), rows, D_, out,
                                          accumulate);
  };
  {
    OpScope part("gdn.in_proj.wgrad");
    wgrad(Wq_, dqp, HK), wgrad(Wk_, dkp, HK), wgrad(Wv_, dvp, HV);
  }
  {  // dx sums the six products in the order q, k, v, a, b, z (bf16 adds: the order is the result)
    OpScope part("gdn.in_proj.dgrad");
    dgrad(Wq_, dqp, HK, /*accumulate=*/false), dgrad(Wk_, dkp, HK), dgrad(Wv_, dvp, HV);
  }
  {
    OpScope part("gdn.gate_proj.dgrad");
    dgrad(Wa_, da, Hv_), dgrad(Wb_, db, Hv_);
  }
  {
    OpScope part("gdn.in_proj.dgrad");
    dgrad(Wg_, dz, HV);
  }
  // The weight gradients may go on beside the next layer's backward (side_stream_cuda.h)
  side.join_later({s.x, s.y, dout, dz, da, db, dqp, dkp, dvp});
  return dx;
}

static const DevicePathRegistration registered = device_path_of<GatedDeltaNet>("gdn");

}  // namespace stateflow
