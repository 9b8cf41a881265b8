#include <gtest/gtest.h>

#include "core/error.h"
#include "pipeline/check.h"
#include "pipeline/dependency.h"
#include "pipeline/lower.h"
#include "test_util.h"

using namespace stateflow;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string marked(const Action& a) { return ">>" + to_token(a) + "<<"; }

Schedule random_schedule(Rng& rng, int min_P = 1) {
  const int P = min_P + rng.below(9 - min_P), M = 1 + rng.below(8), N = 1 + rng.below(8);
  const ScheduleKind kind =
      N == 1 && rng.below(2) ? ScheduleKind::OneFOneB : (rng.below(2) ? ScheduleKind::StateFlow : ScheduleKind::GPipe);
  return make_schedule(kind, P, M, N);
}

}  // namespace

// Every generated schedule, raw and lowered, passes; each holds exactly its in-flight bound,
// and in unit time (F = B = 1 step) runs in 2 (M*N + P - 1) steps unlowered.
TEST(Check, AllGeneratedSchedulesPass) {
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::StateFlow})
    for (int P = 1; P <= 8; ++P)
      for (int M = 1; M <= 8; ++M)
        for (int N = 1; N <= (kind == ScheduleKind::OneFOneB ? 1 : 16); ++N) {
          const Schedule s = make_schedule(kind, P, M, N);
          SCOPED_TRACE(cat(kind_name(kind), " P=", P, " M=", M, " N=", N));
          const CheckResult raw = check_schedule(s);
          ASSERT_TRUE(raw.ok) << raw.message;
          EXPECT_EQ(raw.steps, 2 * (M * N + P - 1));
          for (int r = 0; r < P; ++r) EXPECT_EQ(raw.peak_in_flight[r], in_flight_bound(kind, P, M, N, r));
          const CheckResult lowered = check_schedule(lower_schedule(s));
          ASSERT_TRUE(lowered.ok) << lowered.message;
          EXPECT_EQ(lowered.peak_in_flight, raw.peak_in_flight);
        }
}

TEST(Check, ExecutionGridMatchesHandWritten) {
  EXPECT_EQ(render_execution_grid(make_schedule("stateflow", 2, 2, 2)),
            "step     0     1     2     3     4     5     6     7     8     9\n"
            "stage 0  F0.0  F0.1  F1.0  .     B0.1  F1.1  B0.0  .     B1.1  B1.0\n"
            "stage 1  .     F0.0  F0.1  B0.1  F1.0  B0.0  F1.1  B1.1  B1.0  .\n");
}

TEST(Check, CrossStageCycleIsADeadlock) {
  // Stage 0 runs B0.0 before F1.0, but stage 1 wants F1.0 before it can produce B0.0.
  const Schedule s = parse_schedule_text(
      "schedule gpipe P=2 M=2 N=1\n"
      "stage 0: F0.0 B0.0 F1.0 B1.0\n"
      "stage 1: F1.0 F0.0 B0.0 B1.0\n");
  const CheckResult r = check_schedule(s);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.violation, Violation::Deadlock);
  EXPECT_EQ(r.message,
            "deadlock: no stage can move at step 1: stage 0 waits at B0.0 for B0.0 on stage 1; "
            "stage 1 waits at F1.0 for F1.0 on stage 0\n"
            "step     0     1\n"
            "stage 0  F0.0  >>B0.0<<\n"
            "stage 1  .     >>F1.0<<\n");
}

// The boundary-state dependencies on one stage: chunks forward in order, backward in reverse.
TEST(Check, ChunkOrderWithinAStage) {
  CheckResult r = check_schedule(parse_schedule_text("schedule stateflow P=1 M=1 N=2\nstage 0: F0.1 F0.0 B0.1 B0.0\n"));
  EXPECT_EQ(r.violation, Violation::Order);
  EXPECT_TRUE(contains(r.message, "stage 0 cannot run F0.1: it needs F0.0, which stage 0 runs later")) << r.message;
  r = check_schedule(parse_schedule_text("schedule stateflow P=1 M=1 N=2\nstage 0: F0.0 F0.1 B0.0 B0.1\n"));
  EXPECT_EQ(r.violation, Violation::Order);
  EXPECT_TRUE(contains(r.message, "stage 0 cannot run B0.0: it needs B0.1, which stage 0 runs later")) << r.message;
}

