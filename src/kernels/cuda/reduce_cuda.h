// The deterministic second half of every parameter-gradient reduction on the GPU. Kernels
// that reduce over rows write one partial sum per block (or warp) of a fixed set of rows;
// this adds the partials up in a fixed order, so a gradient is bitwise the same on every run
// (no floating-point atomics anywhere).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace stateflow {

// out[j] += sum over p of partials[p * width + j], for j < width. The parts are cut into a
// fixed number of contiguous groups, each summed in ascending p, and the group sums are
// added in ascending order: the same order on every run, whatever the scheduling.
void add_partial_sums_cuda(const float* partials, int64_t parts, int64_t width, float* out, cudaStream_t stream);

}  // namespace stateflow
