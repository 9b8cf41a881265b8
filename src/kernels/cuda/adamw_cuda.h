// AdamW step on fp32 master weights on the GPU, with the formulas of kernels/cpu/adamw.h:
//   m = beta1*m + (1-beta1)*g            v = beta2*v + (1-beta2)*g^2
//   p = p*(1 - lr*decay) - lr * (m/(1-beta1^t)) / (sqrt(v/(1-beta2^t)) + eps)
// done in double with every operation rounded as the CPU rounds it (no fused multiply-adds),
// so the result is bitwise that of AdamW::step on a float parameter. `decay` is the weight
// decay this tensor takes: cfg.weight_decay for matrices, 0 for vectors (takes_weight_decay).
// `step` is the step number counted from 1 (AdamW::steps() after its increment).
// When p_bf16 is not null it receives the updated weights rounded to bf16 (the GEMM copy),
// saving a separate cast pass; with bf16_ld > bf16_cols the copy is a column block of a wider
// row-major matrix (row r of the parameter at p_bf16 + r * bf16_ld: model/param.h's shared copies).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cpu/adamw.h"

namespace stateflow {

void adamw_update_cuda(float* p, const float* g, float* m, float* v, int64_t n, double lr, double decay,
                       const AdamWConfig& cfg, int64_t step, __nv_bfloat16* p_bf16, cudaStream_t stream,
                       int64_t bf16_cols = 0, int64_t bf16_ld = 0);

}  // namespace stateflow
