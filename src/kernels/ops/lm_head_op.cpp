// The LM head fused with softmax cross-entropy (logits = x W never held whole) as an op
// (kernels/op_def.h), for its CUDA test and kernels_bench: evaluation (loss only) and
// training (loss, dx, dW). Reference: kernels/cpu/gemm and kernels/cpu/cross_entropy in
// float64. The loss statistics, the rows' argmax and ignored targets are checked by
// tests/cuda/test_cross_entropy_cuda.cu; here the summed loss, dx and dW.
#include <algorithm>

#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/gemm.h"
#include "kernels/op_def.h"

#ifdef STATEFLOW_HAVE_CUDA
#include "kernels/cuda/cross_entropy_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/op_launch.h"
#endif

namespace stateflow {
namespace {

int64_t rows(const OpShape& s) { return s["batch"] * s["len"]; }
float scale(const OpShape& s) { return 1.f / float(rows(s)); }  // the mean over the rows
double gemm_flops(const OpShape& s) { return 2.0 * double(rows(s)) * double(s["dim"]) * double(s["vocab"]); }
// x (bf16), targets and W (bf16) read once; training also writes dx and reads and writes dW (fp32).
double read_bytes(const OpShape& s) { return double(rows(s)) * (2.0 * double(s["dim"]) + 4) + 2.0 * double(s["dim"] * s["vocab"]); }

std::vector<double> logits_of(const OpShape& s, OpHost& h) {
  std::vector<double> logits(size_t(rows(s) * s["vocab"]));
  linear_forward<double>(h.at("x").data(), h.at("W").data(), logits.data(), rows(s), s["dim"], s["vocab"]);
  return logits;
}

std::vector<int32_t> targets_of(OpHost& h) { return {h.at("targets").begin(), h.at("targets").end()}; }

#ifdef STATEFLOW_HAVE_CUDA
// The workspace holds the kernel's block buffers, then (256-byte aligned) the loss statistics
// per token block.
size_t block_buffer_bytes(const OpShape& s) {
  const size_t most = std::max(lm_head_cross_entropy_workspace_bytes<float>(s["batch"], s["block"], s["vocab"]),
                               lm_head_cross_entropy_workspace_bytes<__nv_bfloat16>(s["batch"], s["block"], s["vocab"]));
  return (most + 255) / 256 * 256;
}

template <class A>
void run_lm_head(const OpLaunch& l, bool train) {
  const int64_t batch = l["batch"], len = l["len"], vocab = l["vocab"];
  auto* stats = reinterpret_cast<LossStatsCuda*>(static_cast<char*>(l.workspace) + block_buffer_bytes(l.shape));
  lm_head_cross_entropy_cuda<A>(l.gemm, l.at<A>("x"), l.at<A>("W"), l.at<int32_t>("targets"), batch, len, l["dim"],
                                vocab, scale(l.shape), l["block"], train ? l.at<A>("dx") : nullptr,
                                train ? l.at<float>("dW") : nullptr, stats, l.workspace);
  if (!train) {  // the loss to the host (a synchronisation) and back into its array
    const float loss = float(add_loss_stats_cuda(stats, batch, len, vocab, nullptr, nullptr).loss_sum);
    cuda_check(cudaMemcpy(l.at<float>("loss_sum"), &loss, sizeof loss, cudaMemcpyHostToDevice), "loss_sum");
  }
}
#endif

OpDef make_lm_head_op() {
  OpDef op;
  op.name = "lm_head_ce";
  op.label = "lm_head + CE";
  // Blocks of 64 tokens per sequence: 64 + 64 + 22.
  op.test_shapes = {{{{"batch", 2}, {"len", 150}, {"dim", 64}, {"vocab", 520}, {"block", 64}}}};
  op.bench_shapes = [](const BenchSizes& b) {
    return std::vector<OpShape>{{{{"batch", 1}, {"len", b.tokens}, {"dim", b.dim}, {"vocab", b.vocab}, {"block", 4096}}}};
  };
  op.bench_label = [](const OpShape& s) {
    return s.times({"len", "dim", "vocab"}) + ", blocks of " + std::to_string(s["block"]);
  };
  op.arrays = [](const OpShape& s) {
    const int64_t r = rows(s), d = s["dim"], V = s["vocab"];
    return std::vector<OpArray>{{"x", ArrayType::Act, r * d, Role::In, Fill::normal()},
                                {"W", ArrayType::Act, d * V, Role::In, Fill::normal(0.3)},
                                {"targets", ArrayType::I32, r, Role::In, Fill::ids(V)},
                                {"loss_sum", ArrayType::F32, 1, Role::Out},
                                {"dx", ArrayType::Act, r * d, Role::Out},
                                {"dW", ArrayType::F32, d * V, Role::Acc, Fill::normal()}};
  };
  op.passes = {
      {"fwd (eval)", {"loss_sum"},
       [](const OpShape& s, DType, OpHost& h) {
         const std::vector<double> logits = logits_of(s, h);
         h.at("loss_sum")[0] = cross_entropy_forward<double>(logits.data(), targets_of(h).data(), rows(s), s["vocab"]).loss_sum;
       },
       gemm_flops, read_bytes},
      {"fwd + bwd", {"dx", "dW"},
       [](const OpShape& s, DType, OpHost& h) {
         const std::vector<double> logits = logits_of(s, h);
         std::vector<double> dlogits(logits.size());
         cross_entropy_backward<double>(logits.data(), targets_of(h).data(), double(scale(s)), dlogits.data(), rows(s),
                                        s["vocab"]);
         linear_backward_weight<double>(h.at("x").data(), dlogits.data(), h.at("dW").data(), rows(s), s["dim"],
                                        s["vocab"]);
         std::fill(h.at("dx").begin(), h.at("dx").end(), 0.0);  // dx is overwritten
         linear_backward_data<double>(dlogits.data(), h.at("W").data(), h.at("dx").data(), rows(s), s["dim"],
                                      s["vocab"]);
       },
       [](const OpShape& s) { return 3 * gemm_flops(s); },
       [](const OpShape& s) { return read_bytes(s) + 2.0 * double(rows(s) * s["dim"]) + 8.0 * double(s["dim"] * s["vocab"]); }}};
#ifdef STATEFLOW_HAVE_CUDA
  op.workspace_bytes = [](const OpShape& s) {
    return block_buffer_bytes(s) + size_t(loss_stats_blocks(s["batch"], s["len"])) * sizeof(LossStatsCuda);
  };
  op.passes[0].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) { run_lm_head<decltype(a)>(l, false); });
  };
  op.passes[1].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) { run_lm_head<decltype(a)>(l, true); });
  };
#endif
  return op;
}

const OpRegistration registered(make_lm_head_op());

}  // namespace
}  // namespace stateflow
