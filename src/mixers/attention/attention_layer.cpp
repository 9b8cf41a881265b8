#include "mixers/attention/attention_layer.h"

#include <cmath>
#include <cstring>

#include "core/rng.h"
#include "kernels/cpu/activations.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/norms.h"
#include "mixers/attention/prefix_attention.h"
#include "mixers/attention/rope.h"

namespace stateflow {

namespace {

struct AttentionStash : Stash {
  Tensor x;                 // layer input [rows, D]
  Tensor qp, kp, rq, rk;    // projections before QK-norm and the norms' rstd (qk_norm only)
  Tensor q;                 // queries after norm and RoPE [rows, Hq*dh]
  State kv;                 // the K/V prefix buffers (rows of chunks 0..c are filled)
  Tensor o, lse;            // attention output [rows, Hq*dh], row log-sum-exp [rows*Hq]
  Tensor gate, y;           // gate pre-activation and gated output (output_gate only; else y = o)
};

// Rows [offset, offset+len) of every sequence of buf [batch, seq, width] <-> t [batch*len, width].
void copy_into_rows(Tensor& buf, const Tensor& t, int64_t batch, int64_t offset, int64_t len) {
  const int64_t seq = buf.dim(1), width = t.numel() / (batch * len), es = int64_t(dtype_size(t.dtype()));
  for (int64_t b = 0; b < batch; ++b)
    std::memcpy(static_cast<char*>(buf.raw()) + (b * seq + offset) * width * es,
                static_cast<const char*>(t.raw()) + b * len * width * es, size_t(len * width * es));
}
// The same rows moved out of buf: copied into t, then zeroed in buf.
void take_from_rows(Tensor& buf, Tensor& t, int64_t batch, int64_t offset, int64_t len) {
  const int64_t seq = buf.dim(1), width = t.numel() / (batch * len), es = int64_t(dtype_size(t.dtype()));
  for (int64_t b = 0; b < batch; ++b) {
    char* rows = static_cast<char*>(buf.raw()) + (b * seq + offset) * width * es;
    std::memcpy(static_cast<char*>(t.raw()) + b * len * width * es, rows, size_t(len * width * es));
    std::memset(rows, 0, size_t(len * width * es));
  }
}

}  // namespace

Attention::Attention(const std::string& p, int64_t d_model, int64_t n_blocks, const AttentionConfig& cfg, DType dt,
                     Rng& rng)
    : cfg_(cfg), D_(d_model), Hq_(cfg.heads), Hkv_(cfg.kv_heads), dh_(cfg.head_dim) {
  cfg_.validate();
  Wq_ = make_param(p + ".Wq", {D_, Hq_ * dh_}, dt);
  Wk_ = make_param(p + ".Wk", {D_, Hkv_ * dh_}, dt);
  Wv_ = make_param(p + ".Wv", {D_, Hkv_ * dh_}, dt);
  Wo_ = make_param(p + ".Wo", {Hq_ * dh_, D_}, dt);
  const double in_std = 1.0 / std::sqrt(double(D_));
  for (Param* w : {&Wq_, &Wk_, &Wv_}) fill_normal(w->value, rng, in_std);
  if (cfg_.output_gate) Wg_ = make_param(p + ".Wg", {D_, Hq_ * dh_}, dt), fill_normal(Wg_.value, rng, in_std);
  if (cfg_.qk_norm) {
    q_norm_ = make_param(p + ".q_norm", {dh_}, dt), k_norm_ = make_param(p + ".k_norm", {dh_}, dt);
    fill_constant(q_norm_.value, 1.0), fill_constant(k_norm_.value, 1.0);
  }
  // Residual branch output starts small so the stack is near identity at init.
  fill_normal(Wo_.value, rng, 1.0 / std::sqrt(double(Hq_ * dh_)) / std::sqrt(2.0 * double(n_blocks)));
  for (Param* w : {&Wq_, &Wk_, &Wv_, &Wg_, &Wo_}) w->gemm_operand = true;
}

std::vector<Param*> Attention::params() {
  std::vector<Param*> out{&Wq_, &Wk_, &Wv_};
  if (cfg_.output_gate) out.push_back(&Wg_);
  if (cfg_.qk_norm) out.push_back(&q_norm_), out.push_back(&k_norm_);
  out.push_back(&Wo_);
  return out;
}

State Attention::prefix_buffers(const ChunkCtx& ctx, const State& given, DType dt, Device dev,
                                const char* what) const {
  const Shape shape{ctx.batch, ctx.seq_len, Hkv_, dh_};
  if (given.empty())
    return {Tensor::zeros(shape, dt, MemCategory::KvPrefix, dev), Tensor::zeros(shape, dt, MemCategory::KvPrefix, dev)};
  SF_CHECK(given.size() == kStateSize && given[kKeys].shape() == shape && given[kValues].shape() == shape &&
               given[kKeys].dtype() == dt && given[kValues].dtype() == dt,
           "attention: the ", what, " of chunk ", ctx.chunk, " is not a pair of [", shape_str(shape), "] ",
           dtype_name(dt), " buffers (batch, sequence length, K/V heads, head_dim)");
  return given;
}

void Attention::check_chunk(const ChunkCtx& ctx, const Tensor& x, const State& state_in) const {
  const int64_t rows = x.dim(0), B = ctx.batch, L = ctx.len;
  SF_CHECK(B * L == rows, "attention: input has ", rows, " rows, expected batch ", B, " x len ", L);
  SF_CHECK(ctx.seq_len >= ctx.offset + L, "attention: a chunk at offset ", ctx.offset, " of ", L,
           " tokens needs the sequence length (ChunkCtx::seq_len = ", ctx.seq_len, ") to size its K/V prefix");
  SF_CHECK(ctx.offset == 0 || !state_in.empty(), "attention: chunk ", ctx.chunk, " at offset ", ctx.offset,
           " has no K/V prefix: chunks must go forward in order");
}

template <class T>
Tensor Attention::forward_impl(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                               std::unique_ptr<Stash>& stash) {
  check_chunk(ctx, x, state_in);
  const int64_t rows = x.dim(0), B = ctx.batch, L = ctx.len;
  const DType dt = x.dtype();
  const int64_t QW = Hq_ * dh_, KW = Hkv_ * dh_;
  auto s = std::make_unique<AttentionStash>();
  s->x = x;
  auto proj = [&](Param& W, int64_t out) {
    Tensor y = Tensor::zeros({rows, out}, dt);
    linear_forward<T>(x.data<T>(), W.value.data<T>(), y.data<T>(), rows, D_, out);
    return y;
  };
  Tensor k;
  if (cfg_.qk_norm) {
    s->qp = proj(Wq_, QW), s->kp = proj(Wk_, KW);
    s->q = Tensor::zeros({rows, QW}, dt), k = Tensor::zeros({rows, KW}, dt);
    s->rq = Tensor::zeros({rows * Hq_}, dt), s->rk = Tensor::zeros({rows * Hkv_}, dt);
    rmsnorm_forward<T>(s->qp.data<T>(), q_norm_.value.data<T>(), s->q.data<T>(), s->rq.data<T>(), rows * Hq_, dh_,
                       cfg_.norm_eps);
    rmsnorm_forward<T>(s->kp.data<T>(), k_norm_.value.data<T>(), k.data<T>(), s->rk.data<T>(), rows * Hkv_, dh_,
                       cfg_.norm_eps);
  } else {
    s->q = proj(Wq_, QW), k = proj(Wk_, KW);
  }
  RopeDims rope{B, L, ctx.offset, Hq_, dh_, cfg_.rotary_dims(), cfg_.rope_theta};
  rope_forward<T>(rope, s->q.data<T>());
  rope.heads = Hkv_;
  rope_forward<T>(rope, k.data<T>());

  // This chunk's rows of the prefix, written once; the same buffers go on to the next chunk.
  s->kv = prefix_buffers(ctx, state_in, dt, Device::CPU, "K/V prefix");
  copy_into_rows(s->kv[kKeys], k, B, ctx.offset, L);
  copy_into_rows(s->kv[kValues], proj(Wv_, KW), B, ctx.offset, L);
  state_out = s->kv;

  const AttentionDims d{B, L, ctx.offset, ctx.seq_len, Hq_, Hkv_, dh_, 1.0 / std::sqrt(double(dh_))};
  s->o = Tensor::zeros({rows, QW}, dt), s->lse = Tensor::zeros({rows * Hq_}, dt);
  prefix_attention_forward<T>(d, s->q.data<T>(), s->kv[kKeys].data<T>(), s->kv[kValues].data<T>(), s->o.data<T>(),
                              s->lse.data<T>());
  s->y = s->o;
  if (cfg_.output_gate) {
    s->gate = proj(Wg_, QW), s->y = Tensor::zeros({rows, QW}, dt);
    const T *o = s->o.data<T>(), *g = s->gate.data<T>();
    T* y = s->y.data<T>();
    for (int64_t i = 0; i < rows * QW; ++i) y[i] = o[i] * sigmoid(g[i]);
  }
  Tensor out = Tensor::zeros({rows, D_}, dt);
  linear_forward<T>(s->y.data<T>(), Wo_.value.data<T>(), out.data<T>(), rows, QW, D_);
  stash = std::move(s);
  return out;
}

template <class T>
Tensor Attention::backward_impl(const ChunkCtx& ctx, const Tensor& dout, const State& dstate_out, State& dstate_in,
                                Stash& stash) {
  auto& s = static_cast<AttentionStash&>(stash);
  const int64_t rows = dout.dim(0), B = ctx.batch, L = ctx.len;
  const DType dt = dout.dtype();
  const int64_t QW = Hq_ * dh_, KW = Hkv_ * dh_;
  auto zeros = [&](int64_t n, int64_t m) { return Tensor::zeros({n, m}, dt); };

  // output projection and gate
  linear_backward_weight<T>(s.y.data<T>(), dout.data<T>(), Wo_.grad.data<T>(), rows, QW, D_);
  Tensor dy = zeros(rows, QW);
  linear_backward_data<T>(dout.data<T>(), Wo_.value.data<T>(), dy.data<T>(), rows, QW, D_);
  Tensor d_o = dy, dgate;
  if (cfg_.output_gate) {
    d_o = zeros(rows, QW), dgate = zeros(rows, QW);
    const T *o = s.o.data<T>(), *g = s.gate.data<T>(), *dyp = dy.data<T>();
    T *dop = d_o.data<T>(), *dgp = dgate.data<T>();
    for (int64_t i = 0; i < rows * QW; ++i) {
      const T sg = sigmoid(g[i]);
      dop[i] = dyp[i] * sg, dgp[i] = dyp[i] * o[i] * sg * (T(1) - sg);
    }
  }

  // attention: dq, and this chunk's queries' share added into dK/dV rows of chunks 0..c
  dstate_in = prefix_buffers(ctx, dstate_out, dt, Device::CPU, "K/V prefix gradient");
  const AttentionDims d{B, L, ctx.offset, ctx.seq_len, Hq_, Hkv_, dh_, 1.0 / std::sqrt(double(dh_))};
  Tensor dq = zeros(rows, QW);
  prefix_attention_backward<T>(d, s.q.data<T>(), s.kv[kKeys].data<T>(), s.kv[kValues].data<T>(), s.o.data<T>(),
                               s.lse.data<T>(), d_o.data<T>(), dq.data<T>(), dstate_in[kKeys].data<T>(),
                               dstate_in[kValues].data<T>());
  // Every later chunk has run its backward before this one: this chunk's rows are complete.
  // Taking them out leaves the gradient of the state that entered the chunk (rows [0, offset);
  // the rest of that state is overwritten, never read), so after chunk 0 it is all zeros.
  Tensor dk = zeros(rows, KW), dv = zeros(rows, KW);
  take_from_rows(dstate_in[kKeys], dk, B, ctx.offset, L);
  take_from_rows(dstate_in[kValues], dv, B, ctx.offset, L);

  RopeDims rope{B, L, ctx.offset, Hq_, dh_, cfg_.rotary_dims(), cfg_.rope_theta};
  rope_backward<T>(rope, dq.data<T>());
  rope.heads = Hkv_;
  rope_backward<T>(rope, dk.data<T>());
  Tensor dqp = dq, dkp = dk;
  if (cfg_.qk_norm) {
    dqp = zeros(rows, QW), dkp = zeros(rows, KW);
    rmsnorm_backward<T>(s.qp.data<T>(), q_norm_.value.data<T>(), s.rq.data<T>(), dq.data<T>(), dqp.data<T>(),
                        q_norm_.grad.data<T>(), rows * Hq_, dh_);
    rmsnorm_backward<T>(s.kp.data<T>(), k_norm_.value.data<T>(), s.rk.data<T>(), dk.data<T>(), dkp.data<T>(),
                        k_norm_.grad.data<T>(), rows * Hkv_, dh_);
  }

  // input projections
  Tensor dx = zeros(rows, D_);
  auto proj_back = [&](Param& W, const Tensor& dY, int64_t out) {
    linear_backward_weight<T>(s.x.data<T>(), dY.data<T>(), W.grad.data<T>(), rows, D_, out);
    linear_backward_data<T>(dY.data<T>(), W.value.data<T>(), dx.data<T>(), rows, D_, out);
  };
  proj_back(Wq_, dqp, QW), proj_back(Wk_, dkp, KW), proj_back(Wv_, dv, KW);
  if (cfg_.output_gate) proj_back(Wg_, dgate, QW);
  return dx;
}

}  // namespace stateflow
