#include "mixers/gdn/gdn_core_overlap.h"

#include <algorithm>

#include "core/error.h"

namespace stateflow {

int overlap_segments(int ns, int seg) {
  SF_CHECK(ns >= 1 && seg >= 1, "GDN core overlap: needs at least one sub-chunk and a segment of at least one, got ",
           ns, " sub-chunks and segments of ", seg);
  return (ns + seg - 1) / seg;
}

std::vector<OverlapLaunch> overlap_plan(int ns, int seg, bool with_forward) {
  const int nseg = overlap_segments(ns, seg);
  std::vector<OverlapLaunch> plan(static_cast<size_t>(nseg));
  for (int j = 0; j < nseg; ++j) {
    OverlapLaunch& l = plan[size_t(j)];
    const int end = ns - j * seg;
    l.first = std::max(end - seg, 0), l.count = end - l.first, l.reverse_segment = j;
    if (with_forward) l.forward_segment = (end - 1) / seg;
  }
  if (with_forward) {
    // Steps each sweep has taken when it is done with the launch's segment.
    auto ready = [&](const OverlapLaunch& l) {
      return std::max(std::min((l.forward_segment + 1) * seg, ns), std::min((l.reverse_segment + 1) * seg, ns));
    };
    std::stable_sort(plan.begin(), plan.end(), [&](const OverlapLaunch& x, const OverlapLaunch& y) {
      return ready(x) != ready(y) ? ready(x) < ready(y) : x.first < y.first;
    });
  }
  return plan;
}

}  // namespace stateflow
