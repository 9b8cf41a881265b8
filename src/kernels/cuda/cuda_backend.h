// The CUDA device backend of core/device.h: device tensors (Tensor::zeros(..., Device::CUDA))
// get their memory from a caching DeviceAllocator, one per MemoryTracker and GPU, so each
// stage's device memory is charged to the tracker its thread uses, as its host memory is.
// Device work goes to the calling thread's current GPU (use_cuda_device): a pipeline stage's
// thread selects its GPU once, and its allocations, cuBLAS handle and kernels live there.
// Zero-fill, and copies to, from and within the device, run on the legacy default stream
// and return when done: the layers' kernels also run there (one stream per GPU for now).
#pragma once
#include "core/allocator.h"
#include "kernels/cuda/device_allocator.h"
#include "kernels/cuda/gemm_cuda.h"

namespace stateflow {

// Selects GPU 0 and registers the backend; call once at start-up before creating device
// tensors (later calls do nothing). Throws when no CUDA device is usable.
void init_cuda_backend();

// Makes GPU `gpu` the calling thread's device (starting the backend if needed). Throws,
// naming the GPUs there are, when there is no such GPU.
void use_cuda_device(int gpu);

// The caching allocator behind tracker t's device tensors on the calling thread's GPU
// (created on first use); for its stats, or for scratch buffers (DeviceBuffer) charged
// like the tensors.
DeviceAllocator& cuda_allocator_for(MemoryTracker& t);

// Tests: fill tensors made with Tensor::uninitialized with 0xff bytes (NaN in bf16, fp32 and
// fp64) instead of leaving the block's old contents, so that a kernel that does not write all
// of its output shows up as NaN rather than as stale values that happen to look right.
void poison_uninitialized_device_tensors(bool on);

// How many allocators (tracker, GPU) exist: trackers whose memory was released have none.
int cuda_allocator_count();

// Scratch for one kernel call (workspaces), from the calling thread's tracker, charged to Other.
DeviceBuffer cuda_scratch(size_t bytes);

// This thread's cuBLAS handle for its current GPU, on the default stream (a handle must not
// be shared by threads, nor used on another GPU than the one it was made on). While the thread
// records a CUDA graph, the recording's handle instead (device_graph_cuda.h).
const CublasGemm& cublas_for_thread();

}  // namespace stateflow
