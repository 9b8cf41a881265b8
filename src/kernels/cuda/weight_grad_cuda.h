// Weight gradients dW += x^T dy on the GPU with a fixed order of accumulation over tokens, so
// that a sequence cut into chunks at multiples of kTokenBlock gives bitwise the gradient of
// the unsplit run (cuBLAS would compute alpha * (sum) + beta * dW, rounding once per call).
//
// Each fp32 accumulator starts from the current dW entry and adds the tokens one block of
// kTokenBlock tokens at a time, from the last block of the sequences to the first (within a
// block position: sequence batch - 1 first). Running the chunks of a sequence backward (last
// chunk first) thus continues one and the same chain of additions. Within a block the order
// is fixed too: the tensor cores' m16n8k16 steps in ascending k (bf16), or the tokens in
// ascending order (fp32, a plain kernel: the reference path).
//
// Operands: x rows of `in` values, dy rows of `out` values, for token t of sequence b at
//   x  + b * x_seq_stride  + t * ldx          dy + b * dy_seq_stride + t * ldy
// (t < len, b < batch); dW is [in, out] row-major fp32. bf16 operands use tensor cores when
// in, out, the strides and pointers allow 16-byte loads (multiples of 8 elements); otherwise,
// and for fp32, the plain kernel.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

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
                      int64_t out, cudaStream_t stream, WeightGradTile tile = WeightGradTile::Auto);

}  // namespace stateflow
