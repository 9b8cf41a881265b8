#include "model/embedding_layer.h"

#include "kernels/cpu/embedding.h"
#include "model/device_path.h"

namespace stateflow {

namespace {
struct EmbeddingStash : Stash {
  Tensor tokens;
};
}  // namespace

Embedding::Embedding(const ModelConfig& cfg, DType dtype, Rng& rng)
    : table_(make_param("embedding.weight", {cfg.vocab_size, cfg.d_model}, dtype)) {
  fill_normal(table_.value, rng, 1.0);  // unit rows: the first RMSNorm sees O(1) inputs
}

Tensor Embedding::forward(const ChunkCtx& ctx, const Tensor& tokens, const State& state_in, State& state_out,
                          std::unique_ptr<Stash>& stash) {
  SF_CHECK(tokens.dtype() == DType::I32, "embedding expects int32 token ids");
  if (!table_.value.on_host()) return device_path("embedding").forward(*this, ctx, tokens, state_in, state_out, stash);
  const int64_t rows = tokens.numel(), vocab = table_.value.dim(0), dim = table_.value.dim(1);
  Tensor y = Tensor::zeros({rows, dim}, table_.value.dtype());
  dispatch_float(y.dtype(), [&](auto z) {
    using T = decltype(z);
    embedding_forward<T>(tokens.data<int32_t>(), table_.value.data<T>(), y.data<T>(), rows, dim, vocab);
  });
  auto s = std::make_unique<EmbeddingStash>();
  s->tokens = tokens;
  stash = std::move(s);
  return y;
}

Tensor Embedding::backward(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                           Stash& stash) {
  if (!dy.on_host()) return device_path("embedding").backward(*this, ctx, dy, dstate_out, dstate_in, stash);
  auto& s = static_cast<EmbeddingStash&>(stash);
  dispatch_float(dy.dtype(), [&](auto z) {
    using T = decltype(z);
    embedding_backward<T>(s.tokens.data<int32_t>(), dy.data<T>(), table_.grad.data<T>(), s.tokens.numel(),
                          table_.value.dim(1));
  });
  return Tensor();  // tokens have no gradient
}

}  // namespace stateflow
