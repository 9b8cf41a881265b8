#include "kernels/cuda/device_allocator.h"

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.h"

namespace stateflow {

namespace {
constexpr size_t kSmallStep = 512;
constexpr size_t kSmallLimit = size_t(1) << 20;
constexpr int kClassesPerDoubling = 8;

size_t round_up(size_t x, size_t step) { return (x + step - 1) / step * step; }

}  // namespace

DeviceAllocator::DeviceAllocator(MemoryTracker& tracker) : tracker_(tracker), device_(0) {
  cuda_check(cudaGetDevice(&device_), "cudaGetDevice");
}

size_t DeviceAllocator::size_class(size_t bytes) {
  if (bytes <= kSmallLimit) return round_up(bytes, kSmallStep);
  size_t pow2 = kSmallLimit;  // the largest power of two <= bytes
  while (pow2 <= bytes / 2) pow2 *= 2;
  return round_up(bytes, pow2 / kClassesPerDoubling);
}

DeviceAllocator::~DeviceAllocator() {
  // Destructors must not throw: errors here (e.g. a context already torn down) are ignored.
  GpuScope on(device_);
  for (auto& [p, b] : live_) {
    cudaFree(p);
    tracker_.sub(b.category, int64_t(b.requested));
  }
  for (auto& [size, blocks] : free_)
    for (void* p : blocks) cudaFree(p);
}

void* DeviceAllocator::device_malloc(size_t size, size_t requested, MemCategory c) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, size);
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // clear the (non-sticky) error before retrying
    release_cached_locked();
    e = cudaMalloc(&p, size);
  }
  if (e == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw OutOfMemoryError(
        cat("out of GPU memory allocating ", format_bytes(int64_t(requested)), " for ", mem_category_name(c), " (",
            format_bytes(stats_.in_use), " in use by this stage's allocator, ", format_bytes(int64_t(total_b - free_b)),
            " of ", format_bytes(int64_t(total_b)),
            " used on the device): use more chunks per sequence (--chunks) so each chunk's activations are smaller, "
            "fewer microbatches (--microbatches) in flight per stage, or recompute activations in backward instead "
            "of keeping them (--recompute full)"));
  }
  cuda_check(e, "cudaMalloc");
  ++stats_.device_mallocs;
  return p;
}

void* DeviceAllocator::allocate(size_t bytes, MemCategory c) {
  if (bytes == 0) return nullptr;
  const size_t size = size_class(bytes);
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      stats_.cached -= int64_t(size);
      ++stats_.reuses;
    } else {
      p = device_malloc(size, bytes, c);
    }
    live_.emplace(p, Block{size, bytes, c});
    stats_.in_use += int64_t(size);
  }
  tracker_.add(c, int64_t(bytes));
  return p;
}

void DeviceAllocator::free(void* p) {
  if (!p) return;
  Block b;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    SF_CHECK(it != live_.end(), "DeviceAllocator::free: pointer ", p, " was not allocated here or was freed twice");
    b = it->second;
    live_.erase(it);
    free_[b.size].push_back(p);
    stats_.in_use -= int64_t(b.size);
    stats_.cached += int64_t(b.size);
  }
  tracker_.sub(b.category, int64_t(b.requested));
}

void DeviceAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked();
}

void DeviceAllocator::release_cached_locked() {
  GpuScope on(device_);
  for (auto& [size, blocks] : free_)
    for (void* p : blocks) cuda_check(cudaFree(p), "cudaFree");
  free_.clear();
  stats_.cached = 0;
}

bool DeviceAllocator::owns(void* p) const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.count(p) > 0;
}

DeviceAllocator::Stats DeviceAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

int64_t device_used_bytes() {
  size_t free_b = 0, total_b = 0;
  cuda_check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  return int64_t(total_b - free_b);
}

}  // namespace stateflow
