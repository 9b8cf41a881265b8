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

// The q, k, v and output-gate projections of x (before the convs and the gated norm), or their
// gradients: a tensor each, or, where Wq, Wk, Wv and Wg share one bf16 copy (model/param.h, lever
// fused_proj), the column blocks of one [rows, 2HK + 2HV] tensor, which one GEMM writes (forward)
// or reads (dx), its rows ld apart.
struct InProj {
  Tensor q, k, v, z;  // fused: q holds all four
  bf16 *q_at = nullptr, *k_at = nullptr, *v_at = nullptr, *z_at = nullptr;
  int64_t ld_qk = 0, ld_vz = 0;
  bool fused = false;
  int64_t width() const { return ld_qk; }  // fused: all four
  std::vector<Tensor> tensors() const { return {q, k, v, z}; }
};
InProj in_proj_out(int64_t rows, int64_t HK, int64_t HV, bool fused) {
  InProj p;
  if (fused) {
    const int64_t W = 2 * HK + 2 * HV;
    p.q = bf16_out({rows, W});
    p.q_at = bf16_ptr(p.q), p.k_at = p.q_at + HK, p.v_at = p.q_at + 2 * HK, p.z_at = p.v_at + HV;
    p.ld_qk = p.ld_vz = W, p.fused = true;
    return p;
  }
  p.q = bf16_out({rows, HK}), p.k = bf16_out({rows, HK}), p.v = bf16_out({rows, HV}), p.z = bf16_out({rows, HV});
  p.q_at = bf16_ptr(p.q), p.k_at = bf16_ptr(p.k), p.v_at = bf16_ptr(p.v), p.z_at = bf16_ptr(p.z);
  p.ld_qk = HK, p.ld_vz = HV;
  return p;
}

