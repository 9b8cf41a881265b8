// The sweeps' side of the overlap (GdnCudaConfig::overlap; the plan in gdn_core_overlap.h, the
// streams in gdn_core_overlap_cuda.h): a block of B3's quarter sweeps (the reverse sweep, and the
// forward sweep it re-runs beside it) counts the segments it has finished.
// Included by gdn_core.cu after Args, inside its anonymous namespace.
//
// The sweep kernels take kCount as a template parameter: without it (the sequential stages) they
// are the code they were before the overlap (a hook that only tested a null pointer cost the
// sweeps 7-18 % on the H200). With it, each block of a sweep adds 1 to its segment's counter
// (forward sweep: a.progress[j]; reverse: a.progress[a.nseg + j]) once its stores of segment j
// are out. One thread does it after a barrier every warp of the block has passed after its stores
// (the block barrier that opens the next step, or the sweep warps' barrier after the last step):
// the barrier orders the block's stores before that thread's __threadfence(), and the fence before
// the count, so a wait that sees every block's count sees the segment's Hs, V_new (dHs, dV_new)
// in memory (CUTLASS's semaphore publishes a block's tile this way). Nothing is kept in registers
// across the steps for it (a.seg, a.nseg and a.progress are re-read from the kernel's parameters),
// and where a copy warp runs it counts, off the sweep's chain; elsewhere thread 0, one fence per
// segment.

// Named barrier of a sweep block's sweep warps (ids 1..RG are the row groups' pairs).
constexpr int kProgressBarrier = 15;

__device__ void count_segment(const Args& a, bool reverse, int j) {
  __threadfence();
  atomicAdd(a.progress + (reverse ? a.nseg : 0) + j, 1u);
}

// After the block barrier that opens step i (every warp's stores of the steps before it issued):
// counts the segment that ended there, if one did. One thread.
__device__ void count_at_step(const Args& a, bool reverse, int i) {
  if (i > 0 && i % a.seg == 0) count_segment(a, reverse, i / a.seg - 1);
}

// After a sweep's last step: its NWB sweep warps meet (a copy warp has left) and one thread counts
// the last segment.
template <int NWB>
__device__ void count_last_segment(const Args& a, bool reverse) {
  cuda::group_sync(kProgressBarrier, NWB * 32);
  if (threadIdx.x == 0) count_segment(a, reverse, (a.NS - 1) / a.seg);
}
