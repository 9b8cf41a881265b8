#include <gtest/gtest.h>

#include <map>
#include <tuple>

#include "core/error.h"
#include "golden.h"
#include "pipeline/check.h"
#include "pipeline/lower.h"
#include "test_util.h"

using namespace stateflow;

namespace {

std::string joined(const std::vector<Action>& list) {
  std::string out;
  for (const Action& a : list) out.append(out.empty() ? "" : " ").append(to_token(a));
  return out;
}

}  // namespace

TEST(Lower, MatchesHandWrittenAndGolden) {
  const Schedule s = lower_schedule(make_schedule("stateflow", 2, 2, 2));
  EXPECT_TRUE(s.lowered);
  EXPECT_EQ(joined(s.per_stage[0]),
            "F0.0 sF0.0>1 F0.1 sF0.1>1 F1.0 sF1.0>1 rB0.1<1 B0.1 F1.1 sF1.1>1 rB0.0<1 B0.0 rB1.1<1 B1.1 rB1.0<1 B1.0");
  EXPECT_EQ(joined(s.per_stage[1]),
            "rF0.0<0 F0.0 rF0.1<0 F0.1 B0.1 sB0.1>0 rF1.0<0 F1.0 B0.0 sB0.0>0 rF1.1<0 F1.1 B1.1 sB1.1>0 B1.0 sB1.0>0");
  stateflow::testing::expect_matches_golden("stateflow_P2_M2_N2_lowered.txt", to_text(s));
  stateflow::testing::expect_matches_golden("1f1b_P3_M4_N1_lowered.txt",
                                            to_text(lower_schedule(make_schedule("1f1b", 3, 4, 1))));
}

// Checks the lowering against the rule as the brief states it: after F on r < P-1 a send of
// the activation to r+1, after B on r > 0 a send of the gradient to r-1, a receive before F
// on r > 0 and before B on r < P-1, and each channel received in the order it was sent.
TEST(Lower, PropertiesOnRandomSchedules) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int trial = 0; trial < 60; ++trial) {
    const int P = 1 + rng.below(8), M = 1 + rng.below(8), N = 1 + rng.below(16);
    const Schedule raw = make_schedule(rng.below(2) ? ScheduleKind::StateFlow : ScheduleKind::GPipe, P, M, N);
    const Schedule s = lower_schedule(raw);
    SCOPED_TRACE(to_text(raw));
    std::map<std::tuple<int, int, Payload>, std::vector<Action>> sent, received;  // (from, to, payload)
    int sends = 0, recvs = 0;
    for (int r = 0; r < P; ++r) {
      const std::vector<Action>& list = s.per_stage[r];
      std::vector<Action> compute;
      for (size_t i = 0; i < list.size(); ++i) {
        const Action& a = list[i];
        EXPECT_EQ(a.stage, r);
        if (is_compute(a)) {
          compute.push_back(a);
          const bool sends_on = a.op == Op::Forward ? r < P - 1 : r > 0;
          if (sends_on) {
            const int peer = a.op == Op::Forward ? r + 1 : r - 1;
            ASSERT_LT(i + 1, list.size());
            EXPECT_EQ(list[i + 1], send_of(a, peer)) << "after " << to_token(a) << " on stage " << r;
          }
          const bool receives_on = a.op == Op::Forward ? r > 0 : r < P - 1;
          if (receives_on) {
            const int peer = a.op == Op::Forward ? r - 1 : r + 1;
            const Action recv = recv_of({.op = a.op, .microbatch = a.microbatch, .chunk = a.chunk, .stage = peer}, r);
            EXPECT_EQ(std::count(list.begin(), list.begin() + i, recv), 1)
                << to_token(recv) << " before " << to_token(a);
          }
        } else if (a.op == Op::Send) {
          ++sends;
          ASSERT_GT(i, 0u);
          EXPECT_EQ(carried_action(a), list[i - 1]);
          sent[{r, a.peer, a.payload}].push_back(carried_action(a));
        } else {
          ++recvs;
          received[{a.peer, r, a.payload}].push_back(carried_action(a));
        }
      }
      EXPECT_EQ(compute, raw.per_stage[r]);
    }
    EXPECT_EQ(sends, 2 * (P - 1) * M * N);
    EXPECT_EQ(recvs, sends);
    EXPECT_EQ(received, sent);
    const CheckResult check = check_schedule(s);
    EXPECT_TRUE(check.ok) << check.message;
  }
}

// Stage 1 sends gradients B1.0 then B0.0, but stage 0 needs B0.0 first: it receives both
// (in send order) before B0.0, and B1.0 then finds its gradient already received.
TEST(Lower, ReceivesFollowTheSendersOrder) {
  const Schedule raw = parse_schedule_text(
      "schedule gpipe P=2 M=2 N=1\n"
      "stage 0: F0.0 F1.0 B0.0 B1.0\n"
      "stage 1: F0.0 F1.0 B1.0 B0.0\n");
  ASSERT_TRUE(check_schedule(raw).ok);
  const Schedule s = lower_schedule(raw);
  EXPECT_EQ(joined(s.per_stage[0]), "F0.0 sF0.0>1 F1.0 sF1.0>1 rB1.0<1 rB0.0<1 B0.0 B1.0");
  EXPECT_EQ(joined(s.per_stage[1]), "rF0.0<0 F0.0 rF1.0<0 F1.0 B1.0 sB1.0>0 B0.0 sB0.0>0");
  const CheckResult check = check_schedule(s);
  EXPECT_TRUE(check.ok) << check.message;
}

TEST(Lower, OneStageHasNoMessages) {
  const Schedule raw = make_schedule("stateflow", 1, 3, 4);
  const Schedule s = lower_schedule(raw);
  EXPECT_TRUE(s.lowered);
  EXPECT_EQ(s.per_stage, raw.per_stage);
}

TEST(Lower, Rejects) {
  const Schedule s = make_schedule("stateflow", 2, 2, 2);
  EXPECT_THROW(lower_schedule(lower_schedule(s)), Error);
  Schedule bad = s;
  bad.per_stage[1][0].microbatch = 5;
  EXPECT_THROW(lower_schedule(bad), Error);
  bad = s;
  bad.per_stage[0].erase(bad.per_stage[0].begin() + 2);  // stage 0 never runs F1.0
  try {
    lower_schedule(bad);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs F1.0 from stage 0, but stage 0 never runs it"), std::string::npos)
        << e.what();
  }
}
