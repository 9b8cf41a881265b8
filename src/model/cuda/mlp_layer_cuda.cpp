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
// a = x W1 and b = x W3: two tensors, or with W1 and W3 sharing a bf16 copy (lever fused_mlp) the
// two column blocks of one [rows, 2F] GEMM output (then a holds both, b is empty and b_at points
// into a).
struct MlpCudaStash : Stash {
  Tensor x, a, b, h;
  int64_t ld = 0;  // a's and b's row stride
  bf16* b_at = nullptr;
};
// Whether W1 and W3 share one bf16 copy, W1's columns first (model/param.h): one GEMM each way.
bool fused(const Param& w1, const Param& w3) {
  return w1.bf16_ld > 0 && w1.bf16_ld == w3.bf16_ld && w1.bf16_col == 0 && w3.bf16_col == w1.value.dim(1);
}
}  // namespace

Tensor SwiGluMlp::forward_cuda(const ChunkCtx& ctx, const Tensor& x, const State&, State&, std::unique_ptr<Stash>& stash) {
  // With ctx.residual: y = residual + h W2 (model/residual.h, lever residual_epilogue)
  const int64_t rows = x.dim(0), D = w1_.value.dim(0), F = w1_.value.dim(1);
  const CublasGemm& g = cublas_for_thread();
  auto s = std::make_unique<MlpCudaStash>();
  s->x = x;
  s->h = bf16_out({rows, F});
  Tensor y = bf16_out({rows, D});
  if (fused(w1_, w3_)) {
    OpScope part("mlp.up_proj");
    s->ld = 2 * F, s->a = bf16_out({rows, 2 * F});
    s->b_at = bf16_ptr(s->a) + F;
    linear_forward_cuda<bf16, bf16>(g, bf16_ptr(x), bf16_ptr(w1_.value_bf16), bf16_ptr(s->a), rows, D, 2 * F, ctx.batch);
  } else {
    // x W3 on the side stream beside x W1 (a short chunk's GEMM alone leaves SMs idle)
    OpScope part("mlp.up_proj");
    s->ld = F, s->a = bf16_out({rows, F}), s->b = bf16_out({rows, F});
    s->b_at = bf16_ptr(s->b);
    SideWork side;
    linear_forward_cuda<bf16, bf16>(side.fork(), bf16_ptr(x), bf16_ptr(w3_.value_bf16), s->b_at, rows, D, F, ctx.batch);
    linear_forward_cuda<bf16, bf16>(g, bf16_ptr(x), bf16_ptr(w1_.value_bf16), bf16_ptr(s->a), rows, D, F, ctx.batch);
    side.join();
  }
  {
    OpScope part("mlp.swiglu");
    swiglu_forward_cuda<bf16>(bf16_ptr(s->a), s->b_at, bf16_ptr(s->h), rows * F, g.stream(), F, s->ld);
  }
  {
    OpScope part("mlp.down_proj");
    linear_forward_cuda<bf16, bf16>(g, bf16_ptr(s->h), bf16_ptr(w2_.value_bf16), bf16_ptr(y), rows, F, D, ctx.batch,
                                    ctx.residual ? bf16_ptr(*ctx.residual) : nullptr);
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
  // dh and dx: their first product overwrites them (no zero-fill). da and db as a and b: with
  // fused projections the column blocks of one tensor, whose input gradient is one GEMM.
  const bool fuse = s.ld == 2 * F;
  Tensor dh = bf16_out({rows, F}), da = bf16_out({rows, s.ld}), db = fuse ? Tensor() : bf16_out({rows, F});
  bf16* const db_at = fuse ? bf16_ptr(da) + F : bf16_ptr(db);
  Tensor dx = bf16_out({rows, D});
  {
    OpScope part("mlp.down_proj.wgrad");
    linear_backward_weight_cuda<bf16>(side.fork(), bf16_ptr(s.h), bf16_ptr(dy), f32_ptr(w2_.grad), rows, F, D,
                                      ctx.batch);
  }
  {
    OpScope part("mlp.down_proj.dgrad");
    linear_backward_data_cuda<bf16, bf16>(g, bf16_ptr(dy), bf16_ptr(w2_.value_bf16), bf16_ptr(dh), rows, F, D,
                                          ctx.batch, /*accumulate=*/false);
  }
  {
    OpScope part("mlp.swiglu");
    swiglu_backward_cuda<bf16>(bf16_ptr(s.a), s.b_at, bf16_ptr(dh), bf16_ptr(da), db_at, rows * F, g.stream(), F,
                               s.ld);
  }
  {
    OpScope part("mlp.up_proj.wgrad");
    const CublasGemm& wg = side.fork();
    linear_backward_weight_cuda<bf16>(wg, bf16_ptr(s.x), bf16_ptr(da), f32_ptr(w1_.grad), rows, D, F, ctx.batch, s.ld);
    linear_backward_weight_cuda<bf16>(wg, bf16_ptr(s.x), db_at, f32_ptr(w3_.grad), rows, D, F, ctx.batch, s.ld);
  }
  {
    // Fused: dx = [da db] [W1 W3]^T, one fp32 sum over 2F where the separate products round dx
    // to bf16 after da W1^T and again after adding db W3^T.
    OpScope part("mlp.up_proj.dgrad");
    linear_backward_data_cuda<bf16, bf16>(g, bf16_ptr(da), bf16_ptr(w1_.value_bf16), bf16_ptr(dx), rows, D, s.ld,
                                          ctx.batch, /*accumulate=*/false);
    if (!fuse)
      linear_backward_data_cuda<bf16, bf16>(g, db_at, bf16_ptr(w3_.value_bf16), bf16_ptr(dx), rows, D, F, ctx.batch);
  }
  // The weight gradients may go on beside the next layer's backward (side_stream_cuda.h)
  side.join_later({s.x, s.h, dy, da, db});
  return dx;
}

static const DevicePathRegistration registered = device_path_of<SwiGluMlp>("mlp");

}  // namespace stateflow
