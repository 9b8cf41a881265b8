// CPU-only builds: the layers' GPU paths (model/cuda/) are absent. They are unreachable (no
// device tensor can exist without the CUDA backend), but the layers still name them.
#include "model/embedding_layer.h"
#include "model/gdn_layer.h"
#include "model/lm_head.h"
#include "model/mlp_layer.h"
#include "model/residual.h"

namespace stateflow {

[[noreturn]] static void no_cuda() { fail("this build has no CUDA support: rebuild with nvcc found by CMake"); }

Tensor Embedding::forward_cuda(const Tensor&, std::unique_ptr<Stash>&) { no_cuda(); }
Tensor Embedding::backward_cuda(const ChunkCtx&, const Tensor&, Stash&) { no_cuda(); }
Tensor PreNormResidual::forward_cuda(const ChunkCtx&, const Tensor&, const State&, State&, std::unique_ptr<Stash>&) {
  no_cuda();
}
Tensor PreNormResidual::backward_cuda(const ChunkCtx&, const Tensor&, const State&, State&, Stash&) { no_cuda(); }
Tensor GatedDeltaNet::forward_cuda(const ChunkCtx&, const Tensor&, const State&, State&, std::unique_ptr<Stash>&) {
  no_cuda();
}
Tensor GatedDeltaNet::backward_cuda(const ChunkCtx&, const Tensor&, const State&, State&, Stash&) { no_cuda(); }
Tensor SwiGluMlp::forward_cuda(const Tensor&, std::unique_ptr<Stash>&) { no_cuda(); }
Tensor SwiGluMlp::backward_cuda(const ChunkCtx&, const Tensor&, Stash&) { no_cuda(); }
Tensor LmHead::forward_cuda(const ChunkCtx&, const Tensor&, std::unique_ptr<Stash>&) { no_cuda(); }
Tensor LmHead::backward_cuda(const ChunkCtx&, Stash&) { no_cuda(); }

}  // namespace stateflow
