// Host-side error checks shared by the CUDA kernels: a failed runtime call or kernel launch
// becomes a stateflow::Error that names what was being done.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/error.h"

namespace stateflow {

inline void cuda_check(cudaError_t e, const char* what) {
  SF_CHECK(e == cudaSuccess, "CUDA: ", what, " failed: ", cudaGetErrorString(e));
}

// Launch-configuration errors only surface through cudaGetLastError.
inline void cuda_check_launch(const char* kernel) { cuda_check(cudaGetLastError(), kernel); }

// The vectorised kernels move 16 bytes per access.
inline void check_aligned16(const void* p, const char* kernel, const char* what) {
  SF_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, kernel, ": ", what,
           " must be 16-byte aligned (device allocations are; offsets must be whole 16-byte rows)");
}

// Makes `gpu` current for a scope and the caller's GPU current again after it, so that code
// acting for a given GPU (freeing its blocks, setting up its transport) leaves the calling
// thread as it found it. Errors are ignored: destructors use it.
class GpuScope {
 public:
  explicit GpuScope(int gpu) : gpu_(gpu) {
    cudaGetDevice(&prev_);
    if (prev_ != gpu_) cudaSetDevice(gpu_);
  }
  ~GpuScope() {
    if (prev_ != gpu_) cudaSetDevice(prev_);
  }
  GpuScope(const GpuScope&) = delete;
  GpuScope& operator=(const GpuScope&) = delete;

 private:
  int gpu_, prev_ = 0;
};

}  // namespace stateflow
