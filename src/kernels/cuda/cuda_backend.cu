#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/device.h"
#include "kernels/cuda/cuda_check.h"

namespace stateflow {

namespace {

class CudaBackend final : public DeviceBackend {
 public:
  void* allocate(size_t bytes, MemCategory c, MemoryTracker& t) override {
    void* p = allocator_for(t).allocate(bytes, c);
    if (p) cuda_check(cudaMemset(p, 0, bytes), "cudaMemset (zero-fill of a new device tensor)");
    return p;
  }
  void free(void* p, size_t, MemCategory, MemoryTracker& t) override { allocator_for(t).free(p); }
  void zero(void* p, size_t bytes) override { cuda_check(cudaMemset(p, 0, bytes), "cudaMemset"); }
  void copy(void* dst, Device, const void* src, Device, size_t bytes) override {
    // Unified addressing tells the direction from the pointers.
    cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy (tensor copy)");
  }
  void synchronize() override { cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

  DeviceAllocator& allocator_for(MemoryTracker& t) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& a = allocators_[&t];
    if (!a) a = std::make_unique<DeviceAllocator>(t);
    return *a;
  }

 private:
  std::mutex mu_;
  std::unordered_map<MemoryTracker*, std::unique_ptr<DeviceAllocator>> allocators_;
};

// Never destroyed: tensors held by static objects may be released after main() returns, and
// the driver reclaims the memory at exit anyway.
CudaBackend* g_backend = nullptr;
std::once_flag g_init;

}  // namespace

void init_cuda_backend() {
  std::call_once(g_init, [] {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    SF_CHECK(e == cudaSuccess && n > 0, "--device cuda: no usable CUDA device (",
             e == cudaSuccess ? "none found" : cudaGetErrorString(e), "): run on a GPU machine or use --device cpu");
    cuda_check(cudaSetDevice(0), "cudaSetDevice(0)");
    g_backend = new CudaBackend;
    register_device_backend(Device::CUDA, g_backend);
  });
}

DeviceAllocator& cuda_allocator_for(MemoryTracker& t) {
  SF_CHECK(g_backend != nullptr, "cuda_allocator_for: call init_cuda_backend() first");
  return g_backend->allocator_for(t);
}

DeviceBuffer cuda_scratch(size_t bytes) { return DeviceBuffer(cuda_allocator_for(current_tracker()), bytes, MemCategory::Other); }

const CublasGemm& cublas_for_thread() {
  thread_local CublasGemm gemm(nullptr);
  return gemm;
}

}  // namespace stateflow
