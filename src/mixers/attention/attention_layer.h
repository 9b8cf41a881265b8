// Causal softmax attention as a mixer (docs/attention.md, MATH.md section 7), one chunk at a
// time, in the form of Qwen3-Next's gated attention:
//   q = x Wq, k = x Wk, v = x Wv  -> per-head RMSNorm of q and k (QK-norm)
//   -> RoPE at global positions   -> attention of the chunk's queries against the K/V rows of
//   chunks 0..c                   -> o * sigmoid(x Wg) (output gate)  -> output projection Wo.
// Grouped K/V: n_heads query heads share n_kv_heads K/V heads.
//
// The K/V prefix is the layer's boundary state: {K, V}, each [batch, seq_len, kv_heads,
// head_dim], one pair per microbatch, charged to MemCategory::KvPrefix. Chunk 0 allocates it,
// every chunk writes its own rows once and hands the same storage on to the next chunk (the
// state grows with the chunk index; its size is fixed by the sequence, ctx.seq_len). Going
// backward, the state gradient {dK, dV} is the same kind of buffer: the last chunk allocates
// it, each chunk adds its queries' share into rows 0..c, and then takes its own rows, now
// complete, back through RoPE, QK-norm and the projections. It is dropped after chunk 0.
// The chunk's stash keeps the K/V buffers too, so they live until chunk 0's backward ends.
#pragma once
#include "model/layer.h"

namespace stateflow {

struct AttentionConfig {
  int64_t n_heads = 4;       // query heads
  int64_t n_kv_heads = 2;    // K/V heads; divides n_heads
  int64_t head_dim = 8;
  int64_t rotary_dim = 0;    // leading dims of each head that RoPE rotates (even); 0: all of them
  double rope_theta = 10000.0;
  bool qk_norm = true;       // RMSNorm (learned weight per head dim) on q and k before RoPE
  bool output_gate = true;   // o * sigmoid(x Wg) before the output projection

  // Throws stateflow::Error naming the first invalid field and its accepted range.
  void validate() const;
  int64_t rotary_dims() const { return rotary_dim ? rotary_dim : head_dim; }
  // Bytes of one K/V prefix (K and V) for `batch` sequences of `seq_len` tokens.
  int64_t kv_prefix_bytes(int64_t batch, int64_t seq_len, int64_t element_bytes) const {
    return batch * seq_len * n_kv_heads * head_dim * 2 * element_bytes;
  }
};

class Attention : public Layer {
 public:
  // d_model: the model width; depth: blocks in the model (scales the output projection's init).
  Attention(const std::string& prefix, const AttentionConfig& cfg, int64_t d_model, int64_t depth, double norm_eps,
            DType dtype, Rng& rng);
  std::string kind() const override { return "attention"; }
  std::vector<Param*> params() override;
  bool stateful() const override { return true; }
  Tensor forward(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                 std::unique_ptr<Stash>& stash) override;
  Tensor backward(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                  Stash& stash) override;

  enum StateIndex { kKeys = 0, kValues = 1, kStateSize = 2 };

 private:
  template <class T>
  Tensor forward_impl(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                      std::unique_ptr<Stash>& stash);
  template <class T>
  Tensor backward_impl(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                       Stash& stash);
  // The K/V buffers of a microbatch: those that came in, or new ones for seq_len rows.
  State prefix_buffers(const ChunkCtx& ctx, const State& given, DType dt, const char* what) const;

  AttentionConfig cfg_;
  int64_t D_, Hq_, Hkv_, dh_;
  double norm_eps_;
  Param Wq_, Wk_, Wv_;  // input projections [D, heads*head_dim]
  Param Wg_;            // output gate [D, n_heads*head_dim] (when output_gate)
  Param q_norm_, k_norm_;  // QK-norm weights [head_dim] (when qk_norm)
  Param Wo_;            // output projection [n_heads*head_dim, D]
};

}  // namespace stateflow
