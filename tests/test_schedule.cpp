#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "golden.h"
#include "pipeline/lower.h"
#include "pipeline/schedule.h"
#include "test_util.h"

using namespace stateflow;

namespace {

std::vector<std::string> tokens(const std::vector<Action>& list) {
  std::vector<std::string> out;
  for (const Action& a : list) out.push_back(to_token(a));
  return out;
}

// Reference for one stateflow stage, written as a policy rather than as phases: run the next
// forward while the stage holds fewer units than its bound, else the next backward.
std::vector<Action> greedy_stateflow_stage(int r, int P, int M, int N) {
  const int units = M * N, bound = std::min(units, N + P - 1 - r);
  std::vector<Action> out;
  int forwards = 0, backwards = 0;
  while (backwards < units) {
    if (forwards < units && forwards - backwards < bound) {
      out.push_back({.op = Op::Forward, .microbatch = forwards / N, .chunk = forwards % N, .stage = r});
      ++forwards;
    } else {
      out.push_back({.op = Op::Backward, .microbatch = backwards / N, .chunk = N - 1 - backwards % N, .stage = r});
      ++backwards;
    }
  }
  return out;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(Schedule, StateflowMatchesHandWritten) {
  const Schedule s = make_schedule("stateflow", 2, 2, 2);
  using V = std::vector<std::string>;
  // Stage 0 holds N+P-1 = 3 units before its first backward, stage 1 holds 2.
  EXPECT_EQ(tokens(s.per_stage[0]), (V{"F0.0", "F0.1", "F1.0", "B0.1", "F1.1", "B0.0", "B1.1", "B1.0"}));
  EXPECT_EQ(tokens(s.per_stage[1]), (V{"F0.0", "F0.1", "B0.1", "F1.0", "B0.0", "F1.1", "B1.1", "B1.0"}));
  for (int r = 0; r < 2; ++r)
    for (const Action& a : s.per_stage[r]) EXPECT_EQ(a.stage, r);
}

TEST(Schedule, GpipeMatchesHandWritten) {
  const Schedule s = make_schedule("gpipe", 2, 2, 2);
  using V = std::vector<std::string>;
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(tokens(s.per_stage[r]), (V{"F0.0", "F0.1", "F1.0", "F1.1", "B1.1", "B1.0", "B0.1", "B0.0"}));
}

TEST(Schedule, StateflowMatchesGreedyReference) {
  for (int P = 1; P <= 8; ++P)
    for (int M = 1; M <= 8; ++M)
      for (int N = 1; N <= 16; ++N) {
        const Schedule s = make_schedule(ScheduleKind::StateFlow, P, M, N);
        ASSERT_EQ(static_cast<int>(s.per_stage.size()), P);
        for (int r = 0; r < P; ++r)
          ASSERT_EQ(s.per_stage[r], greedy_stateflow_stage(r, P, M, N))
              << "P=" << P << " M=" << M << " N=" << N << " r=" << r;
      }
}

TEST(Schedule, OneFOneBIsStateflowWithOneChunk) {
  for (int P = 1; P <= 8; ++P)
    for (int M = 1; M <= 8; ++M) {
      const Schedule a = make_schedule("1f1b", P, M, 1), b = make_schedule("stateflow", P, M, 1);
      EXPECT_EQ(a.kind, ScheduleKind::OneFOneB);
      EXPECT_EQ(a.per_stage, b.per_stage) << "P=" << P << " M=" << M;
    }
}

TEST(Schedule, RejectsBadArguments) {
  EXPECT_NE(error_of([] { make_schedule("zb", 2, 2, 2); }).find("expected one of gpipe, 1f1b, stateflow"),
            std::string::npos);
  EXPECT_NE(error_of([] { make_schedule("1f1b", 2, 2, 4); }).find("N must be 1 (got N=4)"), std::string::npos);
  EXPECT_NE(error_of([] { make_schedule("stateflow", 0, 2, 2); }).find("P=0"), std::string::npos);
  EXPECT_NE(error_of([] { make_schedule("gpipe", 2, 0, 2); }).find("M=0"), std::string::npos);
  EXPECT_NE(error_of([] { make_schedule("stateflow", 2, 2, -1); }).find("N=-1"), std::string::npos);
}

TEST(Schedule, InFlightBound) {
  EXPECT_EQ(in_flight_bound(ScheduleKind::GPipe, 4, 3, 5, 0), 15);
  EXPECT_EQ(in_flight_bound(ScheduleKind::StateFlow, 4, 3, 5, 0), 8);  // N + P - 1
  EXPECT_EQ(in_flight_bound(ScheduleKind::StateFlow, 4, 3, 5, 3), 5);  // the last stage holds one sequence
  EXPECT_EQ(in_flight_bound(ScheduleKind::StateFlow, 8, 1, 2, 0), 2);  // capped by the M*N units
  EXPECT_EQ(in_flight_bound(ScheduleKind::OneFOneB, 4, 8, 1, 1), 3);   // P - r
}

TEST(Schedule, ComputeIndexIsDense) {
  const int P = 3, M = 4, N = 5;
  std::set<int> seen;
  for (int r = 0; r < P; ++r)
    for (Op op : {Op::Forward, Op::Backward})
      for (int m = 0; m < M; ++m)
        for (int c = 0; c < N; ++c) {
          const int i = compute_index({.op = op, .microbatch = m, .chunk = c, .stage = r}, M, N);
          EXPECT_GE(i, 0);
          EXPECT_LT(i, 2 * P * M * N);
          seen.insert(i);
        }
  EXPECT_EQ(static_cast<int>(seen.size()), 2 * P * M * N);
}

TEST(Schedule, TokensAndCarriedAction) {
  const Action f{.op = Op::Forward, .microbatch = 3, .chunk = 2, .stage = 1};
  const Action send{.op = Op::Send, .microbatch = 3, .chunk = 2, .stage = 1, .peer = 2, .payload = Payload::Activation};
  const Action recv{.op = Op::Recv, .microbatch = 3, .chunk = 2, .stage = 2, .peer = 1, .payload = Payload::Activation};
  const Action grad{.op = Op::Recv, .microbatch = 0, .chunk = 11, .stage = 0, .peer = 1, .payload = Payload::Gradient};
  EXPECT_EQ(to_token(f), "F3.2");
  EXPECT_EQ(to_token({.op = Op::Backward, .microbatch = 10, .chunk = 0}), "B10.0");
  EXPECT_EQ(to_token(send), "sF3.2>2");
  EXPECT_EQ(to_token(recv), "rF3.2<1");
  EXPECT_EQ(to_token(grad), "rB0.11<1");
  EXPECT_EQ(carried_action(send), f);
  EXPECT_EQ(carried_action(recv), f);
  const Action b{.op = Op::Backward, .microbatch = 0, .chunk = 11, .stage = 1};
  EXPECT_EQ(carried_action(grad), b);
  EXPECT_EQ(send_of(f, 2), send);
  EXPECT_EQ(recv_of(f, 2), recv);
  EXPECT_EQ(recv_of(b, 0), grad);
  EXPECT_EQ(to_token(send_of(b, 0)), "sB0.11>0");
}

TEST(Schedule, TextRoundTripsRandomSchedules) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int trial = 0; trial < 40; ++trial) {
    const int P = 1 + rng.below(8), M = 1 + rng.below(8), N = 1 + rng.below(16);
    const ScheduleKind kind = N == 1 && rng.below(2) ? ScheduleKind::OneFOneB
                                                     : (rng.below(2) ? ScheduleKind::StateFlow : ScheduleKind::GPipe);
    const Schedule s = make_schedule(kind, P, M, N);
    EXPECT_EQ(parse_schedule_text(to_text(s)), s) << to_text(s);
    const Schedule lowered = lower_schedule(s);
    EXPECT_EQ(parse_schedule_text(to_text(lowered)), lowered) << to_text(lowered);
  }
}

