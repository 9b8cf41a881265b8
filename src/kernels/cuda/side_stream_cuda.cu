#include "kernels/cuda/side_stream_cuda.h"

#include <memory>

#include "core/deferred_work.h"
#include "core/op_scope.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/levers.h"
#include "kernels/cuda/per_gpu_cuda.h"

namespace stateflow {
namespace {

// The thread's side stream on one GPU: non-blocking, so the legacy default stream (the main
// one) does not serialise with it; the events carry the order instead.
struct SideStream {
  cudaStream_t stream = nullptr;
  // layer_end: where the side stream's work of the last join_later ends (one pending at a time)
  cudaEvent_t main_reached = nullptr, side_done = nullptr, layer_end = nullptr;
  std::unique_ptr<CublasGemm> gemm;
  SideStream() {
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags (side stream)");
    cuda_check(cudaEventCreateWithFlags(&main_reached, cudaEventDisableTiming), "cudaEventCreate (side stream)");
    cuda_check(cudaEventCreateWithFlags(&side_done, cudaEventDisableTiming), "cudaEventCreate (side stream)");
    cuda_check(cudaEventCreateWithFlags(&layer_end, cudaEventDisableTiming), "cudaEventCreate (side stream)");
    gemm = std::make_unique<CublasGemm>(stream);
  }
  ~SideStream() {  // at thread exit; destructors must not throw
    gemm.reset();
    cudaEventDestroy(layer_end), cudaEventDestroy(side_done), cudaEventDestroy(main_reached);
    cudaStreamDestroy(stream);
  }
};

// The main stream waits for all work issued on the thread's side stream so far.
void main_waits_for_side() {
  SideStream& s = per_gpu_for_thread<SideStream>();
  cuda_check(cudaEventRecord(s.side_done, s.stream), "cudaEventRecord (join)");
  cuda_check(cudaStreamWaitEvent(cublas_for_thread().stream(), s.side_done, 0), "cudaStreamWaitEvent (join)");
}

}  // namespace

bool& side_work_enabled_for_thread() {
  thread_local bool enabled = !lever_off("side_stream");
  return enabled;
}

bool& side_work_deferral_for_thread() {
  thread_local bool enabled = !lever_off("side_defer");
  return enabled;
}

bool& dw_beside_for_thread() {
  thread_local bool enabled = !lever_off("dw_beside");
  return enabled;
}

void prepare_side_work_for_thread() {
  if (side_work_enabled_for_thread()) per_gpu_for_thread<SideStream>();
}

SideWork::SideWork() : overlap_(side_work_enabled_for_thread() && thread_op_timer() == nullptr) {}

SideWork::~SideWork() {
  if (!pending_) return;
  try {
    join();
  } catch (...) {  // a CUDA error here was or will be reported by the next checked call
  }
}

const CublasGemm& SideWork::fork() {
  if (!overlap_) return cublas_for_thread();
  SideStream& s = per_gpu_for_thread<SideStream>();
  cuda_check(cudaEventRecord(s.main_reached, cublas_for_thread().stream()), "cudaEventRecord (fork)");
  cuda_check(cudaStreamWaitEvent(s.stream, s.main_reached, 0), "cudaStreamWaitEvent (fork)");
  pending_ = true;
  return *s.gemm;
}

void SideWork::join() {
  if (!pending_) return;
  main_waits_for_side();
  pending_ = false;
  finish_deferred_work();
}

void SideWork::join_later(std::vector<Tensor> operands) {
  if (!pending_) return;
  if (!side_work_deferral_for_thread() || !work_may_be_deferred()) return join();
  pending_ = false;
  // The main stream waits for the previous layer's side work now, one layer late; then this
  // layer's end is marked on the side stream (so one mark is pending at a time).
  finish_deferred_work();
  defer_to_layer_end(std::move(operands));
}

void SideWork::join_with_deferred(std::vector<Tensor> operands) {
  if (!pending_) return;
  if (!side_work_deferral_for_thread() || !work_may_be_deferred()) return join();
  pending_ = false;
  // The pending mark moves to the end of this work: the deferred waits (the inner layer's and
  // this one) wait for both.
  defer_to_layer_end(std::move(operands));
}

void SideWork::defer_to_layer_end(std::vector<Tensor> operands) {
  SideStream& s = per_gpu_for_thread<SideStream>();
  cuda_check(cudaEventRecord(s.layer_end, s.stream), "cudaEventRecord (join_later)");
  defer_work([operands = std::move(operands)]() mutable {
    cuda_check(cudaStreamWaitEvent(cublas_for_thread().stream(), per_gpu_for_thread<SideStream>().layer_end, 0),
               "cudaStreamWaitEvent (join_later)");
    operands.clear();
  });
}

}  // namespace stateflow
