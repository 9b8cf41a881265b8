// Causal softmax attention as a mixer (docs/attention.md, MATH.md section 7), one chunk at a
// time, in the form of Qwen3-Next's gated attention:
//   q = x Wq, k = x Wk, v = x Wv  -> per-head RMSNorm of q and k (QK-norm)
//   -> RoPE at global positions   -> attention of the chunk's queries against the K/V rows of
//   chunks 0..c                   -> o * sigmoid(x Wg) (output gate)  -> output projection Wo.
// Grouped K/V: `heads` query heads share `kv_heads` K/V heads.
//
// The K/V prefix is the layer's boundary state: {K, V}, each [batch, seq_len, kv_heads,
// head_dim], one pair per microbatch, charged to MemCategory::KvPrefix. Chunk 0 allocates it,
// every chunk writes its own rows once and hands the same storage on to the next chunk (the
// state grows with the chunk index; its size is fixed by the sequence, ctx.seq_len). Going
// backward, the state gradient {dK, dV} is the same kind of buffer: the last chunk allocates
// it (or gets it from the caller), each chunk adds its queries' share into rows 0..c, then
// takes its own rows out, now complete, back through RoPE, QK-norm and the projections. What
// it hands back is the gradient of the state that entered it: zero past its offset, all zero
// after chunk 0 (the prefix that enters chunk 0 is never read). Dropped after chunk 0.
// The chunk's stash keeps the K/V buffers too, so they live until chunk 0's backward ends.
#pragma once
#include "mixers/attention/attention_config.h"
#include "model/mixer_layer.h"

namespace stateflow {

class Rng;

class Attention : public MixerLayer<Attention> {
 public:
  // n_blocks: residual blocks in the model, which scales the output projection's init.
  Attention(const std::string& prefix, int64_t d_model, int64_t n_blocks, const AttentionConfig& cfg, DType dtype,
            Rng& rng);
  std::string kind() const override { return "attention"; }
  std::vector<Param*> params() override;

  enum StateIndex { kKeys = 0, kValues = 1, kStateSize = 2 };

  // GPU path (mixers/attention/attention_layer_cuda.cpp, CUDA builds only; called through
  // device_path("attention")): bf16 activations and K/V prefix, fp32 prefix gradient.
  Tensor forward_cuda(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                      std::unique_ptr<Stash>& stash);
  Tensor backward_cuda(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                       Stash& stash);

 private:
  friend class MixerLayer<Attention>;
  template <class T>
  Tensor forward_impl(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                      std::unique_ptr<Stash>& stash);
  template <class T>
  Tensor backward_impl(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                       Stash& stash);
  // The K/V buffers of a microbatch: those that came in (checked), or new zeroed ones for seq_len rows.
  State prefix_buffers(const ChunkCtx& ctx, const State& given, DType dt, Device dev, const char* what) const;
  // Throws Error when x and ctx disagree, or a chunk past the first comes without its prefix.
  void check_chunk(const ChunkCtx& ctx, const Tensor& x, const State& state_in) const;

  AttentionConfig cfg_;
  int64_t D_, Hq_, Hkv_, dh_;
  Param Wq_, Wk_, Wv_;  // input projections [D, heads*head_dim]
  Param Wg_;            // output gate [D, heads*head_dim] (when output_gate)
  Param q_norm_, k_norm_;  // QK-norm weights [head_dim] (when qk_norm)
  Param Wo_;            // output projection [heads*head_dim, D]
};

}  // namespace stateflow
