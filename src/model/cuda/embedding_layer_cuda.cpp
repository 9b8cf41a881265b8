// Embedding on the GPU: fp32 table and gradient, bf16 output. Token ids are checked on the
// host (the kernel cannot throw), then copied over without the host waiting for the GPU.
#include "kernels/cuda/embedding_cuda.h"
#include "model/cuda/layer_cuda.h"
#include "model/embedding_layer.h"
#include "model/device_path.h"

namespace stateflow {

namespace {
struct EmbeddingCudaStash : Stash {
  Tensor tokens;  // on the device
};
}  // namespace

Tensor Embedding::forward_cuda(const ChunkCtx&, const Tensor& tokens, const State&, State&, std::unique_ptr<Stash>& stash) {
  const int64_t rows = tokens.numel(), vocab = table_.value.dim(0), dim = table_.value.dim(1);
  const Tensor host = tokens.on_host() ? tokens : tokens.to(Device::CPU);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t t = host.data<int32_t>()[r];
    SF_CHECK(0 <= t && t < vocab, "embedding: token id ", t, " at row ", r, " is outside the vocabulary [0, ", vocab,
             "): check the data's tokenizer against the model's vocab_size");
  }
  auto s = std::make_unique<EmbeddingCudaStash>();
  s->tokens = tokens.on_host() ? to_device_async(tokens) : tokens;
  Tensor y = bf16_out({rows, dim});  // every row written (a bad id's row as zeros)
  embedding_forward_cuda<bf16>(s->tokens.data<int32_t>(), f32_ptr(table_.value), bf16_ptr(y), rows, dim, vocab,
                               nullptr, layer_stream());
  stash = std::move(s);
  return y;
}

Tensor Embedding::backward_cuda(const ChunkCtx& ctx, const Tensor& dy, const State&, State&, Stash& stash) {
  auto& s = static_cast<EmbeddingCudaStash&>(stash);
  const int64_t rows = s.tokens.numel();
  DeviceBuffer ws = cuda_scratch(embedding_backward_workspace_bytes(rows));
  embedding_backward_cuda<bf16>(s.tokens.data<int32_t>(), bf16_ptr(dy), f32_ptr(table_.grad), rows,
                                table_.value.dim(1), table_.value.dim(0), ctx.batch, ws.get(), layer_stream());
  return Tensor();  // tokens have no gradient
}

static const DevicePathRegistration registered = device_path_of<Embedding>("embedding");

}  // namespace stateflow
