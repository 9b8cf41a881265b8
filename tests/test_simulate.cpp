#include <gtest/gtest.h>

#include <map>

#include "core/error.h"
#include "pipeline/dependency.h"
#include "pipeline/lower.h"
#include "pipeline/simulate.h"
#include "test_util.h"

using namespace stateflow;

namespace {

constexpr int kActivations = static_cast<int>(MemCategory::Activations);

// Closed form for every generated kind with equal per-unit costs: the critical path is the
// first unit forward through P-1 stages, all M*N units on one stage, and the last unit's
// backward through P-1 stages, and no stage waits beyond it.
void expect_closed_form(const Schedule& s, double forward, double backward) {
  const int units = s.M * s.N;
  const SimResult r = simulate(s, uniform_costs(s.P, s.N, forward, backward));
  SCOPED_TRACE(cat(kind_name(s.kind), " P=", s.P, " M=", s.M, " N=", s.N, " f=", forward, " b=", backward));
  EXPECT_EQ(r.makespan, (units + s.P - 1) * (forward + backward));
  EXPECT_NEAR(r.bubble_fraction, double(s.P - 1) / (units + s.P - 1), 1e-12);
  for (int st = 0; st < s.P; ++st) EXPECT_EQ(r.busy[st], units * (forward + backward));
}

}  // namespace

TEST(Simulate, OneFOneBBubble) {
  for (int P = 1; P <= 8; ++P)
    for (int M = 1; M <= 8; ++M) expect_closed_form(make_schedule("1f1b", P, M, 1), 1, 2);
}

// Chunks cost 1/N of a sequence: forward 1 and backward 2 per chunk is the same as N and 2N
// per sequence (bubble fractions do not change with the time unit) and keeps times exact.
TEST(Simulate, StateflowBubble) {
  for (int P = 1; P <= 8; ++P)
    for (int M = 1; M <= 8; ++M)
      for (int N = 1; N <= 16; ++N) expect_closed_form(make_schedule("stateflow", P, M, N), 1, 2);
  const SimResult r = simulate(make_schedule("stateflow", 4, 3, 8), uniform_costs(4, 8, 1.0 / 8, 2.0 / 8));
  EXPECT_NEAR(r.bubble_fraction, 3.0 / (3 * 8 + 3), 1e-12);
}

TEST(Simulate, GpipeBubble) {
  for (int P = 1; P <= 8; ++P)
    for (int M = 1; M <= 8; ++M) {
      const double gpipe = simulate(make_schedule("gpipe", P, M, 1), uniform_costs(P, 1, 1, 2)).bubble_fraction;
      EXPECT_EQ(gpipe, simulate(make_schedule("1f1b", P, M, 1), uniform_costs(P, 1, 1, 2)).bubble_fraction);
      for (int N : {2, 5, 16}) expect_closed_form(make_schedule("gpipe", P, M, N), 1, 2);
    }
}

TEST(Simulate, ClosedFormHoldsForAnyCostRatio) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int trial = 0; trial < 40; ++trial) {
    const int P = 1 + rng.below(8), M = 1 + rng.below(8), N = 1 + rng.below(16);
    const double f = 1 + rng.below(9), b = 1 + rng.below(9);
    expect_closed_form(make_schedule(rng.below(2) ? "stateflow" : "gpipe", P, M, N), f, b);
  }
}

// Stage 0 of 1f1b holds min(M, P) whole sequences; stage r of stateflow min(M*N, N+P-1-r)
// chunks, i.e. (N+P-1)/N sequences on stage 0 once M*N >= N+P-1; gpipe holds all M*N.
TEST(Simulate, PeakBytes) {
  const int64_t sequence_bytes = 3 * 5 * 7 * 16 * 1024;  // divisible by every N below
  for (int P = 1; P <= 8; ++P)
    for (int M = 1; M <= 8; ++M)
      for (int N : {1, 2, 3, 5, 7, 16}) {
        SCOPED_TRACE(cat("P=", P, " M=", M, " N=", N));
        const int64_t chunk_bytes = sequence_bytes / N;
        for (ScheduleKind kind : {ScheduleKind::StateFlow, ScheduleKind::GPipe}) {
          const SimResult r = simulate(make_schedule(kind, P, M, N), uniform_costs(P, N, 1, 2, chunk_bytes));
          for (int st = 0; st < P; ++st) {
            EXPECT_EQ(r.peak_in_flight[st], in_flight_bound(kind, P, M, N, st));
            EXPECT_EQ(r.peak_bytes[st][kActivations], r.peak_in_flight[st] * chunk_bytes);
            EXPECT_EQ(r.peak_total_bytes[st], r.peak_bytes[st][kActivations]);
          }
          if (kind == ScheduleKind::GPipe) {
            EXPECT_EQ(r.peak_bytes[0][kActivations], M * sequence_bytes);
          } else if (M * N >= N + P - 1) {
            EXPECT_EQ(r.peak_bytes[0][kActivations] * N, (N + P - 1) * sequence_bytes);
          }
        }
        if (N == 1) {
          const SimResult r = simulate(make_schedule("1f1b", P, M, 1), uniform_costs(P, 1, 1, 2, sequence_bytes));
          EXPECT_EQ(r.peak_bytes[0][kActivations], std::min(M, P) * sequence_bytes);
        }
      }
}