TEST(Schedule, ParseAcceptsCommentsAndSpacing) {
  const Schedule s = parse_schedule_text(
      "# a comment\n\n  schedule gpipe P=2 M=1 N=1\r\nstage 0:\tF0.0  B0.0\n# between\nstage 1: F0.0 B0.0");
  EXPECT_EQ(s, make_schedule("gpipe", 2, 1, 1));
}

TEST(Schedule, ParseErrorsNameLineColumnToken) {
  const std::string header = "schedule stateflow P=2 M=2 N=2\n";
  struct Case {
    std::string text;
    std::vector<std::string> expected;  // substrings of the message
  };
  const std::vector<Case> cases = {
      {header + "stage 0: F0.0 X0.1\n", {"line 2", "column 15", "'X0.1'", "expected Fm.c"}},
      {header + "stage 0: F0.0 F0.\n", {"line 2", "column 15", "'F0.'"}},
      {header + "stage 0: F2.0\n", {"line 2", "column 10", "'F2.0'", "microbatch 2 is out of range (M=2)"}},
      {header + "stage 0: B0.5\n", {"'B0.5'", "chunk 5 is out of range (N=2)"}},
      {header + "stage 0: sF0.0>1\n", {"'sF0.0>1'", "add 'lowered'"}},
      {header + "stage 1: F0.0\n", {"line 2", "expected 'stage 0:'"}},
      {header + "stage 0: F0.0\n", {"expected 2 stage lines", "found 1"}},
      {header + "stage 0:\nstage 1:\nstage 2:\n", {"line 4", "more stage lines than P=2"}},
      {"schedule stateflow P=2 M=2 N=2 lowered\nstage 0: sF0.0>0\n", {"'sF0.0>0'", "peer stage 0"}},
      {"schedule stateflow P=2 M=2 N=2 lowered\nstage 0: sF0.0<1\n", {"'sF0.0<1'", "expected"}},
      {"schedule zb P=2 M=2 N=2\n", {"line 1", "column 10", "'zb'", "gpipe, 1f1b, stateflow"}},
      {"schedule stateflow P=x M=2 N=2\n", {"line 1", "'P=x'", "expected P=<number>"}},
      {"schedule stateflow P=0 M=2 N=2\n", {"line 1", "P >= 1"}},
      {"stage 0: F0.0\n", {"line 1", "expected the header"}},
      {"", {"no header line"}},
  };
  for (const Case& c : cases) {
    const std::string message = error_of([&] { parse_schedule_text(c.text); });
    for (const std::string& part : c.expected)
      EXPECT_NE(message.find(part), std::string::npos) << "text:\n"
                                                       << c.text << "message: " << message << "\nmissing: " << part;
  }
}

TEST(Schedule, GoldenFiles) {
  for (auto [kind, P, M, N] : std::vector<std::tuple<std::string, int, int, int>>{
           {"stateflow", 2, 2, 2}, {"1f1b", 3, 4, 1}, {"gpipe", 2, 2, 1}}) {
    const Schedule s = make_schedule(kind, P, M, N);
    const std::string name = cat(kind, "_P", P, "_M", M, "_N", N, ".txt");
    SCOPED_TRACE(name);
    stateflow::testing::expect_matches_golden(name, to_text(s));
    std::ifstream in(stateflow::testing::golden_path(name));
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_EQ(parse_schedule_text(text.str()), s);
  }
}
