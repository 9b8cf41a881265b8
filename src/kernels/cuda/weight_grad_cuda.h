// Weight gradients dW += x^T dy on the GPU with a fixed order of accumulation over tokens, so
// that a sequence cut into chunks at multiples of the step gives bitwise the gradient of the
// unsplit run. One cuBLAS call over all tokens would not: it computes alpha * (sum) + beta * dW,
// rounding once per call, so where the calls begin and end changes the result.
//
// The tokens go in steps of `step_tokens` (kWeightGradTokens by default) counted from the first
// token of the call, from the last step to the first (within a step: sequence batch - 1
// first), and each step is one GEMM dW = x_step^T dy_step + dW with a fixed algorithm for its
// shape. Running the chunks of a sequence backward (last chunk first), with cuts at multiples
// of the step, therefore makes exactly the same GEMM calls on the same data as the unsplit run.
// Steps of 2048 tokens keep cuBLAS near its full speed (the fp32 dW is read and written once
// per step); cuts elsewhere still give the right gradient, rounded differently.
//
// Operands: x rows of `in` values, dy rows of `out` values, for token t of sequence b at
//   x  + b * x_seq_stride  + t * ldx          dy + b * dy_seq_stride + t * ldy
// (t < len, b < batch); dW is [in, out] row-major fp32. In = float (fp32 GEMMs, the tests'
// reference path) or bf16 (fp32 accumulation).
#pragma once
#include <cstdint>

#include "kernels/cuda/gemm_cuda.h"

namespace stateflow {

// Chunk boundaries at multiples of this many tokens give bitwise-equal weight gradients.
constexpr int64_t kWeightGradTokens = 2048;
// One unit of cuts for every exact product: the row-wise GEMMs' aligned rows are the same.
static_assert(kWeightGradTokens == kGemmAlignedRows, "weight-gradient steps and aligned GEMM rows must agree");

template <class In>
struct WeightGradOperands {
  const In* x = nullptr;
  int64_t ldx = 0, x_seq_stride = 0;
  const In* dy = nullptr;
  int64_t ldy = 0, dy_seq_stride = 0;
};

// Runs on g's stream.
template <class In>
void weight_grad_cuda(const CublasGemm& g, const WeightGradOperands<In>& ops, float* dW, int64_t batch, int64_t len,
                      int64_t in, int64_t out, int64_t step_tokens = kWeightGradTokens);

}  // namespace stateflow
