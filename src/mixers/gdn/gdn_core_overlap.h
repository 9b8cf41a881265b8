// The GDN core's sweeps overlapped with its stages that are parallel over sub-chunks
// (GdnCudaConfig::overlap, lever core_overlap; docs/design.md "The GDN core's overlap"): which
// sub-chunks a consumer kernel (Out in the forward, B4 in the backward) may take once the sweeps
// have passed how far. Host code without CUDA, so that the CPU tests check the plan.
//
// A sweep over ns sub-chunks is cut into segments of `seg` sub-chunks, counted in its own order:
// the forward sweep's segment j is sub-chunks [j seg, min((j + 1) seg, ns)), the reverse sweep's
// (last sub-chunk first) [max(ns - (j + 1) seg, 0), ns - j seg). Every block of a sweep bumps its
// segment's counter once its stores of the segment are out; a consumer launch waits until the
// counters it names have every block.
#pragma once
#include <vector>

namespace stateflow {

// One consumer launch: sub-chunks [first, first + count), after the forward sweep's segment
// forward_segment and the reverse sweep's segment reverse_segment are done (-1: no wait on that
// sweep). A sweep's blocks walk their segments in order, so a done segment means every earlier
// one is done too.
struct OverlapLaunch {
  int first = 0, count = 0;
  int forward_segment = -1, reverse_segment = -1;
};

// Segments of a sweep over ns sub-chunks, seg each.
int overlap_segments(int ns, int seg);

// The consumer launches that cover sub-chunks [0, ns) once each, for a consumer that needs the
// forward sweep's results (needs_forward), the reverse sweep's (needs_reverse), or both. With the
// reverse sweep, the launches are its segments; with both, each also waits for the forward
// segment that holds its last sub-chunk, and they are ordered by when both sweeps will have passed
// them (counting steps, both sweeps running side by side from the start: the middle first),
// earlier sub-chunks first on a tie. Refuses ns < 1, seg < 1 and a consumer that needs nothing.
std::vector<OverlapLaunch> overlap_plan(int ns, int seg, bool needs_forward, bool needs_reverse);

}  // namespace stateflow
