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

}  // namespace stateflow
