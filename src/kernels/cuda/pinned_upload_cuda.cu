#include "kernels/cuda/pinned_upload_cuda.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "kernels/cuda/cuda_check.h"

namespace stateflow {

namespace {

// Page-locked staging buffer, and the event after the copy that last read it.
struct PinnedSlot {
  void* host = nullptr;
  size_t capacity = 0;
  cudaEvent_t copied = nullptr;
  int gpu = -1;  // the event's GPU: an event is recorded on streams of its own GPU only
};

// A thread's slots, used in turn: by the time one comes round again its copy has long
// finished (a stage uploads a few small arrays per chunk), so waiting for it costs nothing.
struct PinnedRing {
  std::array<PinnedSlot, 8> slots;
  size_t next = 0;
  ~PinnedRing() {  // at thread exit; errors are ignored (the driver may be gone at process exit)
    for (PinnedSlot& s : slots) {
      if (s.copied) {
        cudaEventSynchronize(s.copied);
        cudaEventDestroy(s.copied);
      }
      if (s.host) cudaFreeHost(s.host);
    }
  }
};

thread_local PinnedRing ring;

}  // namespace

void upload_async(void* device_dst, const void* host_src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  PinnedSlot& s = ring.slots[ring.next];
  ring.next = (ring.next + 1) % ring.slots.size();
  int gpu = 0;
  cuda_check(cudaGetDevice(&gpu), "cudaGetDevice");
  if (s.copied) cuda_check(cudaEventSynchronize(s.copied), "cudaEventSynchronize (pinned staging slot)");
  if (s.copied && s.gpu != gpu) {
    cuda_check(cudaEventDestroy(s.copied), "cudaEventDestroy");
    s.copied = nullptr;
  }
  if (!s.copied) {
    cuda_check(cudaEventCreateWithFlags(&s.copied, cudaEventDisableTiming), "cudaEventCreate");
    s.gpu = gpu;
  }
  if (s.capacity < bytes) {
    // cudaFreeHost waits for the whole GPU: grow geometrically so that it happens a few times
    // at the start, not whenever the chunks' lengths vary.
    const size_t capacity = std::max({bytes, 2 * s.capacity, size_t(64) << 10});
    if (s.host) cuda_check(cudaFreeHost(s.host), "cudaFreeHost");
    s.host = nullptr, s.capacity = 0;
    // Portable: pinned for every GPU, since a thread may upload to more than one.
    cuda_check(cudaHostAlloc(&s.host, capacity, cudaHostAllocPortable), "cudaHostAlloc (pinned staging buffer)");
    s.capacity = capacity;
  }
  std::memcpy(s.host, host_src, bytes);
  cuda_check(cudaMemcpyAsync(device_dst, s.host, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (upload)");
  cuda_check(cudaEventRecord(s.copied, stream), "cudaEventRecord");
}

}  // namespace stateflow