// Swapping an action with a prerequisite on its own stage is caught as an order violation
// at that action, raw or lowered.
TEST(Check, SwappedDependencyIsAnOrderViolation) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int trial = 0; trial < 60; ++trial) {
    Schedule s = random_schedule(rng);
    if (trial % 2) s = lower_schedule(s);
    const int r = rng.below(s.P);
    auto& list = s.per_stage[r];
    const int i = rng.below(list.size());
    if (!is_compute(list[i])) continue;
    std::vector<Action> own;
    for (const Action& need : prerequisites(list[i], s.P, s.N))
      if (need.stage == r) own.push_back(need);
    if (own.empty()) continue;
    const Action need = own[rng.below(own.size())];
    const auto j = std::find(list.begin(), list.end(), need) - list.begin();
    const Action moved = list[i];
    std::swap(list[i], list[j]);
    const CheckResult result = check_schedule(s);
    SCOPED_TRACE(to_text(s));
    EXPECT_EQ(result.violation, Violation::Order) << result.message;
    EXPECT_TRUE(contains(result.message, marked(moved))) << result.message;
    EXPECT_TRUE(contains(result.message, "cannot run " + to_token(moved) + ": it needs ")) << result.message;
  }
}

TEST(Check, DroppedActionIsMissing) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int trial = 0; trial < 30; ++trial) {
    Schedule s = random_schedule(rng);
    const int r = rng.below(s.P);
    auto& list = s.per_stage[r];
    const int i = rng.below(list.size());
    const Action dropped = list[i];
    list.erase(list.begin() + i);
    const CheckResult result = check_schedule(s);
    EXPECT_EQ(result.violation, Violation::Missing) << result.message;
    EXPECT_TRUE(contains(result.message, cat("stage ", r, " never runs ", to_token(dropped)))) << result.message;
    EXPECT_TRUE(contains(result.message, "pos ")) << result.message;  // the grid of stage lists
  }
}

TEST(Check, DuplicatedActionIsDuplicate) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int trial = 0; trial < 30; ++trial) {
    Schedule s = random_schedule(rng);
    const int r = rng.below(s.P);
    auto& list = s.per_stage[r];
    const Action copy = list[rng.below(list.size())];
    list.insert(list.begin() + rng.below(list.size() + 1), copy);
    const CheckResult result = check_schedule(s);
    EXPECT_EQ(result.violation, Violation::Duplicate) << result.message;
    EXPECT_TRUE(contains(result.message, cat("stage ", r, " runs ", to_token(copy), " twice"))) << result.message;
    EXPECT_TRUE(contains(result.message, marked(copy))) << result.message;
  }
}

TEST(Check, MemoryBound) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    const Schedule s = random_schedule(rng);
    CheckOptions options;
    for (int r = 0; r < s.P; ++r) options.max_in_flight.push_back(in_flight_bound(s.kind, s.P, s.M, s.N, r));
    const int tight = rng.below(s.P);
    options.max_in_flight[tight] -= 1;  // the generators' bounds are exact, so one less must fail
    const CheckResult result = check_schedule(s, options);
    EXPECT_EQ(result.violation, Violation::Memory) << to_text(s);
    EXPECT_TRUE(contains(result.message, cat("the bound is ", options.max_in_flight[tight]))) << result.message;
    options.check_memory = false;
    EXPECT_TRUE(check_schedule(s, options).ok);
  }
  // gpipe holds every unit; held to stateflow's bounds it fails on stage 0 at its 4th forward.
  Schedule gpipe = make_schedule("gpipe", 2, 3, 2);
  gpipe.kind = ScheduleKind::StateFlow;
  const CheckResult result = check_schedule(gpipe);
  EXPECT_EQ(result.violation, Violation::Memory);
  EXPECT_TRUE(contains(result.message, "stage 0 holds 4 units forwarded but not yet backwarded after F1.1"))
      << result.message;
  EXPECT_TRUE(contains(result.message, ">>F1.1<<")) << result.message;
  EXPECT_THROW(check_schedule(gpipe, {.check_memory = true, .max_in_flight = {1, 2, 3}}), Error);
}

TEST(Check, BadActions) {
  Schedule s = make_schedule("stateflow", 3, 2, 2);
  s.per_stage[1][2].stage = 2;
  EXPECT_EQ(check_schedule(s).violation, Violation::BadAction);
  s = make_schedule("stateflow", 3, 2, 2);
  s.per_stage[0][0].chunk = 2;
  EXPECT_TRUE(contains(check_schedule(s).message, "chunk out of range (N=2)"));
  s = make_schedule("stateflow", 3, 2, 2);
  s.per_stage[0].push_back({.op = Op::Send, .microbatch = 0, .chunk = 0, .stage = 0, .peer = 1});
  EXPECT_TRUE(contains(check_schedule(s).message, "belong to lowered schedules only"));
  s = lower_schedule(make_schedule("stateflow", 3, 2, 2));
  s.per_stage[0][1].peer = 2;  // sF0.0 to stage 2, which takes its input from stage 1
  const CheckResult result = check_schedule(s);
  EXPECT_EQ(result.violation, Violation::BadAction);
  EXPECT_TRUE(contains(result.message, "stage 2 does not need the output of F0.0 from stage 0")) << result.message;
  EXPECT_TRUE(contains(result.message, ">>sF0.0>2<<")) << result.message;
}

