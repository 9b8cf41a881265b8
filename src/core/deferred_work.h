// Work a layer may leave running after it returns, and the scope that bounds it.
//
// On the GPU a layer's weight gradients run on a side stream (kernels/cuda/side_stream_cuda.h).
// Waiting for them at the end of every layer call leaves that stream's last GEMMs running alone
// while the main stream waits. Inside a DeferredWorkScope (the stage executor opens one around
// the layers of one unit's backward) a layer may instead hand over a `finish` function (make the
// main stream wait for its side work, then release the operands that work reads), which runs
// at the next join of side work on the thread, at finish_deferred_work(), or when the scope
// ends: the side work then runs beside the next layer's (a GDN core leaves most SMs idle).
// Outside a scope (a layer called on its own, as the layer tests do) nothing is deferred, so
// whoever reads a gradient after a layer call, or after a unit's backward, sees it complete.
#pragma once
#include <functional>

namespace stateflow {

class DeferredWorkScope {
 public:
  DeferredWorkScope();
  ~DeferredWorkScope();  // finishes the thread's deferred work
  DeferredWorkScope(const DeferredWorkScope&) = delete;
  DeferredWorkScope& operator=(const DeferredWorkScope&) = delete;
};

// Whether a DeferredWorkScope is open on the calling thread.
bool work_may_be_deferred();
// Hands `finish` to the open scope (work_may_be_deferred() must hold).
void defer_work(std::function<void()> finish);
// Runs the thread's deferred finish functions, in the order they were handed over.
void finish_deferred_work();

}  // namespace stateflow
