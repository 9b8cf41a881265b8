// The CUDA device backend of core/device.h: device tensors (Tensor::zeros(..., Device::CUDA))
// get their memory from a caching DeviceAllocator, one per MemoryTracker, so each stage's
// device memory is charged to the tracker its thread uses, as its host memory is.
// Zero-fill, and copies to, from and within the device, run on the legacy default stream
// and return when done: the layers' kernels also run there (one GPU, one stream for now).
#pragma once
#include "core/allocator.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/gemm_cuda.h"

namespace stateflow {

// Selects GPU 0 and registers the backend; call once at start-up before creating device
// tensors (later calls do nothing). Throws when no CUDA device is usable.
void init_cuda_backend();

// The caching allocator behind tracker t's device tensors (created on first use); for
// its stats, or for scratch buffers (DeviceBuffer) charged like the tensors.
DeviceAllocator& cuda_allocator_for(MemoryTracker& t);

// Scratch for one kernel call (workspaces), from the calling thread's tracker, charged to Other.
DeviceBuffer cuda_scratch(size_t bytes);

// This thread's cuBLAS handle on the default stream (a handle must not be shared by threads).
const CublasGemm& cublas_for_thread();

}  // namespace stateflow
