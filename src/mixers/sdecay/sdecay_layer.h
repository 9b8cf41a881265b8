// The scalar-decay linear-attention mixer (letter S), one chunk at a time:
//   q = x Wq, k = x Wk, v = x Wv, a = x Wa  ->  g = -exp(A_log) softplus(a + dt_bias)
//   -> recurrence S_t = exp(g_t) S_{t-1} + v_t k_t^T, o_t = S_t q_t / sqrt(dk)  ->  out = o Wo.
// Boundary state: {S [batch, heads, dv, dk]}. CPU only: the registry's worked example.
#pragma once
#include "model/config.h"
#include "model/mixer_layer.h"

namespace stateflow {

// The "sdecay" config section: {"heads", "head_dk", "head_dv"}.
struct SdecayConfig {
  int64_t heads, head_dk, head_dv;
};
SdecayConfig sdecay_config(const ModelConfig& cfg);

class ScalarDecayAttention : public MixerLayer<ScalarDecayAttention> {
 public:
  ScalarDecayAttention(const std::string& prefix, const ModelConfig& cfg, DType dtype, Rng& rng);
  std::string kind() const override { return "sdecay"; }
  std::vector<Param*> params() override;

 private:
  friend class MixerLayer<ScalarDecayAttention>;
  template <class T>
  Tensor forward_impl(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                      std::unique_ptr<Stash>& stash);
  template <class T>
  Tensor backward_impl(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                       Stash& stash);

  int64_t D_, H_, dk_, dv_;
  Param Wq_, Wk_, Wv_, Wa_;  // input projections [D, ...]
  Param A_log_, dt_bias_;    // decay parameters [heads]
  Param Wo_;                 // output projection [heads*dv, D]
};

}  // namespace stateflow
