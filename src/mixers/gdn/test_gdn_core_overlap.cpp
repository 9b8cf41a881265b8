// The GDN core overlap's plan (mixers/gdn/gdn_core_overlap.h): which sub-chunks each B4 launch
// takes and which sweep segments it waits for. Host code: runs without a GPU. (That the
// overlapped core gives the sequential bits is GdnCoreCuda.OverlapGivesTheSequentialBits.)
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "mixers/gdn/gdn_core_overlap.h"

namespace stateflow {
namespace {

// Sub-chunks [first, end) of a sweep's segment j (the reverse sweep counts from the last).
struct Range {
  int first, end;
};
Range forward_segment(int ns, int seg, int j) { return {j * seg, std::min((j + 1) * seg, ns)}; }
Range reverse_segment(int ns, int seg, int j) { return {std::max(ns - (j + 1) * seg, 0), ns - j * seg}; }

// Every sub-chunk in exactly one launch, and each launch's sub-chunks inside the segments it
// waits for (so everything it reads is written by then): the reverse sweep's segment that holds
// all of them, and with the forward sweep beside it, the forward segment that holds its last.
void expect_covered_and_waited_for(int ns, int seg, bool fwd) {
  SCOPED_TRACE(std::to_string(ns) + " sub-chunks, segments of " + std::to_string(seg) + (fwd ? ", with forward" : ""));
  const std::vector<OverlapLaunch> plan = overlap_plan(ns, seg, fwd);
  EXPECT_EQ(int(plan.size()), overlap_segments(ns, seg));
  std::vector<int> taken(size_t(ns), 0);
  for (const OverlapLaunch& l : plan) {
    ASSERT_GE(l.count, 1);
    ASSERT_GE(l.first, 0);
    ASSERT_LE(l.first + l.count, ns);
    for (int n = l.first; n < l.first + l.count; ++n) ++taken[size_t(n)];
    EXPECT_EQ(l.forward_segment >= 0, fwd);
    ASSERT_GE(l.reverse_segment, 0);
    if (fwd) EXPECT_GE(forward_segment(ns, seg, l.forward_segment).end, l.first + l.count);
    EXPECT_LE(reverse_segment(ns, seg, l.reverse_segment).first, l.first);
  }
  for (int n = 0; n < ns; ++n) EXPECT_EQ(taken[size_t(n)], 1) << "sub-chunk " << n;
}

TEST(GdnCoreOverlapPlan, EverySubChunkOnceAfterTheSegmentsThatWriteIt) {
  for (int ns : {1, 2, 7, 32, 33, 512, 513})
    for (int seg : {1, 3, 8, 32, 64})
      for (bool fwd : {false, true}) expect_covered_and_waited_for(ns, seg, fwd);
}

// B4 from a kept sweep takes the reverse sweep's segments in its order, last sub-chunks first, a
// short segment where the sweep ends.
TEST(GdnCoreOverlapPlan, TheReverseSweepsLaunchesFollowItsOrder) {
  const std::vector<OverlapLaunch> b4 = overlap_plan(10, 4, false);
  ASSERT_EQ(b4.size(), 3u);
  EXPECT_EQ(b4[0].first, 6);
  EXPECT_EQ(b4[0].count, 4);
  EXPECT_EQ(b4[0].reverse_segment, 0);
  EXPECT_EQ(b4[2].first, 0);
  EXPECT_EQ(b4[2].count, 2);
  EXPECT_EQ(b4[2].reverse_segment, 2);
}

// With both sweeps (B4 while B3 re-runs the forward sweep beside its own), the middle of the
// sequence is done first: the launches go from the middle outwards, each waiting for the forward
// segment that holds its last sub-chunk.
TEST(GdnCoreOverlapPlan, BothSweepsStartFromTheMiddle) {
  const std::vector<OverlapLaunch> plan = overlap_plan(8, 2, true);
  std::vector<int> firsts;
  for (const OverlapLaunch& l : plan) firsts.push_back(l.first);
  // Segments (first sub-chunk: ready after max(forward, reverse) steps): 6: 8, 4: 6, 2: 6, 0: 8.
  EXPECT_EQ(firsts, (std::vector<int>{2, 4, 0, 6}));
  EXPECT_EQ(plan[0].forward_segment, 1);
  EXPECT_EQ(plan[0].reverse_segment, 2);
}

TEST(GdnCoreOverlapPlan, RefusesEmptyPlans) {
  EXPECT_THROW(overlap_plan(0, 4, true), Error);
  EXPECT_THROW(overlap_plan(4, 0, false), Error);
}

}  // namespace
}  // namespace stateflow
