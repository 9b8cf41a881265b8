// Token embedding on the GPU, with the semantics of kernels/cpu/embedding.h:
// out[r] = table[tokens[r]] (fp32 table, activations A = float or bf16), and backward
// dtable[v] += sum of dout[r] over the rows r with tokens[r] == v.
//
// The backward is deterministic without floating-point atomics: the rows (batch sequences of
// rows / batch tokens) are listed from the last token to the first (sequences last to first
// within a token), then sorted by token id with a stable radix sort, so each vocabulary row's
// gradients form one run in that order; a single block owns each run (per 512 columns) and
// adds it straight into the table row. A sequence cut into chunks anywhere and run backward
// last chunk first therefore makes the same additions as the unsplit run: bitwise equal.
// dim must be a multiple of 8 and the pointers 16-byte aligned.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace stateflow {

// The CPU kernel throws on a token id outside [0, vocab); a kernel cannot throw without a
// synchronisation, so here such a row is written as zeros and *bad_token (a device int, may be
// null) is set to 1 for the caller to check when it next synchronises. Ids should be validated
// when the batch is made, on the host.
template <class A>
void embedding_forward_cuda(const int32_t* tokens, const float* table, A* out, int64_t rows, int64_t dim,
                            int64_t vocab, int* bad_token, cudaStream_t stream);

// Device scratch the backward needs for `rows` tokens.
size_t embedding_backward_workspace_bytes(int64_t rows);

// dtable += scatter of dout (fp32 accumulation); rows with ids outside [0, vocab) are skipped.
template <class A>
void embedding_backward_cuda(const int32_t* tokens, const A* dout, float* dtable, int64_t rows, int64_t dim,
                             int64_t vocab, int64_t batch, void* workspace, cudaStream_t stream);

}  // namespace stateflow