// Lowered schedules: receives that disagree with their channel's send order are named.
TEST(Check, SwappedReceivesAreAMessageOrderViolation) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int trial = 0; trial < 30; ++trial) {
    Schedule s = lower_schedule(random_schedule(rng, 2));
    const int r = rng.below(s.P);
    auto& list = s.per_stage[r];
    std::vector<int> recvs;
    const int peer = r == 0 ? 1 : r - 1;  // the activation channel, or the gradient one on stage 0
    for (int i = 0; i < static_cast<int>(list.size()); ++i)
      if (list[i].op == Op::Recv && list[i].peer == peer) recvs.push_back(i);
    if (recvs.size() < 2) continue;
    const int a = rng.below(recvs.size() - 1), b = a + 1 + rng.below(recvs.size() - 1 - a);
    std::swap(list[recvs[a]], list[recvs[b]]);
    const CheckResult result = check_schedule(s);
    EXPECT_EQ(result.violation, Violation::MessageOrder) << result.message;
    EXPECT_TRUE(contains(result.message, marked(list[recvs[a]]))) << result.message;
    EXPECT_TRUE(contains(result.message, "next message from stage " + std::to_string(peer))) << result.message;
  }
}

TEST(Check, BrokenMessages) {
  const Schedule good = lower_schedule(make_schedule("stateflow", 2, 2, 2));
  // stage 1: rF0.0<0 F0.0 rF0.1<0 F0.1 B0.1 sB0.1>0 ...
  ASSERT_EQ(to_token(good.per_stage[1][0]), "rF0.0<0");
  ASSERT_EQ(to_token(good.per_stage[1][5]), "sB0.1>0");

  Schedule s = good;  // a receive dropped
  s.per_stage[1].erase(s.per_stage[1].begin());
  CheckResult r = check_schedule(s);
  EXPECT_EQ(r.violation, Violation::Missing);
  EXPECT_TRUE(contains(
      r.message, "stage 1 cannot run F0.0: it needs the output of F0.0 from stage 0, which stage 1 never receives"))
      << r.message;

  s = good;  // a receive after the action that needs it
  std::swap(s.per_stage[1][0], s.per_stage[1][1]);
  r = check_schedule(s);
  EXPECT_EQ(r.violation, Violation::Order);
  EXPECT_TRUE(contains(r.message, "receives only later (rF0.0<0)")) << r.message;

  s = good;  // a send before the action whose output it sends
  std::swap(s.per_stage[1][4], s.per_stage[1][5]);
  r = check_schedule(s);
  EXPECT_EQ(r.violation, Violation::Order);
  EXPECT_TRUE(contains(r.message, "it sends the output of B0.1, which stage 1 runs later")) << r.message;
  EXPECT_TRUE(contains(r.message, ">>sB0.1>0<<")) << r.message;

  s = good;  // a send dropped: stage 0 receives the next gradient in its place
  s.per_stage[1].erase(s.per_stage[1].begin() + 5);
  r = check_schedule(s);
  EXPECT_EQ(r.violation, Violation::MessageOrder);
  EXPECT_TRUE(contains(r.message,
                       "stage 0 cannot run rB0.1<1: the next message from stage 1 on its channel carries "
                       "the output of B0.0"))
      << r.message;

  s = good;  // the last send dropped: stage 0 waits for it after stage 1 is done
  s.per_stage[1].pop_back();
  r = check_schedule(s);
  EXPECT_EQ(r.violation, Violation::Missing);
  EXPECT_TRUE(contains(r.message, "stage 0 waits at rB1.0<1 for the output of B1.0 from stage 1, which never sends it"))
      << r.message;

  s = good;  // a send nobody receives
  s.per_stage[1].push_back(s.per_stage[1][5]);
  r = check_schedule(s);
  EXPECT_EQ(r.violation, Violation::UnreceivedMessage);
  EXPECT_TRUE(contains(r.message, "stage 1 sends the output of B0.1 to stage 0, which never receives it")) << r.message;

  s = good;  // lowered but unmarked
  s.lowered = false;
  EXPECT_EQ(check_schedule(s).violation, Violation::BadAction);
}

TEST(Check, GridRendering) {
  Grid g;
  g.cells = {{"F0.0", "", "B0.0"}, {"", "F0.0"}};
  g.marks = {{1, 2}};
  EXPECT_EQ(render_grid(g),
            "step     0     1     2\n"
            "stage 0  F0.0  .     B0.0\n"
            "stage 1  .     F0.0  >>.<<\n");
  // Wide grids show a window that ends a few columns after the last mark.
  Grid wide;
  wide.cells.assign(2, std::vector<std::string>(100, "F0.0"));
  wide.marks = {{0, 50}};
  const std::string text = render_grid(wide, 10);
  EXPECT_TRUE(contains(text, "(steps 44..53 of 0..99)")) << text;
  EXPECT_TRUE(contains(text, ">>F0.0<<")) << text;
  EXPECT_FALSE(contains(text, " 43 ")) << text;
}
