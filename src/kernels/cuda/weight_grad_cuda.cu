#include "kernels/cuda/weight_grad_cuda.h"

#include <algorithm>

#include "core/error.h"

namespace stateflow {

template <class In>
void weight_grad_cuda(const CublasGemm& g, const WeightGradOperands<In>& ops, float* dW, int64_t batch, int64_t len,
                      int64_t in, int64_t out, int64_t step_tokens) {
  SF_CHECK(batch >= 0 && len >= 0 && in > 0 && out > 0 && step_tokens > 0, "weight_grad_cuda: bad shape (batch ",
           batch, ", len ", len, ", in ", in, ", out ", out, ", step ", step_tokens, ")");
  if (batch == 0 || len == 0) return;
  for (int64_t t0 = (len - 1) / step_tokens * step_tokens; t0 >= 0; t0 -= step_tokens) {
    const int64_t n = std::min(step_tokens, len - t0);
    for (int64_t b = batch - 1; b >= 0; --b)
      gemm_cuda<In, float>(g, true, false, in, out, n, 1.f, ops.x + b * ops.x_seq_stride + t0 * ops.ldx, ops.ldx,
                           ops.dy + b * ops.dy_seq_stride + t0 * ops.ldy, ops.ldy, 1.f, dW, out);
  }
}

template void weight_grad_cuda<float>(const CublasGemm&, const WeightGradOperands<float>&, float*, int64_t, int64_t,
                                      int64_t, int64_t, int64_t);
template void weight_grad_cuda<__nv_bfloat16>(const CublasGemm&, const WeightGradOperands<__nv_bfloat16>&, float*,
                                              int64_t, int64_t, int64_t, int64_t, int64_t);

}  // namespace stateflow
