// PreNormResidual on the GPU: bf16 stream x, fp32 norm weight and rstd; y = x + inner(norm(x)).
#include "kernels/cuda/elementwise_cuda.h"
#include "kernels/cuda/levers.h"
#include "kernels/cuda/norms_cuda.h"
#include "kernels/cuda/side_stream_cuda.h"
#include "model/cuda/layer_cuda.h"
#include "model/residual.h"
#include "model/device_path.h"
#include "core/op_scope.h"

namespace stateflow {

namespace {
struct ResidualCudaStash : Stash {
  Tensor x, rstd;
  std::unique_ptr<Stash> inner;
};
}  // namespace

bool& residual_epilogue_for_thread() {
  thread_local bool on = !lever_off("residual_epilogue");
  return on;
}

bool PreNormResidual::inner_adds_residual() const {
  return residual_epilogue_for_thread() && inner_->adds_residual_on_device();
}

Tensor PreNormResidual::forward_cuda(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                                     std::unique_ptr<Stash>& stash) {
  auto s = std::make_unique<ResidualCudaStash>();
  const int64_t rows = x.dim(0), D = x.dim(1);
  s->x = x;
  s->rstd = f32_out({rows});
  Tensor h = bf16_out({rows, D});
  {
    OpScope part("block.rmsnorm");
    rmsnorm_forward_cuda<bf16>(bf16_ptr(x), f32_ptr(norm_.value), bf16_ptr(h), f32_ptr(s->rstd), rows, D, eps_,
                               layer_stream());
  }
  // y = x + inner(h): in the inner layer's last GEMM (one rounding), or added after it
  if (inner_adds_residual()) {
    ChunkCtx with_residual = ctx;
    with_residual.residual = &x;
    Tensor y = inner_->forward(with_residual, h, state_in, state_out, s->inner);
    stash = std::move(s);
    return y;
  }
  Tensor y = inner_->forward(ctx, h, state_in, state_out, s->inner);
  {
    OpScope part("block.residual_add");
    add_inplace_cuda<bf16>(bf16_ptr(y), bf16_ptr(x), y.numel(), layer_stream());
  }
  stash = std::move(s);
  return y;
}

Tensor PreNormResidual::backward_cuda(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out,
                                      State& dstate_in, Stash& stash) {
  auto& s = static_cast<ResidualCudaStash&>(stash);
  Tensor dh = inner_->backward(ctx, dy, dstate_out, dstate_in, *s.inner);
  s.inner.reset();  // release the inner activations before allocating dx
  const int64_t rows = dy.dim(0), D = dy.dim(1);
  Tensor dx = bf16_out({rows, D});
  const TokenRows tokens{ctx.batch, 1};
  // dx = norm backward + dy: added by the norm kernel as it stores dx (the same bits as the
  // separate add, STATEFLOW_LEVERS_OFF=residual_fused)
  const bool fused = !lever_off("residual_fused");
  {
    OpScope part("block.rmsnorm");
    // dw's reduction on the side stream (dw_beside), joined with the inner layer's deferred side
    // work: the workspace it reads is held until then
    SideWork side;
    DwReduction dw_sum;
    const Tensor ws = scratch_f32(norm_backward_workspace_bytes(rows, D, tokens));
    rmsnorm_backward_cuda<bf16>(bf16_ptr(s.x), f32_ptr(norm_.value), f32_ptr(s.rstd), bf16_ptr(dh), bf16_ptr(dx),
                                f32_ptr(norm_.grad), rows, D, tokens, ws.raw(), layer_stream(),
                                fused ? bf16_ptr(dy) : nullptr, dw_beside_for_thread() ? &dw_sum : nullptr);
    if (dw_sum) {
      dw_sum(side.fork().stream());
      side.join_with_deferred({ws});
    }
  }
  if (!fused) {
    OpScope part("block.residual_add");
    add_inplace_cuda<bf16>(bf16_ptr(dx), bf16_ptr(dy), dx.numel(), layer_stream());
  }
  return dx;
}

static const DevicePathRegistration registered = device_path_of<PreNormResidual>("prenorm_residual");

}  // namespace stateflow
