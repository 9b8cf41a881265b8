// The GDN core's reverse sweep (B3) overlapped with B4 (GdnCudaConfig::overlap, lever core_overlap;
// docs/design.md "The GDN core's overlap"): which sub-chunks each B4 launch takes once the sweeps
// have passed how far. Host code without CUDA, so that the CPU tests check the plan.
//
// A sweep over ns sub-chunks is cut into segments of `seg` sub-chunks, counted in its own order:
// the forward sweep's segment j is sub-chunks [j seg, min((j + 1) seg, ns)), the reverse sweep's
// (last sub-chunk first) [max(ns - (j + 1) seg, 0), ns - j seg). Every block of a sweep bumps its
// segment's counter once its stores of the segment are out; a B4 launch waits until the counters
// it names have every block.
#pragma once
#include <vector>

namespace stateflow {

// One B4 launch: sub-chunks [first, first + count), after the reverse sweep's segment
// reverse_segment and, when the forward sweep runs beside it, the forward sweep's segment
// forward_segment are done (-1: no wait on it). A sweep's blocks walk their segments in order, so
// a done segment means every earlier one is done too.
struct OverlapLaunch {
  int first = 0, count = 0;
  int forward_segment = -1, reverse_segment = -1;
};

// Segments of a sweep over ns sub-chunks, seg each.
int overlap_segments(int ns, int seg);

// The launches that cover sub-chunks [0, ns) once each: the reverse sweep's segments, in its order
// (last sub-chunks first). With the forward sweep beside it (with_forward: B3 re-runs it for B4's
// V_new and states), each also waits for the forward segment that holds its last sub-chunk, and
// they are ordered by when both sweeps will have passed them (counting steps, both sweeps running
// side by side from the start: the middle first), earlier sub-chunks first on a tie. Refuses ns < 1
// and seg < 1.
std::vector<OverlapLaunch> overlap_plan(int ns, int seg, bool with_forward);

}  // namespace stateflow
