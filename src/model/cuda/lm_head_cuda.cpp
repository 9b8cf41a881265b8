// LM head + cross-entropy on the GPU: final RMSNorm, then the fused row-block kernel, which
// never holds all logits. As on the CPU, backward recomputes the logits. The loss statistics
// come back to the host at each forward (one synchronisation per chunk), unless the caller
// collects them on the device (ctx.device_stats).
#include <algorithm>
#include <cstddef>

#include "kernels/cuda/cross_entropy_cuda.h"
#include "kernels/cuda/norms_cuda.h"
#include "model/cuda/layer_cuda.h"
#include "model/lm_head.h"

namespace stateflow {

static_assert(sizeof(DeviceLossStats) == sizeof(LossStatsCuda) &&
                  offsetof(DeviceLossStats, loss_sum) == offsetof(LossStatsCuda, loss_sum) &&
                  offsetof(DeviceLossStats, correct) == offsetof(LossStatsCuda, correct) &&
                  offsetof(DeviceLossStats, counted) == offsetof(LossStatsCuda, counted) &&
                  offsetof(DeviceLossStats, bad_targets) == offsetof(LossStatsCuda, bad_targets),
              "DeviceLossStats (model/layer.h) must have the layout of LossStatsCuda");

namespace {
struct HeadCudaStash : Stash {
  Tensor x, rstd, xn, targets;  // targets on the device
};

// Rows per block of logits: enough for full GEMMs, while the block's logits stay ~256 MiB.
int64_t head_row_block(int64_t rows, int64_t vocab) {
  return std::clamp<int64_t>((int64_t(256) << 20) / (6 * vocab), 64, std::max<int64_t>(rows, 1));
}

// Adds the chunk's loss statistics to *stats on the device.
void run_head(const Tensor& xn, const Param& proj, const Tensor& targets, float scale, bf16* dx, float* dW,
              LossStatsCuda* stats) {
  const int64_t rows = xn.dim(0), D = xn.dim(1), V = proj.value.dim(1);
  const int64_t block = head_row_block(rows, V);
  DeviceBuffer ws = cuda_scratch(lm_head_cross_entropy_workspace_bytes<bf16>(block, V));
  lm_head_cross_entropy_cuda<bf16>(cublas_for_thread(), bf16_ptr(xn), bf16_ptr(proj.value_bf16),
                                   targets.data<int32_t>(), rows, D, V, scale, block, dx, dW, stats, ws.get());
}

// Statistics of one call, not kept: zeroed scratch for run_head.
DeviceBuffer fresh_stats() {
  DeviceBuffer b = cuda_scratch(sizeof(LossStatsCuda));
  reset_loss_stats_cuda(b.get<LossStatsCuda>(), layer_stream());
  return b;
}
}  // namespace

Tensor LmHead::forward_cuda(const ChunkCtx& ctx, const Tensor& x, std::unique_ptr<Stash>& stash) {
  SF_CHECK(ctx.targets.defined() && ctx.targets.numel() == x.dim(0), "lm_head: targets missing or of the wrong size");
  const int64_t rows = x.dim(0), D = x.dim(1);
  auto s = std::make_unique<HeadCudaStash>();
  s->x = x;
  s->rstd = f32_zeros({rows});
  s->xn = bf16_zeros({rows, D});
  s->targets = ctx.targets.on_host() ? ctx.targets.to(Device::CUDA) : ctx.targets;
  rmsnorm_forward_cuda<bf16>(bf16_ptr(x), f32_ptr(norm_.value), bf16_ptr(s->xn), f32_ptr(s->rstd), rows, D, eps_,
                             layer_stream());
  if (ctx.device_stats) {
    run_head(s->xn, proj_, s->targets, float(ctx.loss_scale), nullptr, nullptr,
             reinterpret_cast<LossStatsCuda*>(ctx.device_stats));
    stash = std::move(s);
    return Tensor();
  }
  DeviceBuffer stats = fresh_stats();
  run_head(s->xn, proj_, s->targets, float(ctx.loss_scale), nullptr, nullptr, stats.get<LossStatsCuda>());
  const LossStats st = fetch_loss_stats_cuda(stats.get<LossStatsCuda>(), proj_.value.dim(1), layer_stream());
  if (ctx.stats) ctx.stats->add(st);
  Tensor loss = Tensor::zeros({1}, DType::F32);  // on the host: the caller reads it
  loss.data<float>()[0] = static_cast<float>(st.loss_sum * ctx.loss_scale);
  stash = std::move(s);
  return loss;
}

Tensor LmHead::backward_cuda(const ChunkCtx& ctx, Stash& stash) {
  auto& s = static_cast<HeadCudaStash&>(stash);
  const int64_t rows = s.x.dim(0), D = s.x.dim(1);
  Tensor dxn = bf16_zeros({rows, D});
  DeviceBuffer stats = fresh_stats();  // forward counted them; not read (no synchronisation)
  run_head(s.xn, proj_, s.targets, float(ctx.loss_scale), bf16_ptr(dxn), f32_ptr(proj_.grad),
           stats.get<LossStatsCuda>());
  Tensor dx = bf16_zeros({rows, D});
  DeviceBuffer ws = cuda_scratch(norm_backward_workspace_bytes(rows, D));
  rmsnorm_backward_cuda<bf16>(bf16_ptr(s.x), f32_ptr(norm_.value), f32_ptr(s.rstd), bf16_ptr(dxn), bf16_ptr(dx),
                              f32_ptr(norm_.grad), rows, D, ws.get(), layer_stream());
  return dx;
}

}  // namespace stateflow