TEST(Simulate, ResidentAndPerCategoryBytes) {
  const int P = 3, M = 4, N = 2;
  CostTable costs = uniform_costs(P, N, 1, 2, 100);
  for (int r = 0; r < P; ++r) {
    ByteCounts resident{};
    resident[static_cast<int>(MemCategory::Weights)] = 1000 * (r + 1);
    resident[static_cast<int>(MemCategory::Optimizer)] = 2000;
    costs.resident_bytes.push_back(resident);
    for (int c = 0; c < N; ++c) costs.unit_bytes[r][c][static_cast<int>(MemCategory::BoundaryState)] = 10 * (c + 1);
  }
  const SimResult r = simulate(make_schedule("stateflow", P, M, N), costs);
  for (int st = 0; st < P; ++st) {
    const int held = in_flight_bound(ScheduleKind::StateFlow, P, M, N, st);
    EXPECT_EQ(r.peak_bytes[st][static_cast<int>(MemCategory::Weights)], 1000 * (st + 1));
    EXPECT_EQ(r.peak_bytes[st][static_cast<int>(MemCategory::Optimizer)], 2000);
    EXPECT_EQ(r.peak_bytes[st][kActivations], held * 100);
    // Peak boundary bytes: the held units are consecutive in (m, c) order, so with N = 2
    // they alternate chunk 0 (10 bytes) and chunk 1 (20 bytes); the first peak starts at (0, 0).
    const int64_t boundary = r.peak_bytes[st][static_cast<int>(MemCategory::BoundaryState)];
    EXPECT_EQ(boundary, (held / 2) * 30 + (held % 2) * 10);
    EXPECT_EQ(r.peak_total_bytes[st], 1000 * (st + 1) + 2000 + held * 100 + boundary);
  }
}

// A microbatch's K/V prefix lives from its first forward to its chunk 0 backward, its gradient
// from its first backward on. Whole sequences (N = 1): 1f1b's stage r holds min(M, P - r)
// microbatches when the oldest starts its backward, GPipe holds all M.
TEST(Simulate, KvPrefixBytesPerMicrobatchInFlight) {
  const int P = 3, M = 4;
  const int kv = static_cast<int>(MemCategory::KvPrefix);
  CostTable costs = uniform_costs(P, 1, 1, 2, 7);
  costs.kv_prefix_bytes = {100, 100, 100}, costs.kv_grad_bytes = {1000, 1000, 1000};
  const SimResult one = simulate(make_schedule("1f1b", P, M, 1), costs);
  for (int st = 0; st < P; ++st) EXPECT_EQ(one.peak_bytes[st][kv], std::min(M, P - st) * 100 + 1000) << st;
  const SimResult all = simulate(make_schedule("gpipe", P, M, 1), costs);
  for (int st = 0; st < P; ++st) EXPECT_EQ(all.peak_bytes[st][kv], M * 100 + 1000) << st;
  EXPECT_EQ(all.peak_total_bytes[0], M * 7 + M * 100 + 1000 - 7);  // the B frees its own unit first
  // Chunked: the prefix is per microbatch, not per unit, and a 1-microbatch run holds one.
  CostTable chunked = uniform_costs(1, 5, 1, 2);
  chunked.kv_prefix_bytes = {100}, chunked.kv_grad_bytes = {1000};
  EXPECT_EQ(simulate(make_schedule("stateflow", 1, 1, 5), chunked).peak_bytes[0][kv], 1100);
  costs.kv_grad_bytes = {1, 2};
  EXPECT_THROW(simulate(make_schedule("1f1b", P, M, 1), costs), Error);
}

