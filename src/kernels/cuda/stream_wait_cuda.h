// A stream that waits, on the GPU, until a 32-bit word in device memory reaches a value: the CUDA
// driver's stream memory operation cuStreamWaitValue32, reached through the runtime's entry-point
// query (cudaGetDriverEntryPointByVersion), so nothing new is linked. The wait is held by the
// GPU's front end, not by a thread on an SM: work queued behind it on that stream starts only once
// some kernel (on another stream) has written the word, and no SM spins meanwhile.
//
// Order rule (the driver's, restated): the kernel that writes the word must be queued before the
// wait (in host order), or the wait may sit in a hardware queue ahead of it; and the writer must
// publish what the waiting work reads before the word (a block barrier, then one thread's
// __threadfence() and atomicAdd: mixers/gdn/gdn_core_overlap.cuh).
#pragma once
#include <cuda_runtime.h>

namespace stateflow {

// Whether the current GPU and driver can: the entry point resolves and a probe wait returns
// success (checked once per GPU).
bool stream_wait_available();

// Queues on `stream` a wait until (int32_t)(*word - value) >= 0, the driver's cyclic "greater or
// equal". `word` is device memory. Throws stateflow::Error when the driver refuses.
void stream_wait_geq(cudaStream_t stream, const unsigned* word, unsigned value);

}  // namespace stateflow
