// GDN gates on the GPU with the semantics of mixers/gdn/gdn_gates.h (MATH.md section 2),
// per row and value head h:
//   beta = sigmoid(b)                       g = -exp(A_log[h]) * softplus(a + dt_bias[h])
// a, b, da, db are A [rows, heads] (A = float or bf16); g, beta, dg, dbeta are fp32 (what the
// GDN core reads and writes); A_log, dt_bias and their gradients are fp32 [heads].
// da, db overwritten; dA_log, ddt_bias accumulated (+=) through one partial sum per block of
// kTokenBlock tokens of each of the batch sequences (rows = batch x len), added by
// add_token_block_partials_cuda: deterministic, and bitwise the same for a sequence cut into
// chunks at multiples of kTokenBlock and run last chunk first. heads <= 256.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace stateflow {

template <class A>
void gdn_gates_forward_cuda(const A* a, const A* b, const float* A_log, const float* dt_bias, float* g, float* beta,
                            int64_t rows, int64_t heads, cudaStream_t stream);

size_t gdn_gates_backward_workspace_bytes(int64_t rows, int64_t heads, int64_t batch);

template <class A>
void gdn_gates_backward_cuda(const A* a, const A* b, const float* A_log, const float* dt_bias, const float* dg,
                             const float* dbeta, A* da, A* db, float* dA_log, float* ddt_bias, int64_t rows,
                             int64_t heads, int64_t batch, void* workspace, cudaStream_t stream);

}  // namespace stateflow