// One unit through two stages with a message time d each way.
TEST(Simulate, CommunicationTime) {
  CostTable costs{.forward_time = {{2}, {3}},
                  .backward_time = {{5}, {7}},
                  .unit_bytes = {},
                  .resident_bytes = {},
                  .send_time = {0.5},
                  .kv_prefix_bytes = {},
                  .kv_grad_bytes = {},
                  .forward_work_bytes = {},
                  .backward_work_bytes = {},
                  .shared_device = false};
  const SimResult r = simulate(make_schedule("1f1b", 2, 1, 1), costs);
  EXPECT_EQ(r.makespan, 2 + 0.5 + 3 + 7 + 0.5 + 5);
  ASSERT_EQ(r.timeline.size(), 4u);
  EXPECT_EQ(to_token(r.timeline[1].action), "F0.0");
  EXPECT_EQ(r.timeline[1].action.stage, 1);
  EXPECT_EQ(r.timeline[1].start, 2.5);
  EXPECT_EQ(r.busy[0], 7);
  EXPECT_EQ(r.busy[1], 10);
  EXPECT_DOUBLE_EQ(r.bubble_fraction, 1 - 17.0 / (2 * 18));
}

// Stages on one device: one action at a time and the device never idle (the schedule cannot
// deadlock, so some stage's next action is always ready), every action after its prerequisites.
TEST(Simulate, SharedDeviceRunsOneActionAtATime) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE(cat("seed ", seed));
  Rng rng(seed);
  for (int trial = 0; trial < 30; ++trial) {
    const int P = 2 + int(rng.below(3)), M = 1 + int(rng.below(4));
    const char* kind = trial % 3 == 0 ? "1f1b" : trial % 3 == 1 ? "gpipe" : "stateflow";
    const int N = trial % 3 == 2 ? 1 + int(rng.below(5)) : 1;
    CostTable costs = uniform_costs(P, N, 0, 0);
    double total = 0;
    for (int r = 0; r < P; ++r)
      for (int c = 0; c < N; ++c) {
        costs.forward_time[r][c] = 1 + rng.uniform(), costs.backward_time[r][c] = 2 + rng.uniform();
        total += M * (costs.forward_time[r][c] + costs.backward_time[r][c]);
      }
    costs.shared_device = true;
    const Schedule s = make_schedule(kind, P, M, N);
    const SimResult r = simulate(s, costs);
    EXPECT_NEAR(r.makespan, total, 1e-9 * total) << kind << " P=" << P << " M=" << M << " N=" << N;
    std::map<std::string, double> end;
    for (size_t i = 0; i < r.timeline.size(); ++i) {
      const TimedAction& t = r.timeline[i];
      if (i) EXPECT_GE(t.start, r.timeline[i - 1].end - 1e-12);
      for (const Action& need : prerequisites(t.action, P, N)) EXPECT_GE(t.start, end.at(cat(need.stage, to_token(need))));
      end[cat(t.action.stage, to_token(t.action))] = t.end;
    }
    costs.shared_device = false;  // one device per stage is never slower
    EXPECT_LE(simulate(s, costs).makespan, r.makespan + 1e-12);
  }
}

// Working memory comes on top of what the stage holds while the action runs, its own unit's
// stash included (a backward frees it as it ends).
TEST(Simulate, WorkingBytesComeOnTopOfWhatTheStageHolds) {
  CostTable costs = uniform_costs(1, 3, 1, 2, 100);
  costs.forward_work_bytes = {{10, 10, 10}};
  costs.backward_work_bytes = {{1000, 5, 5}};
  SimResult r = simulate(make_schedule("stateflow", 1, 1, 3), costs);
  EXPECT_EQ(r.peak_bytes[0][kActivations], 300);
  EXPECT_EQ(r.peak_bytes[0][static_cast<int>(MemCategory::Other)], 1000);
  EXPECT_EQ(r.peak_total_bytes[0], 100 + 1000);  // chunk 0's backward, its own stash still held
  costs.backward_work_bytes = {{5, 5, 5}};
  r = simulate(make_schedule("stateflow", 1, 1, 3), costs);
  EXPECT_EQ(r.peak_total_bytes[0], 300 + 10);  // the last forward: every stash and its scratch
  costs.backward_work_bytes = {{5, 5}};
  EXPECT_THROW(simulate(make_schedule("stateflow", 1, 1, 3), costs), Error);
}

