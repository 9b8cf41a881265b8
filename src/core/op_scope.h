// Named parts of a layer's work (one GEMM, one kernel, or a few that belong together), for
// `stateflow bench --breakdown`: the layer profile times each part's device work, so the
// breakdown can say which kernels a chunk's time goes to. Without a timer on the thread (the
// normal case) an OpScope costs one thread-local read.
#pragma once

namespace stateflow {

class OpTimer {
 public:
  virtual ~OpTimer() = default;
  // `name` must outlive the timer (a string literal): parts are recorded by pointer.
  virtual void begin(const char* name) = 0;
  virtual void end() = 0;
};

// The calling thread's timer (nullptr: none). The layer profile sets it around a layer call.
OpTimer*& thread_op_timer();

// Whether work a layer overlaps with its main stream (kernels/cuda/side_stream_cuda.h) keeps
// overlapping while a timer is on (`bench --breakdown-overlapped`). Off (the default), side work
// runs on the main stream under a timer, so each part's device time is its own; on, each part's
// time is the main stream's, waits for the side stream included, which is what a step waits for
// (work that ran beside it shows in no part). One setting for the process.
bool& op_timer_keeps_overlap();

// Times its lifetime as part `name` of the layer call in progress. Scopes may nest: each is
// timed on its own, so an outer part includes its inner ones.
class OpScope {
 public:
  explicit OpScope(const char* name) : timer_(thread_op_timer()) {
    if (timer_) timer_->begin(name);
  }
  ~OpScope() {
    if (timer_) timer_->end();
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  OpTimer* timer_;
};

}  // namespace stateflow
