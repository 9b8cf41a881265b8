// Host-to-device copies that do not make the host wait for the GPU. A cudaMemcpy from ordinary
// (pageable) memory waits until the GPU has finished all the work queued before it, so a layer
// that uploads its chunk's token ids that way stalls the host at every chunk. upload_async
// stages the bytes in page-locked memory of the calling thread and copies from there on the
// stream, in order with the kernels around it.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

namespace stateflow {

// Copies `bytes` from host_src to device_dst on `stream`. host_src may be freed or changed as
// soon as this returns; device_dst holds the bytes for the work queued on `stream` after it.
void upload_async(void* device_dst, const void* host_src, size_t bytes, cudaStream_t stream);

}  // namespace stateflow
