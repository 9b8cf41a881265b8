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

 private:
  // GPU path (model/cuda/embedding_layer_cuda.cpp): fp32 table, bf16 output.
  Tensor forward_cuda(const Tensor& tokens, std::unique_ptr<Stash>& stash);
  Tensor backward_cuda(const ChunkCtx& ctx, const Tensor& dy, Stash& stash);
  Param table_;  // [vocab, d_model]
};

}  // namespace stateflow
