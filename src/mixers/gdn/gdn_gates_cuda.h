// GDN gates on the GPU with the semantics of mixers/gdn/gdn_gates.h (MATH.md section 2),
// per row and value head h:
//   beta = sigmoid(b)                       g = -exp(A_log[h]) * softplus(a + dt_bias[h])
// a, b, da, db are A [rows, heads] (A = float or bf16); g, beta, dg, dbeta are fp32 (what the
// GDN core reads and writes); A_log, dt_bias and their gradients are fp32 [heads].
// da, db overwritten; dA_log, ddt_bias accumulated (+=), deterministically (no atomics): each
// block of kTokenBlock tokens of each of the batch sequences (rows = batch x len) leaves one
// partial sum; the blocks of each step of step_tokens tokens (counted from the call's first
// token) are added in ascending order, all steps in parallel; then the step sums go into the
// gradient from the last step to the first (sequence batch - 1 first), the order of
// weight_grad_cuda's steps. A sequence cut into chunks at multiples of step_tokens and run last
// chunk first therefore gives bitwise the unsplit run's gradients. step_tokens: 2048
// (kWeightGradTokens, the layers' aligned cuts), or kTokenBlock with
// STATEFLOW_LEVERS_OFF=gate_steps (one walk of every 64-token block, as before the lever:
// bitwise at 64-token cuts, but a chain of 512 dependent additions at 32K tokens). heads <= 256.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace stateflow {

template <class A>
void gdn_gates_forward_cuda(const A* a, const A* b, const float* A_log, const float* dt_bias, float* g, float* beta,
                            int64_t rows, int64_t heads, cudaStream_t stream);

// Enough for every step_tokens.
size_t gdn_gates_backward_workspace_bytes(int64_t rows, int64_t heads, int64_t batch);

// The step the layer runs: kWeightGradTokens, or kTokenBlock with the gate_steps lever off.
int64_t gdn_gates_step_tokens();

template <class A>
void gdn_gates_backward_cuda(const A* a, const A* b, const float* A_log, const float* dt_bias, const float* dg,
                             const float* dbeta, A* da, A* db, float* dA_log, float* ddt_bias, int64_t rows,
                             int64_t heads, int64_t batch, void* workspace, cudaStream_t stream,
                             int64_t step_tokens = gdn_gates_step_tokens());

}  // namespace stateflow