// Against a plain reference: the longest-path times found by relaxing every action until
// nothing changes, with random per-stage, per-chunk costs and message times.
TEST(Simulate, MatchesLongestPathReference) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    const int P = 1 + rng.below(5), M = 1 + rng.below(4), N = 1 + rng.below(5);
    const Schedule s = make_schedule(rng.below(2) ? "stateflow" : "gpipe", P, M, N);
    CostTable costs = uniform_costs(P, N, 0, 0);
    for (int r = 0; r < P; ++r)
      for (int c = 0; c < N; ++c) {
        costs.forward_time[r][c] = 1 + rng.below(5);
        costs.backward_time[r][c] = 1 + rng.below(9);
      }
    for (int c = 0; c < N; ++c) costs.send_time.push_back(rng.below(3));

    std::vector<double> start(2 * P * M * N, 0), end(2 * P * M * N, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (int r = 0; r < P; ++r)
        for (size_t i = 0; i < s.per_stage[r].size(); ++i) {
          const Action& a = s.per_stage[r][i];
          double t = i > 0 ? end[compute_index(s.per_stage[r][i - 1], M, N)] : 0;
          for (const Action& need : prerequisites(a, P, N))
            t = std::max(t, end[compute_index(need, M, N)] + (need.stage != r ? costs.send_time[need.chunk] : 0));
          const int k = compute_index(a, M, N);
          const double finish = t + (a.op == Op::Forward ? costs.forward_time : costs.backward_time)[r][a.chunk];
          if (t != start[k] || finish != end[k]) {
            start[k] = t;
            end[k] = finish;
            changed = true;
          }
        }
    }
    const SimResult result = simulate(s, costs);
    ASSERT_EQ(result.timeline.size(), 2u * P * M * N);
    double makespan = 0;
    for (const TimedAction& t : result.timeline) {
      const int k = compute_index(t.action, M, N);
      EXPECT_EQ(t.start, start[k]) << to_token(t.action) << " on stage " << t.action.stage;
      EXPECT_EQ(t.end, end[k]) << to_token(t.action) << " on stage " << t.action.stage;
      makespan = std::max(makespan, end[k]);
    }
    EXPECT_EQ(result.makespan, makespan);
    for (size_t i = 1; i < result.timeline.size(); ++i)
      EXPECT_LE(result.timeline[i - 1].start, result.timeline[i].start);
  }
}

TEST(Simulate, Rejects) {
  const Schedule s = make_schedule("stateflow", 2, 2, 2);
  EXPECT_THROW(simulate(lower_schedule(s), uniform_costs(2, 2, 1, 2)), Error);
  EXPECT_THROW(simulate(s, uniform_costs(2, 3, 1, 2)), Error);
  EXPECT_THROW(simulate(s, uniform_costs(3, 2, 1, 2)), Error);
  CostTable costs = uniform_costs(2, 2, 1, 2);
  costs.send_time = {1};
  EXPECT_THROW(simulate(s, costs), Error);
  Schedule broken = s;
  std::swap(broken.per_stage[0][0], broken.per_stage[0][1]);
  try {
    simulate(broken, uniform_costs(2, 2, 1, 2));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(">>F0.1<<"), std::string::npos) << e.what();
  }
}

// A negative or NaN cost (a measurement gone wrong) is refused with an error instead of a
// simulation that never finds a ready action.
TEST(Simulate, RejectsNegativeOrNanCosts) {
  const Schedule s = make_schedule("stateflow", 2, 2, 4);
  CostTable t = uniform_costs(2, 4, 1, 2);
  t.backward_time[1][3] = -1e-3;
  EXPECT_THROW(simulate(s, t), Error);
  t = uniform_costs(2, 4, 1, 2);
  t.forward_time[0][0] = std::nan("");
  EXPECT_THROW(simulate(s, t), Error);
  t = uniform_costs(2, 4, 1, 2);
  t.send_time = {0.1, 0.1, -0.1, 0.1};
  EXPECT_THROW(simulate(s, t), Error);
  t.send_time = {0.1, 0.1, 0.1, 0.1};
  EXPECT_GT(simulate(s, t).makespan, 0);
}
