#include "mixers/gdn/gdn_core_overlap_cuda.h"

#include <cstdio>
#include <map>
#include <memory>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/stream_wait_cuda.h"

namespace stateflow {
namespace {

// The calling thread's overlap stream on one GPU (as the layers' side stream: non-blocking, so
// the legacy default stream does not serialise with it; events carry the order) and its events.
struct OverlapStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t counters_zeroed = nullptr, consumed = nullptr;
  OverlapStream() {
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags (GDN overlap)");
    cuda_check(cudaEventCreateWithFlags(&counters_zeroed, cudaEventDisableTiming), "cudaEventCreate (GDN overlap)");
    cuda_check(cudaEventCreateWithFlags(&consumed, cudaEventDisableTiming), "cudaEventCreate (GDN overlap)");
  }
  ~OverlapStream() {  // at thread exit; destructors must not throw
    cudaEventDestroy(consumed), cudaEventDestroy(counters_zeroed);
    cudaStreamDestroy(stream);
  }
};

OverlapStream& overlap_stream_for_thread() {
  thread_local std::map<int, std::unique_ptr<OverlapStream>> per_gpu;
  int gpu = 0;
  cuda_check(cudaGetDevice(&gpu), "cudaGetDevice");
  auto& s = per_gpu[gpu];
  if (!s) s = std::make_unique<OverlapStream>();
  return *s;
}

}  // namespace

bool gdn_overlap_can_run(cudaStream_t stream) {
  if (!stream_wait_available()) {
    static const bool told = [] {
      std::fprintf(stderr, "stateflow: this driver or GPU has no stream waits (cuStreamWaitValue32): the GDN core "
                           "runs its stages one after another (GdnCudaConfig::overlap ignored)\n");
      return true;
    }();
    (void)told;
    return false;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    cudaGetLastError();  // e.g. the legacy stream while another stream captures: not sticky
    return false;
  }
  return capture == cudaStreamCaptureStatusNone;
}

void gdn_run_overlapped(cudaStream_t stream, const SweepCounters& c, const std::vector<OverlapLaunch>& plan,
                        const std::function<void(cudaStream_t)>& sweep,
                        const std::function<void(int first, int count, cudaStream_t)>& consume) {
  OverlapStream& side = overlap_stream_for_thread();
  cuda_check(cudaMemsetAsync(c.counters, 0, size_t(2) * c.nseg * sizeof(unsigned), stream),
             "zeroing the GDN overlap's counters");
  cuda_check(cudaEventRecord(side.counters_zeroed, stream), "cudaEventRecord (GDN overlap)");
  sweep(stream);  // before any wait: see stream_wait_cuda.h
  // The consumers also read what the caller's stream wrote before the sweep (Pre's G; B1, B2).
  cuda_check(cudaStreamWaitEvent(side.stream, side.counters_zeroed, 0), "cudaStreamWaitEvent (GDN overlap)");
  for (const OverlapLaunch& l : plan) {
    if (l.forward_segment >= 0) stream_wait_geq(side.stream, c.counters + l.forward_segment, c.forward_blocks);
    if (l.reverse_segment >= 0) stream_wait_geq(side.stream, c.counters + c.nseg + l.reverse_segment, c.reverse_blocks);
    consume(l.first, l.count, side.stream);
  }
  cuda_check(cudaEventRecord(side.consumed, side.stream), "cudaEventRecord (GDN overlap)");
  cuda_check(cudaStreamWaitEvent(stream, side.consumed, 0), "cudaStreamWaitEvent (GDN overlap)");
}

}  // namespace stateflow
