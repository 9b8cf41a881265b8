// LM head + cross-entropy on the GPU: final RMSNorm, then the fused row-block kernel, which
// never holds all logits. As on the CPU, backward recomputes the logits (why: docs/design.md,
// "The LM head's recomputed logits"). The loss statistics come back per token block and are
// added up in token order (chunk-invariant sums): on the device into the step's accumulator
// when the caller passes one (ctx.device_stats, so the host never waits for the GPU here), else
// on the host into ctx.stats (one synchronisation a chunk).
#include <algorithm>
#include <cstddef>

#include "kernels/cuda/cross_entropy_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm_cuda.h"
#include "kernels/cuda/levers.h"
#include "kernels/cuda/norms_cuda.h"
#include "kernels/cuda/weight_grad_cuda.h"
#include "model/cuda/layer_cuda.h"
#include "model/lm_head.h"
#include "model/device_path.h"

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

// Tokens per sequence in a block of logits: enough rows for full GEMMs, and at a 32K vocabulary
// kWeightGradTokens (each block's weight gradient reads and writes the fp32 dW once), while the
// block's logits stay ~512 MiB (~256 MiB with STATEFLOW_LEVERS_OFF=head_blocks). The blocks must
// start at the same tokens whether or not the sequence was cut (at multiples of
// kWeightGradTokens): multiples of kWeightGradTokens, or, where those would be too large, its
// largest power-of-two divisor that fits (at least kTokenBlock); a short chunk takes the
// smallest such size that holds it.
int64_t head_block_tokens(int64_t batch, int64_t len, int64_t vocab) {
  const int64_t budget = (lever_off("head_blocks") ? int64_t(256) : int64_t(512)) << 20;
  const int64_t fit = budget / (6 * vocab * batch);
  int64_t block = kWeightGradTokens;
  if (fit >= kWeightGradTokens)
    block = fit / kWeightGradTokens * kWeightGradTokens;
  else
    while (block > kTokenBlock && block > fit) block /= 2;
  if (len > kWeightGradTokens)
    return std::min(block, (len + kWeightGradTokens - 1) / kWeightGradTokens * kWeightGradTokens);
  int64_t holds = kTokenBlock;
  while (holds < len) holds *= 2;
  return std::min(block, holds);
}

// Runs the head on one chunk; adds its statistics, token block by token block, into
// *device_running when given (on the device; returns empty statistics), else returns them and
// adds them into *running if given (on the host).
LossStats run_head(const ChunkCtx& ctx, const Tensor& xn, const Param& proj, const Tensor& targets, bf16* dx,
                   float* dW, LossStats* running, DeviceLossStats* device_running) {
  const int64_t rows = xn.dim(0), D = xn.dim(1), V = proj.value.dim(1), B = ctx.batch, L = rows / B;
  SF_CHECK(B * L == rows, "lm_head: ", rows, " rows are not batch ", B, " sequences of equal length");
  const CublasGemm& g = cublas_for_thread();
  const int64_t block = head_block_tokens(B, L, V);
  DeviceBuffer ws = cuda_scratch(lm_head_cross_entropy_workspace_bytes<bf16>(B, block, V));
  DeviceBuffer stats = cuda_scratch(size_t(loss_stats_blocks(B, L)) * sizeof(LossStatsCuda));
  auto* st = stats.get<LossStatsCuda>();
  lm_head_cross_entropy_cuda<bf16>(g, bf16_ptr(xn), bf16_ptr(proj.value_bf16), targets.data<int32_t>(), B, L, D, V,
                                   float(ctx.loss_scale), block, dx, dW, st, ws.get());
  if (device_running) {
    accumulate_loss_stats_cuda(st, B, L, reinterpret_cast<LossStatsCuda*>(device_running), g.stream());
    return LossStats();
  }
  return add_loss_stats_cuda(st, B, L, V, g.stream(), running);
}
}  // namespace

Tensor LmHead::forward_cuda(const ChunkCtx& ctx, const Tensor& x, const State&, State&, std::unique_ptr<Stash>& stash) {
  SF_CHECK(ctx.targets.defined() && ctx.targets.numel() == x.dim(0), "lm_head: targets missing or of the wrong size");
  const int64_t rows = x.dim(0), D = x.dim(1);
  auto s = std::make_unique<HeadCudaStash>();
  s->x = x;
  s->rstd = f32_out({rows});  // the norm writes every row: no zero-fill per chunk
  s->xn = bf16_out({rows, D});
  s->targets = ctx.targets.on_host() ? to_device_async(ctx.targets) : ctx.targets;
  rmsnorm_forward_cuda<bf16>(bf16_ptr(x), f32_ptr(norm_.value), bf16_ptr(s->xn), f32_ptr(s->rstd), rows, D, eps_,
                             layer_stream());
  if (ctx.recomputing) {  // backward recomputes the logits anyway; no statistics, no wait
    stash = std::move(s);
    return Tensor();
  }
  if (ctx.device_stats) {
    run_head(ctx, s->xn, proj_, s->targets, nullptr, nullptr, nullptr, ctx.device_stats);
    stash = std::move(s);
    return Tensor();
  }
  const LossStats st = run_head(ctx, s->xn, proj_, s->targets, nullptr, nullptr, ctx.stats, nullptr);
  if (ctx.logits) {  // inference only: the fused kernel above never holds them all
    Tensor logits = f32_zeros({rows, proj_.value.dim(1)});
    linear_forward_cuda<bf16, float>(cublas_for_thread(), bf16_ptr(s->xn), bf16_ptr(proj_.value_bf16),
                                     f32_ptr(logits), rows, D, proj_.value.dim(1), ctx.batch);
    cuda_check(cudaStreamSynchronize(layer_stream()), "lm_head logits");
    *ctx.logits = logits.to(Device::CPU, MemCategory::Activations);
  }
  Tensor loss = Tensor::zeros({1}, DType::F32);  // on the host: the caller reads it
  loss.data<float>()[0] = static_cast<float>(st.loss_sum * ctx.loss_scale);
  stash = std::move(s);
  return loss;
}

Tensor LmHead::backward_cuda(const ChunkCtx& ctx, const Tensor&, const State&, State&, Stash& stash) {
  auto& s = static_cast<HeadCudaStash&>(stash);
  const int64_t rows = s.x.dim(0), D = s.x.dim(1);
  Tensor dxn = bf16_out({rows, D});  // each token block's dx GEMM overwrites its rows
  // Forward counted the statistics: these are not kept, and on the device path never read.
  if (ctx.device_stats) {
    DeviceBuffer scratch = cuda_scratch(sizeof(DeviceLossStats));
    run_head(ctx, s.xn, proj_, s.targets, bf16_ptr(dxn), f32_ptr(proj_.grad), nullptr,
             scratch.get<DeviceLossStats>());
  } else {
    run_head(ctx, s.xn, proj_, s.targets, bf16_ptr(dxn), f32_ptr(proj_.grad), nullptr, nullptr);
  }
  Tensor dx = bf16_out({rows, D});
  const TokenRows tokens{ctx.batch, 1};
  DeviceBuffer ws = cuda_scratch(norm_backward_workspace_bytes(rows, D, tokens));
  rmsnorm_backward_cuda<bf16>(bf16_ptr(s.x), f32_ptr(norm_.value), f32_ptr(s.rstd), bf16_ptr(dxn), bf16_ptr(dx),
                              f32_ptr(norm_.grad), rows, D, tokens, ws.get(), layer_stream());
  return dx;
}

static const DevicePathRegistration registered = device_path_of<LmHead>("lm_head");

}  // namespace stateflow
