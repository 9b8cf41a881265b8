// The deterministic, chunk-invariant second half of every parameter-gradient reduction over
// tokens on the GPU. Kernels that reduce over a chunk's rows write one partial sum per fixed
// block of kTokenBlock tokens of one sequence (or per fixed segment of such a block); this
// adds the partials into the gradient one block at a time, from the last token block to the
// first, starting from the gradient's current value. A sequence cut into chunks at multiples
// of kTokenBlock and run backward chunk by chunk (last chunk first) then performs exactly the
// floating-point additions of the unsplit run: the gradient is bitwise independent of the
// chunking, and of the scheduling (no floating-point atomics anywhere).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

namespace stateflow {

// Tokens per reduction block: the GDN sub-chunk C, so cuts at multiples of C are neutral.
constexpr int64_t kTokenBlock = 64;

// Token blocks of a sequence of len tokens (the last one may be short).
inline int64_t token_blocks(int64_t len) { return (len + kTokenBlock - 1) / kTokenBlock; }

// How a kernel's rows map to tokens: batch sequences of equal length, rows_per_token
// consecutive rows per token (e.g. one per head), so rows = batch * len * rows_per_token.
struct TokenRows {
  int64_t batch = 1;
  int64_t rows_per_token = 1;
};

// The partials of block k of sequence b are segs rows of width floats starting at
// partials[((b * seq_stride + k) * segs) * width]: block_sum(b, k) adds its segments in
// ascending order starting from 0. Then for k = blocks - 1 .. 0, b = batch - 1 .. 0:
//   out[j] += block_sum(b, k)[j]      (one rounding per block, in that order)
// seq_stride >= blocks lets a kernel keep extra (unused) partials per sequence. The partials
// are scratch: with segs > 1 the block sums overwrite each block's first segment.
void add_token_block_partials_cuda(float* partials, int64_t batch, int64_t blocks, int64_t seq_stride, int64_t segs,
                                   int64_t width, float* out, cudaStream_t stream);

// A kernel's token-block reduction left to its caller (the kernels that take a `dw_later`): run
// it on any stream once the kernel's work is done there (it reads the kernel's workspace, which
// must live until then). The GDN and the pre-norm residual run theirs on the side stream beside
// their other work (lever dw_beside; kernels/cuda/side_stream_cuda.h): the same kernels and
// sums, so the same bits.
using DwReduction = std::function<void(cudaStream_t)>;

// One gradient of a group: its partials, width and output, as add_token_block_partials_cuda's.
struct TokenBlockSum {
  float* partials;
  int64_t width;
  float* out;
};
constexpr int kMaxBlockSums = 4;
// add_token_block_partials_cuda for up to kMaxBlockSums gradients over the same batch, blocks,
// seq_stride and segs, in one launch per pass instead of one per gradient (a short chunk's
// reductions are each too small to fill the GPU): bitwise the separate calls
// (STATEFLOW_LEVERS_OFF=reduce_group makes them).
void add_token_block_partials_group_cuda(const TokenBlockSum* sums, int n, int64_t batch, int64_t blocks,
                                         int64_t seq_stride, int64_t segs, cudaStream_t stream);

}  // namespace stateflow
