// The Mamba-3 mixer (docs/mamba3.md; MATH.md section 6), one chunk at a time:
//   projections z, x, B, C, dd_dt, dd_A, trap, ang  ->  gates dt, A dt, lam  ->  cumulative
//   rotary angle phi (carried)  ->  RMSNorm of B and C, per-head biases, rotation by phi
//   ->  rank-R inputs x * mimo_x  ->  chunked core (carried S, x_prev, b_prev) with D skip
//   ->  silu(z) gate and rank combination  ->  output projection.
// Boundary state: {S [batch, H, P, N], phi [batch, H, NA], b_prev [batch, H, R, N],
// x_prev [batch, H, R, P]}, all fp32 on the GPU too.
#pragma once
#include "mixers/mamba3/mamba3_config.h"
#include "model/mixer_layer.h"

namespace stateflow {

class Rng;

class Mamba3Mixer : public MixerLayer<Mamba3Mixer> {
 public:
  // Sizes from cfg's "mamba3" section; d_model, norm_eps and the block count from cfg.
  Mamba3Mixer(const std::string& prefix, const ModelConfig& cfg, DType dtype, Rng& rng);
  std::string kind() const override { return "mamba3"; }
  std::vector<Param*> params() override;

  // Indices into the boundary State.
  enum StateIndex { kS = 0, kPhi = 1, kBPrev = 2, kXPrev = 3, kStateSize = 4 };

  // GPU path (mamba3_layer_cuda.cpp, CUDA builds only; called through device_path("mamba3")):
  // bf16 activations and GEMMs, fp32 gates, angles, boundary state and its gradients.
  Tensor forward_cuda(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                      std::unique_ptr<Stash>& stash);
  Tensor backward_cuda(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                       Stash& stash);

 private:
  friend class MixerLayer<Mamba3Mixer>;
  template <class T>
  Tensor forward_impl(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                      std::unique_ptr<Stash>& stash);
  template <class T>
  Tensor backward_impl(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                       Stash& stash);
  // Throws Error unless x is ctx.batch sequences of ctx.len rows and state_in is empty or complete.
  void check_input(const ChunkCtx& ctx, const Tensor& x, const State& state_in) const;
  State zero_state(int64_t batch, DType dtype) const;  // under MemCategory::BoundaryState
  State device_state(int64_t batch) const;             // GPU: fp32, uninitialised (CUDA builds)

  Mamba3Config cfg_;
  int64_t D_, H_, P_, N_, R_, G_, NA_;
  double norm_eps_;  // RMSNorm of B and C
  Param Wz_, Wx_, WB_, WC_, Wdt_, WA_, Wtrap_, Wang_;  // input projections [D, ...]
  Param dt_bias_;                                      // [H]
  Param B_norm_, C_norm_;                              // RMSNorm weights [N], shared by groups and ranks
  Param B_bias_, C_bias_;                              // [H, R, N]
  Param D_skip_;                                       // [H]
  Param mimo_x_, mimo_z_, mimo_o_;                     // [H, R, P]; MIMO (R > 1) only
  Param out_norm_;                                     // [P], shared by heads and ranks; output_norm only
  Param Wo_;                                           // output projection [H*P, D]
};

}  // namespace stateflow
