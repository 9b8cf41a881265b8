// Grouped value heads on the GPU, with the semantics of mixers/gdn/gdn_groups.h: q/k copied to
// every value head of their group before the core, their gradients summed over the group after
// it, in fp32 in the group's order (j = 0, 1, ...) and rounded once to A (float or bf16). Per
// token, without atomics: the same bits every run and for any chunking. d a multiple of 8,
// pointers 16-byte aligned (8-wide vector loads).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace stateflow {

template <class A>
void gdn_expand_groups_cuda(const A* x, A* y, int64_t rows, int64_t heads, int64_t group, int64_t d,
                            cudaStream_t stream);
template <class A>
void gdn_sum_groups_cuda(const A* dy, A* dx, int64_t rows, int64_t heads, int64_t group, int64_t d,
                         cudaStream_t stream);

}  // namespace stateflow
