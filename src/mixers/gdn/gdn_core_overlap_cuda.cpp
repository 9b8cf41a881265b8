#include "mixers/gdn/gdn_core_overlap_cuda.h"

#include <algorithm>
#include <cstdio>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/per_gpu_cuda.h"
#include "kernels/cuda/stream_wait_cuda.h"

namespace stateflow {
namespace {

// The calling thread's overlap streams on one GPU (as the layers' side stream: non-blocking, so
// the legacy default stream does not serialise with them; events carry the order) and their events.
struct OverlapStreams {
  cudaStream_t stream[kMaxOverlapStreams] = {};
  cudaEvent_t counters_zeroed = nullptr, consumed[kMaxOverlapStreams] = {};
  OverlapStreams() {
    cuda_check(cudaEventCreateWithFlags(&counters_zeroed, cudaEventDisableTiming), "cudaEventCreate (GDN overlap)");
    for (int i = 0; i < kMaxOverlapStreams; ++i) {
      cuda_check(cudaStreamCreateWithFlags(&stream[i], cudaStreamNonBlocking), "cudaStreamCreateWithFlags (GDN overlap)");
      cuda_check(cudaEventCreateWithFlags(&consumed[i], cudaEventDisableTiming), "cudaEventCreate (GDN overlap)");
    }
  }
  ~OverlapStreams() {  // at thread exit; destructors must not throw
    for (int i = 0; i < kMaxOverlapStreams; ++i) cudaEventDestroy(consumed[i]), cudaStreamDestroy(stream[i]);
    cudaEventDestroy(counters_zeroed);
  }
};

}  // namespace

bool gdn_overlap_can_run(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    cudaGetLastError();  // e.g. the legacy stream while another stream captures: not sticky
    return false;
  }
  if (capture != cudaStreamCaptureStatusNone) return false;
  if (!stream_wait_available()) {
    static const bool told = [] {
      std::fprintf(stderr, "stateflow: this driver or GPU has no stream waits (cuStreamWaitValue32): the GDN core "
                           "runs its stages one after another (GdnCudaConfig::overlap ignored)\n");
      return true;
    }();
    (void)told;
    return false;
  }
  return true;
}

void gdn_run_overlapped(cudaStream_t stream, const SweepCounters& c, const std::vector<OverlapLaunch>& plan,
                        int streams, const std::function<void(cudaStream_t)>& sweep,
                        const std::function<void(int first, int count, cudaStream_t)>& consume) {
  SF_CHECK(streams >= 1 && streams <= kMaxOverlapStreams, "GDN core overlap: 1 to ", kMaxOverlapStreams,
           " consumer streams, got ", streams);
  OverlapStreams& side = per_gpu_for_thread<OverlapStreams>();
  cuda_check(cudaMemsetAsync(c.counters, 0, size_t(2) * c.nseg * sizeof(unsigned), stream),
             "zeroing the GDN overlap's counters");
  cuda_check(cudaEventRecord(side.counters_zeroed, stream), "cudaEventRecord (GDN overlap)");
  sweep(stream);  // before any wait: see stream_wait_cuda.h
  // The consumers also read what the caller's stream wrote before the sweep (Pre's G; B1, B2).
  const int used = std::min(streams, int(plan.size()));
  for (int i = 0; i < used; ++i)
    cuda_check(cudaStreamWaitEvent(side.stream[i], side.counters_zeroed, 0), "cudaStreamWaitEvent (GDN overlap)");
  for (size_t i = 0; i < plan.size(); ++i) {
    const OverlapLaunch& l = plan[i];
    cudaStream_t s = side.stream[i % size_t(used)];
    if (l.forward_segment >= 0) stream_wait_geq(s, c.counters + l.forward_segment, c.forward_blocks);
    if (l.reverse_segment >= 0) stream_wait_geq(s, c.counters + c.nseg + l.reverse_segment, c.reverse_blocks);
    consume(l.first, l.count, s);
  }
  for (int i = 0; i < used; ++i) {
    cuda_check(cudaEventRecord(side.consumed[i], side.stream[i]), "cudaEventRecord (GDN overlap)");
    cuda_check(cudaStreamWaitEvent(stream, side.consumed[i], 0), "cudaStreamWaitEvent (GDN overlap)");
  }
}

}  // namespace stateflow
