// The Gated DeltaNet mixer (MATH.md section 2), one chunk at a time:
//   projections q~ k~ v~ a b z  ->  short conv + SiLU on q~ k~ v~ (carried prefixes)
//   -> per-head L2 norm of q, k  -> gates g, beta  -> chunkwise GDN core (carried state S)
//   -> gated RMSNorm with silu(z)  -> output projection.
// q and k have `heads` heads; v, the gates, the core, the state and the output gate have
// `value_heads` (a multiple: grouped values, mixers/gdn/gdn_groups.h).
// Boundary state: {S [batch, value_heads, dv, dk], conv prefixes of q~, k~, v~ [batch, K-1, channels]}.
#pragma once
#include "mixers/gdn/gdn_config.h"
#include "model/mixer_layer.h"

namespace stateflow {

class GatedDeltaNet : public MixerLayer<GatedDeltaNet> {
 public:
  GatedDeltaNet(const std::string& prefix, const ModelConfig& cfg, DType dtype, Rng& rng);
  std::string kind() const override { return "gdn"; }
  bool adds_residual_on_device() const override { return true; }  // in the output projection's epilogue
  std::vector<Param*> params() override;

  // Indices into the boundary State.
  enum StateIndex { kS = 0, kPrefixQ = 1, kPrefixK = 2, kPrefixV = 3, kStateSize = 4 };

  // GPU path (mixers/gdn/gdn_layer_cuda.cpp, CUDA builds only; called through device_path("gdn")): bf16 activations
  // and GEMMs; boundary state S fp32, conv prefixes bf16 (what the conv reads), their gradients fp32.
  Tensor forward_cuda(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                      std::unique_ptr<Stash>& stash);
  Tensor backward_cuda(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                       Stash& stash);

 private:
  friend class MixerLayer<GatedDeltaNet>;
  GatedDeltaNet(const std::string& prefix, const ModelConfig& cfg, const GdnConfig& g, DType dtype, Rng& rng);
  template <class T>
  Tensor forward_impl(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                      std::unique_ptr<Stash>& stash);
  template <class T>
  Tensor backward_impl(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                       Stash& stash);

  // q (or k), one copy per value head: the tensor itself when ungrouped.
  template <class T>
  Tensor per_value_head(const Tensor& qk) const;
  // Its gradient summed over each group (the tensor itself when ungrouped).
  template <class T>
  Tensor sum_over_groups(const Tensor& dqk) const;

  int64_t D_, H_, Hv_, dk_, dv_, K_, C_;  // H_ q/k heads, Hv_ value heads
  double norm_eps_;
  bool keep_sweep_;  // gdn.keep_sweep: the GPU stash keeps the core's forward sweep (gdn_config.h)
  Param Wq_, Wk_, Wv_, Wa_, Wb_, Wg_;  // input projections [D, ...]
  Param conv_q_, conv_k_, conv_v_;     // depthwise conv weights [channels, K]
  Param A_log_, dt_bias_;              // gate parameters [value_heads]
  Param out_norm_;                     // gated RMSNorm weight [dv], shared by heads
  Param Wo_;                           // output projection [value_heads*dv, D]
};

}  // namespace stateflow
