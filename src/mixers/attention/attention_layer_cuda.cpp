// Attention on the GPU: the CPU forward_impl/backward_impl as kernel calls. bf16 activations,
// GEMM weights and K/V prefix (the chunk's k and v rows are copied in unchanged, so carrying
// them is exact); fp32 QK-norm statistics, row log-sum-exp and weight gradients. The prefix
// gradient buffers are fp32: every later chunk adds its share into them, and an fp32 sum keeps
// the cut-invariance of prefix_attention_cuda.h; a chunk's rows are rounded to bf16 once, when
// they are complete and taken out for the K/V projection backward.
#include <cmath>

#include "kernels/cuda/gemm_cuda.h"
#include "kernels/cuda/norms_cuda.h"
#include "mixers/attention/attention_elementwise_cuda.h"
#include "mixers/attention/attention_layer.h"
#include "mixers/attention/prefix_attention_cuda.h"
#include "model/cuda/layer_cuda.h"
#include "model/device_path.h"

namespace stateflow {

namespace {

struct AttentionCudaStash : Stash {
  Tensor x;
  Tensor qp, kp, rq, rk;  // before QK-norm, and the norms' rstd (qk_norm only)
  Tensor q;               // after norm and RoPE
  State kv;               // the bf16 K/V prefix
  Tensor o, lse;
  Tensor gate, y;         // output_gate only; else y = o
};

}  // namespace

Tensor Attention::forward_cuda(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                               std::unique_ptr<Stash>& stash) {
  check_chunk(ctx, x, state_in);
  const int64_t rows = x.dim(0), B = ctx.batch, L = ctx.len;
  const int64_t QW = Hq_ * dh_, KW = Hkv_ * dh_;
  const AttentionDims d{B, L, ctx.offset, ctx.seq_len, Hq_, Hkv_, dh_, 1.0 / std::sqrt(double(dh_))};
  check_attention_dims_cuda(d);  // before any work: an unsupported head_dim names itself
  const CublasGemm& gemm = cublas_for_thread();
  const cudaStream_t st = gemm.stream();
  auto s = std::make_unique<AttentionCudaStash>();
  s->x = x;
  auto proj = [&](const Param& W, int64_t out) {
    Tensor y = bf16_out({rows, out});
    linear_forward_cuda<bf16, bf16>(gemm, bf16_ptr(x), bf16_ptr(W.value_bf16), bf16_ptr(y), rows, D_, out, B);
    return y;
  };
  Tensor k;
  if (cfg_.qk_norm) {
    s->qp = proj(Wq_, QW), s->kp = proj(Wk_, KW);
    s->q = bf16_out({rows, QW}), k = bf16_out({rows, KW});
    s->rq = f32_out({rows * Hq_}), s->rk = f32_out({rows * Hkv_});
    rmsnorm_forward_cuda<bf16>(bf16_ptr(s->qp), f32_ptr(q_norm_.value), bf16_ptr(s->q), f32_ptr(s->rq), rows * Hq_,
                               dh_, cfg_.norm_eps, st);
    rmsnorm_forward_cuda<bf16>(bf16_ptr(s->kp), f32_ptr(k_norm_.value), bf16_ptr(k), f32_ptr(s->rk), rows * Hkv_,
                               dh_, cfg_.norm_eps, st);
  } else {
    s->q = proj(Wq_, QW), k = proj(Wk_, KW);
  }
  RopeDims rope{B, L, ctx.offset, Hq_, dh_, cfg_.rotary_dims(), cfg_.rope_theta};
  rope_forward_cuda(rope, bf16_ptr(s->q), st);
  rope.heads = Hkv_;
  rope_forward_cuda(rope, bf16_ptr(k), st);

  s->kv = prefix_buffers(ctx, state_in, DType::BF16, Device::CUDA, "K/V prefix");
  const PrefixRows chunk_rows{B, ctx.seq_len, ctx.offset, L, KW};
  write_prefix_rows_cuda(chunk_rows, bf16_ptr(k), bf16_ptr(s->kv[kKeys]), st);
  write_prefix_rows_cuda(chunk_rows, bf16_ptr(proj(Wv_, KW)), bf16_ptr(s->kv[kValues]), st);
  state_out = s->kv;

  s->o = bf16_out({rows, QW}), s->lse = f32_out({rows * Hq_});
  {
    DeviceBuffer ws = cuda_scratch(prefix_attention_workspace_bytes(d));
    prefix_attention_forward_cuda(d, bf16_ptr(s->q), bf16_ptr(s->kv[kKeys]), bf16_ptr(s->kv[kValues]),
                                  bf16_ptr(s->o), f32_ptr(s->lse), ws.get(), st);
  }
  s->y = s->o;
  if (cfg_.output_gate) {
    s->gate = proj(Wg_, QW), s->y = bf16_out({rows, QW});
    sigmoid_gate_forward_cuda(bf16_ptr(s->o), bf16_ptr(s->gate), bf16_ptr(s->y), rows * QW, st);
  }
  Tensor out = bf16_out({rows, D_});
  linear_forward_cuda<bf16, bf16>(gemm, bf16_ptr(s->y), bf16_ptr(Wo_.value_bf16), bf16_ptr(out), rows, QW, D_, B);
  stash = std::move(s);
  return out;
}

Tensor Attention::backward_cuda(const ChunkCtx& ctx, const Tensor& dout, const State& dstate_out, State& dstate_in,
                                Stash& stash) {
  auto& s = static_cast<AttentionCudaStash&>(stash);
  const int64_t rows = dout.dim(0), B = ctx.batch, L = ctx.len;
  const int64_t QW = Hq_ * dh_, KW = Hkv_ * dh_;
  const CublasGemm& gemm = cublas_for_thread();
  const cudaStream_t st = gemm.stream();

  // output projection and gate
  linear_backward_weight_cuda<bf16>(gemm, bf16_ptr(s.y), bf16_ptr(dout), f32_ptr(Wo_.grad), rows, QW, D_, B);
  Tensor dy = bf16_zeros({rows, QW});
  linear_backward_data_cuda<bf16, bf16>(gemm, bf16_ptr(dout), bf16_ptr(Wo_.value_bf16), bf16_ptr(dy), rows, QW, D_, B);
  Tensor d_o = dy, dgate;
  if (cfg_.output_gate) {
    d_o = bf16_out({rows, QW}), dgate = bf16_out({rows, QW});
    sigmoid_gate_backward_cuda(bf16_ptr(s.o), bf16_ptr(s.gate), bf16_ptr(dy), bf16_ptr(d_o), bf16_ptr(dgate),
                               rows * QW, st);
  }

  // attention: dq, and this chunk's queries' share added into the fp32 dK/dV rows of chunks 0..c
  dstate_in = prefix_buffers(ctx, dstate_out, DType::F32, Device::CUDA, "K/V prefix gradient");
  const AttentionDims d{B, L, ctx.offset, ctx.seq_len, Hq_, Hkv_, dh_, 1.0 / std::sqrt(double(dh_))};
  Tensor dq = bf16_out({rows, QW});
  {
    DeviceBuffer ws = cuda_scratch(prefix_attention_workspace_bytes(d));
    prefix_attention_backward_cuda(d, bf16_ptr(s.q), bf16_ptr(s.kv[kKeys]), bf16_ptr(s.kv[kValues]), bf16_ptr(s.o),
                                   f32_ptr(s.lse), bf16_ptr(d_o), bf16_ptr(dq), f32_ptr(dstate_in[kKeys]),
                                   f32_ptr(dstate_in[kValues]), ws.get(), st);
  }
  // Every later chunk has run its backward: this chunk's rows are complete (attention_layer.h).
  Tensor dk = bf16_out({rows, KW}), dv = bf16_out({rows, KW});
  const PrefixRows chunk_rows{B, ctx.seq_len, ctx.offset, L, KW};
  take_prefix_rows_cuda(chunk_rows, f32_ptr(dstate_in[kKeys]), bf16_ptr(dk), st);
  take_prefix_rows_cuda(chunk_rows, f32_ptr(dstate_in[kValues]), bf16_ptr(dv), st);

  RopeDims rope{B, L, ctx.offset, Hq_, dh_, cfg_.rotary_dims(), cfg_.rope_theta};
  rope_backward_cuda(rope, bf16_ptr(dq), st);
  rope.heads = Hkv_;
  rope_backward_cuda(rope, bf16_ptr(dk), st);
  Tensor dqp = dq, dkp = dk;
  if (cfg_.qk_norm) {
    dqp = bf16_out({rows, QW}), dkp = bf16_out({rows, KW});
    auto norm_back = [&](const Tensor& xp, Param& w, const Tensor& rstd, const Tensor& dn, const Tensor& dxp,
                         int64_t heads) {
      const TokenRows per_head{B, heads};  // one norm row per token and head
      DeviceBuffer ws = cuda_scratch(norm_backward_workspace_bytes(rows * heads, dh_, per_head));
      rmsnorm_backward_cuda<bf16>(bf16_ptr(xp), f32_ptr(w.value), f32_ptr(rstd), bf16_ptr(dn), bf16_ptr(dxp),
                                  f32_ptr(w.grad), rows * heads, dh_, per_head, ws.get(), st);
    };
    norm_back(s.qp, q_norm_, s.rq, dq, dqp, Hq_);
    norm_back(s.kp, k_norm_, s.rk, dk, dkp, Hkv_);
  }

  // input projections
  Tensor dx = bf16_zeros({rows, D_});
  auto proj_back = [&](Param& W, const Tensor& dY, int64_t out) {
    linear_backward_weight_cuda<bf16>(gemm, bf16_ptr(s.x), bf16_ptr(dY), f32_ptr(W.grad), rows, D_, out, B);
    linear_backward_data_cuda<bf16, bf16>(gemm, bf16_ptr(dY), bf16_ptr(W.value_bf16), bf16_ptr(dx), rows, D_, out, B);
  };
  proj_back(Wq_, dqp, QW), proj_back(Wk_, dkp, KW), proj_back(Wv_, dv, KW);
  if (cfg_.output_gate) proj_back(Wg_, dgate, QW);
  return dx;
}

static const DevicePathRegistration registered = device_path_of<Attention>("attention");

}  // namespace stateflow
