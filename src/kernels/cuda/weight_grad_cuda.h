// Weight gradients dW += x^T dy on the GPU with a fixed order of accumulation over tokens, so
// that a sequence cut into chunks at multiples of kTokenBlock gives bitwise the gradient of
// the unsplit run (cuBLAS would compute alpha * (sum) + beta * dW, rounding once per call).
//
// The tokens go in steps of one block of kTokenBlock tokens, from the last block of the
// sequences to the first (within a block position: sequence batch - 1 first), and each dW
// entry is one chain of fp32 additions starting from its current value: running the chunks of
// a sequence backward (last chunk first) continues one and the same chain. Tensor-core path:
// each step is four m16n8k16 mma.sync into the accumulators (ascending k). Plain path (fp32,
// the reference, and bf16 shapes the tensor-core loads cannot take, such as the gate
// projections' few heads): each step's partial sum (tokens ascending, from 0) is formed in
// parallel in the workspace, then added to dW, one rounding per step, in walk order.
//
// Operands: x rows of `in` values, dy rows of `out` values, for token t of sequence b at
//   x  + b * x_seq_stride  + t * ldx          dy + b * dy_seq_stride + t * ldy
// (t < len, b < batch); dW is [in, out] row-major fp32. bf16 operands use tensor cores when
// in, out, the strides and pointers allow 16-byte loads (multiples of 8 elements); otherwise,
// and for fp32, the plain path, whose workspace (any size from 4 in out bytes up; more means
// fewer launches) is scratch that must stay untouched until the call's work on the stream is
// done (the stream's cuBLASLt workspace will do: CublasGemm::workspace()).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/reduce_cuda.h"

namespace stateflow {

template <class In>
struct WeightGradOperands {
  const In* x = nullptr;
  int64_t ldx = 0, x_seq_stride = 0;
  const In* dy = nullptr;
  int64_t ldy = 0, dy_seq_stride = 0;
};

// CTA tile of the tensor-core path: 128 x 256 (Wide) or 128 x 128 (Narrow) entries of dW;
// Auto takes Wide when that still gives nearly every SM a tile. The results are the same bits.
enum class WeightGradTile { Auto, Narrow, Wide };

template <class In>
void weight_grad_cuda(const WeightGradOperands<In>& ops, float* dW, int64_t batch, int64_t len, int64_t in,
                      int64_t out, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                      WeightGradTile tile = WeightGradTile::Auto);

}  // namespace stateflow
