// LM head + softmax cross-entropy on the GPU, with the semantics of the CPU path
// (kernels/cpu/gemm.h linear_forward, kernels/cpu/cross_entropy.h, model/lm_head.cpp):
//   logits = x W                      x [rows, dim], W [dim, vocab], targets [rows] (-1: ignored)
//   loss_sum, correct, counted        as LossStats
//   dlogits = scale * (softmax(logits) - onehot(target)) on counted rows, 0 on ignored rows
//   dx = dlogits W^T (overwritten),   dW += x^T dlogits (fp32)
// without ever holding the logits of all rows. The rows are batch sequences of len tokens;
// they go through in blocks of block_tokens tokens of every sequence (a multiple of
// kTokenBlock that divides kWeightGradTokens or is a multiple of it), last block first, and only one block's logits (fp32) and dlogits (In) live
// in the workspace. In = float (fp32 GEMMs, the test path) or bf16 (bf16 GEMM operands with
// fp32 accumulation; dlogits rounded to bf16 for the two backward GEMMs).
//
// Deterministic and chunk-invariant: pinned GEMM algorithms (each row's logits and dx do not
// depend on the block), one CUDA block per row with fixed-order reductions, and the loss
// statistics kept per token block of each sequence (summed in double in a fixed order), to be
// added up in token order (add_loss_stats_cuda), give the same loss and dx at cuts on multiples
// of kTokenBlock; dW goes through weight_grad_cuda (its steps last to first across the calls),
// bitwise at cuts on multiples of kWeightGradTokens.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cross_entropy.h"
#include "kernels/cuda/gemm_cuda.h"
#include "kernels/cuda/reduce_cuda.h"

namespace stateflow {

// Loss statistics of one token block of one sequence, on the device.
struct LossStatsCuda {
  double loss_sum;
  unsigned long long correct, counted;
  unsigned long long bad_targets;  // targets outside [-1, vocab): an error, reported by add_loss_stats_cuda
};

// Entries of the statistics array for batch sequences of len tokens: [batch][token_blocks(len)].
inline int64_t loss_stats_blocks(int64_t batch, int64_t len) { return batch * token_blocks(len); }

// Copies the blocks' statistics to the host (synchronising the stream) and adds them up in token
// order (block 0 of sequences 0 .. batch - 1, then block 1, ...) into a fresh total, returned,
// and, when running is not null, one block at a time into *running: a sequence's chunks, run in
// order with cuts at multiples of kTokenBlock, then leave *running bitwise as the unsplit run
// does. Throws stateflow::Error if any target was outside [-1, vocab).
LossStats add_loss_stats_cuda(const LossStatsCuda* stats, int64_t batch, int64_t len, int64_t vocab,
                              cudaStream_t stream, LossStats* running);

// The same ordered sum as add_loss_stats_cuda, done on the device into *running (one thread:
// a few hundred blocks), so the host need not wait for the GPU at every chunk. Bad targets are
// counted into running->bad_targets for the caller to report when it reads the totals.
void accumulate_loss_stats_cuda(const LossStatsCuda* stats, int64_t batch, int64_t len, LossStatsCuda* running,
                                cudaStream_t stream);

template <class In>
size_t lm_head_cross_entropy_workspace_bytes(int64_t batch, int64_t block_tokens, int64_t vocab);

// x [batch * len, dim], targets [batch * len]; stats: loss_stats_blocks(batch, len) entries,
// all written. dx == nullptr and dW == nullptr: forward only (evaluation). Otherwise both are
// needed. vocab must be a multiple of 8; runs on g's stream.
template <class In>
void lm_head_cross_entropy_cuda(const CublasGemm& g, const In* x, const In* W, const int32_t* targets, int64_t batch,
                                int64_t len, int64_t dim, int64_t vocab, float scale, int64_t block_tokens, In* dx,
                                float* dW, LossStatsCuda* stats, void* workspace);

}  // namespace stateflow
