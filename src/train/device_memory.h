// GPU memory as the driver sees it, for the benchmark: reached through this hook so that the
// bench builds without CUDA (train/device_memory_without_cuda.cpp stubs it out) and only the
// CUDA build's train/cuda/device_memory_cuda.cpp talks to the driver.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace stateflow {

// Bytes in use on every visible GPU by device index, as the driver reports them
// (cudaMemGetInfo: total - free; every process and context included). Empty when the CUDA
// backend was not started (CPU runs) or the build has no CUDA.
std::vector<int64_t> gpu_used_bytes();

// The current GPU's name ("NVIDIA H200"), for keying measured costs; empty when the CUDA
// backend was not started or the build has no CUDA.
std::string gpu_name();

}  // namespace stateflow
