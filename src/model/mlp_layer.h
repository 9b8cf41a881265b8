// SwiGLU MLP: y = (silu(x W1) * (x W3)) W2. Stateless (per token).
#pragma once
#include "model/config.h"
#include "model/layer.h"

namespace stateflow {

class SwiGluMlp : public Layer {
 public:
  SwiGluMlp(const std::string& prefix, const ModelConfig& cfg, DType dtype, Rng& rng);
  std::string kind() const override { return "mlp"; }
  bool graph_capturable() const override { return true; }  // its GPU path keeps the graph rules
  bool adds_residual_on_device() const override { return true; }  // in the down projection's epilogue
  std::vector<Param*> params() override { return {&w1_, &w3_, &w2_}; }
  Tensor forward(const ChunkCtx& ctx, const Tensor& x, const State&, State&, std::unique_ptr<Stash>& stash) override;
  Tensor backward(const ChunkCtx& ctx, const Tensor& dy, const State&, State&, Stash& stash) override;

  // GPU path (model/cuda/mlp_layer_cuda.cpp, CUDA builds only; called through device_path("mlp")): bf16 activations,
  // bf16 GEMMs.
  Tensor forward_cuda(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                      std::unique_ptr<Stash>& stash);
  Tensor backward_cuda(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                       Stash& stash);

 private:
  template <class T> Tensor forward_impl(const Tensor& x, std::unique_ptr<Stash>& stash);
  template <class T> Tensor backward_impl(const Tensor& dy, Stash& stash);
  Param w1_, w3_, w2_;  // gate [D,F], up [D,F], down [F,D]
};

}  // namespace stateflow
