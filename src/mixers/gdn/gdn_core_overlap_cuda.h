// The streams of the GDN core's overlap (GdnCudaConfig::overlap; docs/design.md "The GDN core's
// overlap"): a sweep (B3) on the caller's stream and, beside it on streams of the calling thread,
// the consumer (B4) launches of an overlap plan (gdn_core_overlap.h), each queued behind stream
// waits (kernels/cuda/stream_wait_cuda.h) on the counters the sweep bumps (gdn_core_overlap.cuh).
//
//   caller's stream:  [zero counters] [sweep ................................] [waits for them]
//   overlap stream 0:     (waits for the zeroing) [wait j0][consume j0]  [wait j2][consume j2] ...
//   overlap stream 1:     (waits for the zeroing)   [wait j1][consume j1]  [wait j3][consume j3] ...
//
// With more than one overlap stream a launch does not wait for the one before it to end (its
// launch latency and the tail of its last wave of blocks): launch i goes to stream i % streams.
//
// The sweep waits on nothing, so it always finishes and every wait is met: nothing can deadlock
// whatever the block scheduler does. It is queued before any wait (the driver's order rule), and
// the caller's stream waits for the overlap stream before anything after the call, so the
// workspace and outputs are the caller's again when the call returns (as without overlap).
#pragma once
#include <cuda_runtime.h>

#include <functional>
#include <vector>

#include "mixers/gdn/gdn_core_overlap.h"

namespace stateflow {

// The counters a sweep bumps: nseg per sweep at `counters` (the forward sweep's, then the
// reverse's), and the blocks of each sweep (a segment is done when its counter has them all).
struct SweepCounters {
  unsigned* counters = nullptr;
  int nseg = 0;
  unsigned forward_blocks = 0, reverse_blocks = 0;
};

// Whether the overlap can run on `stream` now: the driver has stream waits (else a one-line
// notice, once per process, and the caller runs its stages in sequence) and `stream` is not
// capturing a CUDA graph (stream waits are not recorded: the sequential stages are).
bool gdn_overlap_can_run(cudaStream_t stream);

// Overlap streams per thread and GPU (GdnCudaConfig::overlap_streams).
constexpr int kMaxOverlapStreams = 4;

// Zeroes the counters and queues sweep(stream) on `stream`; then, on `streams` of the calling
// thread's overlap streams, for launch i of `plan` on stream i % streams, waits for its counters
// and queues consume(first, count, that stream); then makes `stream` wait for them all.
void gdn_run_overlapped(cudaStream_t stream, const SweepCounters& c, const std::vector<OverlapLaunch>& plan,
                        int streams, const std::function<void(cudaStream_t)>& sweep,
                        const std::function<void(int first, int count, cudaStream_t)>& consume);

}  // namespace stateflow
