// Work that may run beside the calling thread's main stream (cublas_for_thread()'s): a second
// cuBLAS handle of the thread on a stream of its own, and the two events that order it against
// the main stream. The layers give it GEMMs whose operands are ready and whose results the
// main stream does not need for a while: the weight gradients (each writes only its
// parameter's gradient; over 2048-token steps each is one wave of tiles whose fp32
// read-modify-write leaves SMs idle), the GDN's gate projections and gates in the forward
// (beside the convs), x W3 beside x W1. Short chunks gain most: their small kernels and
// GEMMs of few tiles leave most of the GPU idle. Results are bitwise those of the serial
// order: every gradient is still accumulated by one stream in the same order, and no kernel
// uses atomics. (STATEFLOW_LEVERS_OFF=side_stream, kernels/cuda/levers.h, keeps all on the
// main stream.)
//
//   make the side work's outputs                 (a zero-fill or poison runs on the main stream)
//   SideWork side;
//   const CublasGemm& g = side.fork();           (side stream waits for the main stream so far)
//   linear_backward_weight_cuda(g, ...);         (runs beside what the main stream does next)
//   side.join();                                 (main stream waits for it; also on destruction)
//
// The caching allocator hands a freed block to the next allocation at once, for work on the
// main stream: so join() before the side work's operands and outputs go out of scope. (The
// destructor joins too, before any later allocation: an exception on the way is safe.)
//
// A layer's backward may end with join_later(operands) instead of join(): inside the stage
// executor's DeferredWorkScope (core/deferred_work.h) its weight gradients then keep running
// beside the next layer's backward (the MLP's beside the GDN core, which leaves most SMs idle).
// The main stream waits for them one layer late (at the next join_later, which marks where its
// own layer's side work ends), or at the next join, or when the executor finishes the deferred
// work (before each layer_done and at the end of the unit's backward); the operands they read
// are held until then. Each gradient is still accumulated by the side stream alone, in the
// same order, so the results stay bitwise the serial ones. (STATEFLOW_LEVERS_OFF=side_defer
// joins at the end of each layer, as before.)
#pragma once
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/gemm_cuda.h"

namespace stateflow {

// Whether SideWork overlaps on this thread: true unless STATEFLOW_LEVERS_OFF names
// side_stream; tests switch it per thread. While `--breakdown` times a layer's parts (an
// OpTimer on the thread) side work runs on the main stream anyway, so each part's device time
// is its own (`--breakdown-overlapped`, core/op_scope.h's op_timer_keeps_overlap, keeps it beside).
bool& side_work_enabled_for_thread();
// Whether join_later() may defer (inside a DeferredWorkScope): true unless STATEFLOW_LEVERS_OFF
// names side_defer; tests switch it per thread.
bool& side_work_deferral_for_thread();
// Whether the GDN's and the pre-norm residual's dw token-block reductions (norms, short convs)
// go to the side stream beside the rest (lever dw_beside) or run on the main stream in place;
// tests switch it per thread. The same kernels and sums either way.
bool& dw_beside_for_thread();
// Whether the GDN backward's gates kernel (and its gate projections' weight gradients) go to the
// side stream beside the L2 norms, convs and input projections (lever gates_beside) or run on the
// main stream where they were; tests switch it per thread. The same kernels, the same bits.
bool& gates_beside_for_thread();

// Makes the thread's side stream and its handle now if overlap is on, so that a CUDA graph
// recording (device_graph_cuda.h) finds them made rather than creating them while it records.
void prepare_side_work_for_thread();

class SideWork {
 public:
  SideWork();
  ~SideWork();
  SideWork(const SideWork&) = delete;
  SideWork& operator=(const SideWork&) = delete;

  // The handle to issue overlapping work on, after the side stream was made to wait for all
  // work issued on the main stream so far; without overlap, the main stream's handle.
  const CublasGemm& fork();
  // Makes the main stream wait for the work issued through fork() (nothing without overlap or
  // before the first fork), then finishes the thread's deferred side work (all of it is done
  // by then: the side stream runs its work in order).
  void join();
  // join(), or inside a DeferredWorkScope later (see above); `operands` are the tensors the
  // side work reads (and may write), held until the main stream waits for it.
  void join_later(std::vector<Tensor> operands);
  // join_later() for work issued after a layer's own join_later (a pre-norm residual's norm dw
  // reduction after its inner layer's backward): it joins the side work already deferred, waited
  // for with it at the next join, rather than making the main stream wait for that work now.
  void join_with_deferred(std::vector<Tensor> operands);
  // For a result of the side work that the main stream reads before the layer's end (the GDN's
  // da, db): mark() notes the side stream's work issued so far, wait_for_mark() makes the main
  // stream wait for that work only, not for side work issued after the mark (the weight
  // gradients). One mark at a time; nothing without overlap.
  void mark();
  void wait_for_mark();

 private:
  // Marks the side stream's end now and defers the main stream's wait for it (and the release of
  // operands) to the next join.
  void defer_to_layer_end(std::vector<Tensor> operands);
  bool overlap_;
  bool pending_ = false;  // forked since the last join
};

}  // namespace stateflow
