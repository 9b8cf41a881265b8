// Token embedding: int32 tokens [batch*len] -> x [batch*len, d_model]. Stateless.
#pragma once
#include "model/config.h"
#include "model/layer.h"

namespace stateflow {

class Embedding : public Layer {
 public:
  Embedding(const ModelConfig& cfg, DType dtype, Rng& rng);
  std::string kind() const override { return "embedding"; }
  std::vector<Param*> params() override { return {&table_}; }
  Tensor forward(const ChunkCtx& ctx, const Tensor& tokens, const State&, State&,
                 std::unique_ptr<Stash>& stash) override;
  Tensor backward(const ChunkCtx& ctx, const Tensor& dy, const State&, State&, Stash& stash) override;

  // GPU path (model/cuda/embedding_layer_cuda.cpp, CUDA builds only; called through device_path("embedding")): fp32
  // table, bf16 output.
  Tensor forward_cuda(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                      std::unique_ptr<Stash>& stash);
  Tensor backward_cuda(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                       Stash& stash);

 private:
  Param table_;  // [vocab, d_model]
};

}  // namespace stateflow