struct GdnCudaStash : Stash {
  Tensor x;
  InProj in;  // q, k, v before the convs, and the output gate z
  Tensor a, b;
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

// Whether Wq, Wk, Wv and Wg share one bf16 copy in that column order: then one GEMM projects x.
static bool fused_in_proj(const Param& q, const Param& k, const Param& v, const Param& g) {
  const int64_t ld = q.bf16_ld;
  return ld > 0 && k.bf16_ld == ld && v.bf16_ld == ld && g.bf16_ld == ld && q.bf16_col == 0 &&
         k.bf16_col == q.value.dim(1) && v.bf16_col == 2 * q.value.dim(1) &&
         g.bf16_col == 2 * q.value.dim(1) + v.value.dim(1);
}

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
  const bool fused = fused_in_proj(Wq_, Wk_, Wv_, Wg_);
  s->in = in_proj_out(rows, HK, HV, fused);
  s->a = bf16_out({rows, Hv_}), s->b = bf16_out({rows, Hv_});
  s->g = f32_out({rows, Hv_}), s->beta = f32_out({rows, Hv_});
  SideWork side;
  const CublasGemm& beside = side.fork();
  auto proj = [&](const CublasGemm& on, const Param& W, bf16* y, int64_t out) {
    linear_forward_cuda<bf16, bf16>(on, bf16_ptr(x), bf16_ptr(W.value_bf16), y, rows, D_, out, B);
  };
  const bool out_gate_by_core = !lever_off("out_gate_by_core") && !fused;
  {
    OpScope part("gdn.in_proj");
    if (fused) {
      proj(gemm, Wq_, s->in.q_at, s->in.width());  // Wq's copy starts the shared one
    } else {
      if (!out_gate_by_core) proj(beside, Wg_, s->in.z_at, HV);
      proj(gemm, Wq_, s->in.q_at, HK), proj(gemm, Wk_, s->in.k_at, HK), proj(gemm, Wv_, s->in.v_at, HV);
    }
  }
  {
    OpScope part("gdn.gate_proj");
    proj(beside, Wa_, bf16_ptr(s->a), Hv_), proj(beside, Wb_, bf16_ptr(s->b), Hv_);
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
  auto conv = [&](const bf16* in, int64_t ld, int i, const Param& w, const Tensor& out, int64_t ch) {
    return ShortConvForward<bf16>{in, bf16_or_null(state_at(state_in, i)), f32_ptr(w.value), bf16_ptr(out),
                                  bf16_ptr(state_out[i]), ch, ld};
  };
  {
    OpScope part("gdn.conv");
    const InProj& in = s->in;
    const ShortConvForward<bf16> convs[] = {conv(in.q_at, in.ld_qk, kPrefixQ, conv_q_, qc, HK),
                                            conv(in.k_at, in.ld_qk, kPrefixK, conv_k_, kc, HK),
                                            conv(in.v_at, in.ld_vz, kPrefixV, conv_v_, s->v, HV)};
    short_conv_forward_group_cuda<bf16>(convs, 3, B, L, K_, st);
  }

  s->q = bf16_out({rows, HK}), s->k = bf16_out({rows, HK});
  s->rq = f32_out({rows * H_}), s->rk = f32_out({rows * H_});
  {
    OpScope part("gdn.l2norm");
    const L2NormRows<bf16> qk[2] = {{bf16_ptr(qc), bf16_ptr(s->q), f32_ptr(s->rq)},
                                    {bf16_ptr(kc), bf16_ptr(s->k), f32_ptr(s->rk)}};
    l2norm_forward_pair_cuda<bf16>(qk, rows * H_, dk_, kL2Eps, st);
  }
  side.join();  // the core reads g and beta
  SideWork by_core;
  if (out_gate_by_core) {
    OpScope part("gdn.in_proj");
    proj(by_core.fork(), Wg_, s->in.z_at, HV);
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
    gated_rmsnorm_forward_cuda<bf16>(bf16_ptr(s->o), s->in.z_at, f32_ptr(out_norm_.value), bf16_ptr(s->y),
                                     f32_ptr(s->rstd_o), rows * Hv_, dv_, norm_eps_, st, GateRows{Hv_, s->in.ld_vz});
  }
  Tensor out = bf16_out({rows, D_});  // with ctx.residual: residual + y Wo (model/residual.h)
  {
    OpScope part("gdn.out_proj");
    linear_forward_cuda<bf16, bf16>(gemm, bf16_ptr(s->y), bf16_ptr(Wo_.value_bf16), bf16_ptr(out), rows, HV, D_, B,
                                    ctx.residual ? bf16_ptr(*ctx.residual) : nullptr);
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
                                          D_, B, /*accumulate=*/false);
  }
  // The gradients of the q, k, v projections and of the gate z, laid out as the projections
  const InProj d_in = in_proj_out(rows, HK, HV, s.in.fused);
  Tensor do_ = bf16_out({rows, HV});
  // The gated norm's and the convs' dw reductions go to the side stream too (dw_beside), their
  // workspaces held until it is joined
  const bool dw_beside = dw_beside_for_thread();
  std::vector<Tensor> workspaces;
  {
    OpScope part("gdn.out_norm");
    const TokenRows per_head{B, Hv_};  // one norm row per token and value head
    DwReduction dw_sum;
    const Tensor ws = scratch_f32(norm_backward_workspace_bytes(rows * Hv_, dv_, per_head));
    gated_rmsnorm_backward_cuda<bf16>(bf16_ptr(s.o), s.in.z_at, f32_ptr(out_norm_.value), f32_ptr(s.rstd_o),
                                      bf16_ptr(dy), bf16_ptr(do_), d_in.z_at, f32_ptr(out_norm_.grad), rows * Hv_,
                                      dv_, per_head, ws.raw(), st, GateRows{Hv_, s.in.ld_vz},
                                      dw_beside ? &dw_sum : nullptr);
    if (dw_sum) dw_sum(side.fork().stream()), workspaces.push_back(ws);
  }
  // Each input projection's weight gradient is forked as soon as its dY is issued: the output
  // gate's beside the core, the gates' beside the L2 norms and convs, q, k, v's beside dx.
  auto wgrad = [&](Param& W, const bf16* dY, int64_t out, int64_t ld) {
    linear_backward_weight_cuda<bf16>(side.fork(), bf16_ptr(s.x), dY, f32_ptr(W.grad), rows, D_, out, B, ld);
  };
  {
    OpScope part("gdn.in_proj.wgrad");
    wgrad(Wg_, d_in.z_at, HV, d_in.ld_vz);
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

  // gates. With gates_beside on the side stream, beside the L2 norms, convs and q, k, v's input
  // gradient (at 1-2K-token chunks a fixed ~12 us of dependent loads that the main stream waited
  // for): the main stream waits for da and db only where the gate projections' input gradient
  // reads them (the mark). dg, dbeta and the workspace live until that wait.
  Tensor da = bf16_out({rows, Hv_}), db = bf16_out({rows, Hv_});
  const bool gates_beside = gates_beside_for_thread();
  const Tensor gates_ws = scratch_f32(gdn_gates_backward_workspace_bytes(rows, Hv_, B));
  {
    OpScope part("gdn.gates");
    const cudaStream_t on = gates_beside ? side.fork().stream() : st;
    gdn_gates_backward_cuda<bf16>(bf16_ptr(s.a), bf16_ptr(s.b), f32_ptr(A_log_.value), f32_ptr(dt_bias_.value),
                                  f32_ptr(dg), f32_ptr(dbeta), bf16_ptr(da), bf16_ptr(db), f32_ptr(A_log_.grad),
                                  f32_ptr(dt_bias_.grad), rows, Hv_, B, gates_ws.raw(), on);
    if (gates_beside) side.mark();
  }
  {
    OpScope part("gdn.gate_proj.wgrad");
    wgrad(Wa_, bf16_ptr(da), Hv_, Hv_), wgrad(Wb_, bf16_ptr(db), Hv_, Hv_);
  }

  // L2 norms, then the convs (which also route the next chunk's prefix gradient)
  Tensor dqc = bf16_out({rows, HK}), dkc = bf16_out({rows, HK});
  {
    OpScope part("gdn.l2norm");
    const L2NormRows<bf16> qk[2] = {{nullptr, bf16_ptr(s.q), f32_ptr(s.rq), bf16_ptr(dq), bf16_ptr(dqc)},
                                    {nullptr, bf16_ptr(s.k), f32_ptr(s.rk), bf16_ptr(dk), bf16_ptr(dkc)}};
    l2norm_backward_pair_cuda<bf16>(qk, rows * H_, dk_, st);
  }
  {
    OpScope part("gdn.conv");
    const size_t ws_q = short_conv_backward_workspace_bytes(B, L, HK, K_);
    const Tensor ws = scratch_f32(2 * ws_q + short_conv_backward_workspace_bytes(B, L, HV, K_));
    // x and dx of each conv: its columns of the projections and of their gradients
    auto conv_back = [&](const bf16* in, bf16* dinput, int64_t ld, int i, Param& w, const Tensor& dconv, int64_t ch,
                         size_t ws_at) {
      return ShortConvBackward<bf16>{in,
                                     bf16_or_null(state_at(s.state_in, i)),
                                     f32_ptr(w.value),
                                     bf16_ptr(dconv),
                                     f32_or_null(state_at(dstate_out, i)),
                                     dinput,
                                     f32_ptr(dstate_in[i]),
                                     f32_ptr(w.grad),
                                     ch,
                                     static_cast<char*>(ws.raw()) + ws_at,
                                     ld,
                                     ld};
    };
    const ShortConvBackward<bf16> convs[] = {
        conv_back(s.in.q_at, d_in.q_at, d_in.ld_qk, kPrefixQ, conv_q_, dqc, HK, 0),
        conv_back(s.in.k_at, d_in.k_at, d_in.ld_qk, kPrefixK, conv_k_, dkc, HK, ws_q),
        conv_back(s.in.v_at, d_in.v_at, d_in.ld_vz, kPrefixV, conv_v_, dv, HV, 2 * ws_q)};
    DwReduction dw_sum;
    short_conv_backward_group_cuda<bf16>(convs, 3, B, L, K_, st, dw_beside ? &dw_sum : nullptr);
    if (dw_sum) dw_sum(side.fork().stream()), workspaces.push_back(ws);
  }

  // input projections
  Tensor dx = bf16_out({rows, D_});  // the first product overwrites it
  auto dgrad = [&](Param& W, const bf16* dY, int64_t out, bool accumulate = true) {
    linear_backward_data_cuda<bf16, bf16>(gemm, dY, bf16_ptr(W.value_bf16), bf16_ptr(dx), rows, D_, out, B, accumulate);
  };
  {
    OpScope part("gdn.in_proj.wgrad");
    wgrad(Wq_, d_in.q_at, HK, d_in.ld_qk), wgrad(Wk_, d_in.k_at, HK, d_in.ld_qk), wgrad(Wv_, d_in.v_at, HV, d_in.ld_vz);
  }
  // dx sums the products in the order q, k, v, a, b, z (bf16 adds: the order is the result); fused,
  // q, k, v and z are one product, one fp32 sum over 2HK + 2HV (one rounding of dx where the
  // separate products round it four times), then a and b.
  {
    OpScope part("gdn.in_proj.dgrad");
    if (d_in.fused) dgrad(Wq_, d_in.q_at, d_in.width(), /*accumulate=*/false);
    else dgrad(Wq_, d_in.q_at, HK, /*accumulate=*/false), dgrad(Wk_, d_in.k_at, HK), dgrad(Wv_, d_in.v_at, HV);
  }
  {
    OpScope part("gdn.gate_proj.dgrad");
    if (gates_beside) side.wait_for_mark();
    dgrad(Wa_, bf16_ptr(da), Hv_), dgrad(Wb_, bf16_ptr(db), Hv_);
  }
  if (!d_in.fused) {
    OpScope part("gdn.in_proj.dgrad");
    dgrad(Wg_, d_in.z_at, HV);
  }
  // The weight gradients may go on beside the next layer's backward (side_stream_cuda.h)
  std::vector<Tensor> held = d_in.tensors();
  held.insert(held.end(), {s.x, s.y, dout, da, db});
  held.insert(held.end(), workspaces.begin(), workspaces.end());
  side.join_later(held);
  return dx;
}

static const DevicePathRegistration registered = device_path_of<GatedDeltaNet>("gdn");

}  // namespace stateflow
