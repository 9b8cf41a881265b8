#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "pipeline/dependency.h"

using namespace stateflow;

namespace {

// Reference: the rule as a predicate "x needs y", straight from ARCHITECTURE.md.
bool needs(const Action& x, const Action& y, int P, int N) {
  const bool same_unit = x.microbatch == y.microbatch && x.chunk == y.chunk;
  const bool same_sequence = x.microbatch == y.microbatch;
  if (x.op == Op::Forward)
    return y.op == Op::Forward &&
           ((same_unit && y.stage == x.stage - 1) || (same_sequence && y.stage == x.stage && y.chunk == x.chunk - 1));
  return (y.op == Op::Backward && same_unit && y.stage == x.stage + 1) ||
         (y.op == Op::Backward && same_sequence && y.stage == x.stage && y.chunk == x.chunk + 1) ||
         (y.op == Op::Forward && same_unit && y.stage == x.stage);
}

std::vector<Action> all_compute(int P, int M, int N) {
  std::vector<Action> out;
  for (int r = 0; r < P; ++r)
    for (Op op : {Op::Forward, Op::Backward})
      for (int m = 0; m < M; ++m)
        for (int c = 0; c < N; ++c) out.push_back({.op = op, .microbatch = m, .chunk = c, .stage = r});
  return out;
}

}  // namespace

TEST(Dependency, MatchesTheRuleAsAPredicate) {
  for (int P = 1; P <= 4; ++P)
    for (int N = 1; N <= 4; ++N) {
      const int M = 2;
      const std::vector<Action> actions = all_compute(P, M, N);
      for (const Action& x : actions) {
        const Prerequisites p = prerequisites(x, P, N);
        std::vector<Action> listed(p.begin(), p.end());
        std::vector<Action> expected;
        for (const Action& y : actions)
          if (needs(x, y, P, N)) expected.push_back(y);
        EXPECT_EQ(listed.size(), expected.size()) << to_token(x) << " on stage " << x.stage;
        for (const Action& y : expected)
          EXPECT_NE(std::find(listed.begin(), listed.end(), y), listed.end())
              << to_token(x) << " on stage " << x.stage << " should need " << to_token(y) << " on stage " << y.stage;
      }
    }
}

TEST(Dependency, HandWrittenCases) {
  const int P = 3, N = 4;
  const Prerequisites f = prerequisites({.op = Op::Forward, .microbatch = 1, .chunk = 2, .stage = 1}, P, N);
  ASSERT_EQ(f.count, 2);
  EXPECT_EQ(f.items[0], (Action{.op = Op::Forward, .microbatch = 1, .chunk = 2, .stage = 0}));  // input
  EXPECT_EQ(f.items[1], (Action{.op = Op::Forward, .microbatch = 1, .chunk = 1, .stage = 1}));  // boundary state
  // The first chunk on the first stage needs nothing; the last chunk's backward on the last
  // stage needs only its own forward (the loss).
  EXPECT_EQ(prerequisites({.op = Op::Forward, .microbatch = 0, .chunk = 0, .stage = 0}, P, N).count, 0);
  const Prerequisites b = prerequisites({.op = Op::Backward, .microbatch = 0, .chunk = 3, .stage = 2}, P, N);
  ASSERT_EQ(b.count, 1);
  EXPECT_EQ(b.items[0], (Action{.op = Op::Forward, .microbatch = 0, .chunk = 3, .stage = 2}));
  EXPECT_THROW(prerequisites({.op = Op::Send, .stage = 0, .peer = 1}, P, N), Error);
}

// Messages: a forward's activation goes up one stage, a backward's gradient down one.
TEST(Dependency, ConsumerStages) {
  for (int P = 1; P <= 5; ++P)
    for (int N = 1; N <= 3; ++N) {
      const int M = 2;
      const auto consumers = consumer_stages(P, M, N);
      ASSERT_EQ(static_cast<int>(consumers.size()), 2 * P * M * N);
      for (const Action& a : all_compute(P, M, N)) {
        std::vector<int> expected;
        if (a.op == Op::Forward && a.stage < P - 1) expected = {a.stage + 1};
        if (a.op == Op::Backward && a.stage > 0) expected = {a.stage - 1};
        EXPECT_EQ(consumers[compute_index(a, M, N)], expected) << to_token(a) << " on stage " << a.stage;
      }
    }
}
