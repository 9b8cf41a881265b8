// GPU memory as the driver sees it, for the benchmark: reached through this hook so that the
// bench builds without CUDA (train/device_memory_without_cuda.cpp stubs it out) and only the
// CUDA build's train/cuda/device_memory_cuda.cpp talks to the driver.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/allocator.h"

namespace stateflow {

// Bytes in use on every visible GPU by device index, as the driver reports them
// (cudaMemGetInfo: total - free; every process and context included). Empty when the CUDA
// backend was not started (CPU runs) or the build has no CUDA.
std::vector<int64_t> gpu_used_bytes();

// The device caching allocators of these trackers keep freed blocks for reuse, and outlive
// the trackers' owners. Call this while the trackers are alive; the function it returns hands
// those blocks back to the driver, so call that after the owners (a pipeline) are destroyed,
// before the next run allocates. Without CUDA both do nothing.
std::function<void()> device_cache_releaser(const std::vector<MemoryTracker*>& trackers);

}  // namespace stateflow
