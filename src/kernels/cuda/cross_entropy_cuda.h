// LM head + softmax cross-entropy on the GPU, with the semantics of the CPU path
// (kernels/cpu/gemm.h linear_forward, kernels/cpu/cross_entropy.h, model/lm_head.cpp):
//   logits = x W                      x [rows, dim], W [dim, vocab], targets [rows] (-1: ignored)
//   loss_sum, correct, counted        as LossStats
//   dlogits = scale * (softmax(logits) - onehot(target)) on counted rows, 0 on ignored rows
//   dx = dlogits W^T (overwritten),   dW += x^T dlogits (fp32)
// without ever holding the logits of all rows: rows go through in blocks of row_block, and
// only one block's logits (fp32) and dlogits (In) live in the workspace. In = float (fp32
// GEMMs, the test path) or bf16 (bf16 GEMM operands with fp32 accumulation; dlogits rounded
// to bf16 for the two backward GEMMs).
//
// Deterministic: cuBLAS with a fixed workspace, one block per row with fixed-order
// reductions, and the loss summed in double over rows in a fixed order.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cross_entropy.h"
#include "kernels/cuda/gemm_cuda.h"

namespace stateflow {

// Device-resident loss statistics, accumulated (+=) by lm_head_cross_entropy_cuda so that
// a step's chunks can add up without synchronising.
struct LossStatsCuda {
  double loss_sum;
  unsigned long long correct, counted;
  unsigned long long bad_targets;  // targets outside [-1, vocab): an error, reported by fetch
};

void reset_loss_stats_cuda(LossStatsCuda* stats, cudaStream_t stream);
// Synchronises the stream. Throws stateflow::Error if any target was outside [-1, vocab).
LossStats fetch_loss_stats_cuda(const LossStatsCuda* stats, int64_t vocab, cudaStream_t stream);

template <class In>
size_t lm_head_cross_entropy_workspace_bytes(int64_t row_block, int64_t vocab);

// dx == nullptr and dW == nullptr: forward only (evaluation). Otherwise both are needed.
// vocab must be a multiple of 8; runs on g's stream.
template <class In>
void lm_head_cross_entropy_cuda(const CublasGemm& g, const In* x, const In* W, const int32_t* targets, int64_t rows,
                                int64_t dim, int64_t vocab, float scale, int64_t row_block, In* dx, float* dW,
                                LossStatsCuda* stats, void* workspace);

}  // namespace stateflow
