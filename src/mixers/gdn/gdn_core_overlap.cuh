// The sweeps' side of the overlap (GdnCudaConfig::overlap; the plan in gdn_core_overlap.h, the
// streams in gdn_core_overlap_cuda.h): a quarter-sweep block counts the segments it has finished.
// Included by gdn_core.cu after Args, inside its anonymous namespace.
//
// When a.progress is set, each block of a sweep adds 1 to its segment's counter (forward sweep:
// a.progress[j]; reverse: a.progress[a.nseg + j]) once its stores of segment j are out. One
// thread does it after a barrier every warp of the block has passed after its stores (the block
// barrier that opens the next step, or the sweep warps' barrier after the last step): the barrier
// orders the block's stores before that thread's __threadfence(), and the fence before the count,
// so a wait that sees every block's count sees the segment's Hs, V_new (dHs, dV_new) in memory
// (CUTLASS's semaphore publishes a block's tile this way). The count costs the sweep one fence per
// segment in one thread, off the chain where a copy warp does it. Without a.progress nothing is
// counted (one test of a null pointer per step in that thread).

// Named barrier of a sweep block's sweep warps (ids 1..RG are the row groups' pairs).
constexpr int kProgressBarrier = 15;

struct Progress {
  unsigned* counters;  // this sweep's segment counters, or null: count nothing
  int seg, steps, next;
  __device__ Progress(const Args& a, bool reverse, int steps_)
      : counters(a.progress ? a.progress + (reverse ? a.nseg : 0) : nullptr), seg(a.seg), steps(steps_), next(a.seg) {}
  // After the block barrier that opens step i (every warp's stores of steps < i are issued):
  // counts a segment that ended at step i.
  __device__ void at_step(int i) {
    if (counters && i == next) {
      count(i / seg - 1);
      next += seg;
    }
  }
  // After the sweep warps' barrier that follows their last step: counts the last segment.
  __device__ void at_end() {
    if (counters) count((steps - 1) / seg);
  }
  __device__ void count(int j) const {
    __threadfence();
    atomicAdd(counters + j, 1u);
  }
};
