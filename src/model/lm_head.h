// Final RMSNorm + LM head + cross-entropy: x [batch*len, D] -> the chunk's share of the loss
// (a 1-element tensor: sum of token losses times ctx.loss_scale). Stateless. The logits are
// recomputed in backward rather than stashed: they are the largest activation of the model.
#pragma once
#include "model/config.h"
#include "model/layer.h"

namespace stateflow {

class LmHead : public Layer {
 public:
  LmHead(const ModelConfig& cfg, DType dtype, Rng& rng);
  std::string kind() const override { return "lm_head"; }
  std::vector<Param*> params() override { return {&norm_, &proj_}; }
  Tensor forward(const ChunkCtx& ctx, const Tensor& x, const State&, State&, std::unique_ptr<Stash>& stash) override;
  // dy is ignored: the head starts backpropagation from the loss (d loss = ctx.loss_scale).
  Tensor backward(const ChunkCtx& ctx, const Tensor& dy, const State&, State&, Stash& stash) override;

  // GPU path (model/cuda/lm_head_cuda.cpp, CUDA builds only; called through device_path("lm_head")): bf16 GEMMs,
  // logits only per row block.
  Tensor forward_cuda(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                      std::unique_ptr<Stash>& stash);
  Tensor backward_cuda(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                       Stash& stash);

 private:
  template <class T> Tensor forward_impl(const ChunkCtx& ctx, const Tensor& x, std::unique_ptr<Stash>& stash);
  template <class T> Tensor backward_impl(const ChunkCtx& ctx, Stash& stash);
  Param norm_;  // [D]
  Param proj_;  // [D, vocab]
  double eps_;
};

}  // namespace stateflow
