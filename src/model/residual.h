// Pre-norm residual block: y = x + inner(RMSNorm(x)). The inner layer's boundary state and
// its gradient pass straight through, so a GDN block is stateful exactly as its mixer is.
#pragma once
#include "model/config.h"
#include "model/layer.h"

namespace stateflow {

// Whether this thread's GPU blocks hand their input x to the inner layer's last GEMM
// (ChunkCtx::residual) where the inner layer adds_residual_on_device(), instead of adding it with a
// kernel of their own after it: one launch and one bf16 rounding fewer per block and chunk. The
// lever residual_epilogue's setting unless a test switches it (model/cuda/residual_cuda.cpp).
bool& residual_epilogue_for_thread();

class PreNormResidual : public Layer {
 public:
  PreNormResidual(const std::string& prefix, const ModelConfig& cfg, DType dtype, std::unique_ptr<Layer> inner);
  std::string kind() const override { return inner_->kind() + "_block"; }
  std::vector<Param*> params() override;
  bool stateful() const override { return inner_->stateful(); }
  // The norm and the residual add keep the graph rules; the inner layer says for itself.
  bool graph_capturable() const override { return inner_->graph_capturable(); }
  Tensor forward(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                 std::unique_ptr<Stash>& stash) override;
  Tensor backward(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                  Stash& stash) override;
  Layer& inner() { return *inner_; }

  // GPU path (model/cuda/residual_cuda.cpp, CUDA builds only; called through device_path("prenorm_residual")): bf16
  // activations, fp32 norm weight.
  Tensor forward_cuda(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                      std::unique_ptr<Stash>& stash);
  Tensor backward_cuda(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                       Stash& stash);

 private:
  // Whether the inner layer adds x to its output itself (residual_epilogue_for_thread()).
  bool inner_adds_residual() const;
  Param norm_;  // [d_model]
  double eps_;
  std::unique_ptr<Layer> inner_;
};

}  // namespace stateflow
