// SwiGluMlp on the GPU: the CPU forward_impl/backward_impl with bf16 activations and GEMM
// weights, fp32 weight gradients.
#include "kernels/cuda/gemm_cuda.h"
#include "kernels/cuda/side_stream_cuda.h"
#include "kernels/cuda/swiglu_cuda.h"
#include "model/cuda/layer_cuda.h"
#include "model/mlp_layer.h"
#include "model/device_path.h"
#include "core/op_scope.h"

namespace stateflow {

namespace {
struct MlpCudaStash : Stash {
  Tensor x, a, b, h;
};
}  // namespace

Tensor SwiGluMlp::forward_cuda(const ChunkCtx&, const Tensor& x, const State&, State&, std::unique_ptr<Stash>& stash) {
  const int64_t rows = x.dim(0), D = w1_.value.dim(0), F = w1_.value.dim(1);
  const CublasGemm& g = cublas_for_thread();
  auto s = std::make_unique<MlpCudaStash>();
  s->x = x;
  s->a = bf16_out({rows, F}), s->b = bf16_out({rows, F}), s->h = bf16_out({rows, F});
  Tensor y = bf16_out({rows, D});
  {
    // x W3 on the side stream beside x W1 (a short chunk's GEMM alone leaves SMs idle)
    OpScope part("mlp.up_proj");
    SideWork side;
    linear_forward_cuda<bf16, bf16>(side.fork(), bf16_ptr(x), bf16_ptr(w3_.value_bf16), bf16_ptr(s->b), rows, D, F);
    linear_forward_cuda<bf16, bf16>(g, bf16_ptr(x), bf16_ptr(w1_.value_bf16), bf16_ptr(s->a), rows, D, F);
    side.join();
  }
  {
    OpScope part("mlp.swiglu");
    swiglu_forward_cuda<bf16>(bf16_ptr(s->a), bf16_ptr(s->b), bf16_ptr(s->h), rows * F, g.stream());
  }
  {
    OpScope part("mlp.down_proj");
    linear_forward_cuda<bf16, bf16>(g, bf16_ptr(s->h), bf16_ptr(w2_.value_bf16), bf16_ptr(y), rows, F, D);
  }
  stash = std::move(s);
  return y;
}

Tensor SwiGluMlp::backward_cuda(const ChunkCtx& ctx, const Tensor& dy, const State&, State&, Stash& stash) {
  // Weight gradients run on the side stream beside the rest (kernels/cuda/side_stream_cuda.h)
  SideWork side;
  auto& s = static_cast<MlpCudaStash&>(stash);
  const int64_t rows = dy.dim(0), D = w1_.value.dim(0), F = w1_.value.dim(1);
  const CublasGemm& g = cublas_for_thread();
  // dh and dx: their first product overwrites them (no zero-fill)
  Tensor dh = bf16_out({rows, F}), da = bf16_out({rows, F}), db = bf16_out({rows, F});
  Tensor dx = bf16_out({rows, D});
  {
    OpScope part("mlp.down_proj.wgrad");
    linear_backward_weight_cuda<bf16>(side.fork(), bf16_ptr(s.h), bf16_ptr(dy), f32_ptr(w2_.grad), rows, F, D,
                                      ctx.batch);
  }
  {
    OpScope part("mlp.down_proj.dgrad");
    linear_backward_data_cuda<bf16, bf16>(g, bf16_ptr(dy), bf16_ptr(w2_.value_bf16), bf16_ptr(dh), rows, F, D,
                                          /*accumulate=*/false);
  }
  {
    OpScope part("mlp.swiglu");
    swiglu_backward_cuda<bf16>(bf16_ptr(s.a), bf16_ptr(s.b), bf16_ptr(dh), bf16_ptr(da), bf16_ptr(db), rows * F,
                               g.stream());
  }
  {
    OpScope part("mlp.up_proj.wgrad");
    const CublasGemm& wg = side.fork();
    linear_backward_weight_cuda<bf16>(wg, bf16_ptr(s.x), bf16_ptr(da), f32_ptr(w1_.grad), rows, D, F, ctx.batch);
    linear_backward_weight_cuda<bf16>(wg, bf16_ptr(s.x), bf16_ptr(db), f32_ptr(w3_.grad), rows, D, F, ctx.batch);
  }
  {
    OpScope part("mlp.up_proj.dgrad");
    linear_backward_data_cuda<bf16, bf16>(g, bf16_ptr(da), bf16_ptr(w1_.value_bf16), bf16_ptr(dx), rows, D, F,
                                          /*accumulate=*/false);
    linear_backward_data_cuda<bf16, bf16>(g, bf16_ptr(db), bf16_ptr(w3_.value_bf16), bf16_ptr(dx), rows, D, F);
  }
  // The weight gradients may go on beside the next layer's backward (side_stream_cuda.h)
  side.join_later({s.x, s.h, dy, da, db});
  return dx;
}

static const DevicePathRegistration registered = device_path_of<SwiGluMlp>("mlp");

}  // namespace stateflow
