// Cutting a batch into pipeline units: unit (m, c) holds tokens [offset_c, offset_c + len_c)
// of sequences [m*b, (m+1)*b), every token of the batch lands in exactly one unit, the loss
// scale is one over the batch's answer tokens, and bad shapes are refused with the fix.
#include <gtest/gtest.h>

#include "test_util.h"
#include "pipeline/units.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

// Token t of sequence s is s * 1000 + t; targets are -1 (no loss) on odd tokens.
Batch numbered_batch(int64_t batch, int64_t seq_len) {
  Batch b;
  b.batch = batch, b.seq_len = seq_len;
  for (int64_t s = 0; s < batch; ++s)
    for (int64_t t = 0; t < seq_len; ++t) {
      b.tokens.push_back(int32_t(s * 1000 + t));
      b.targets.push_back(t % 2 ? -1 : int32_t(s * 1000 + t + 1));
    }
  return b;
}

}  // namespace

TEST(Units, EachUnitHoldsItsSequencesAndTokensAndTogetherTheyCoverTheBatchOnce) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int M = 1 + int(rng.below(3));
  const int64_t batch = M * (1 + int64_t(rng.below(3))), T = 7 + int64_t(rng.below(20));
  const std::vector<int64_t> lengths = {1, T - 4, 3};  // uneven, with a one-token chunk
  const Batch b = numbered_batch(batch, T);
  LossStats stats;
  UnitPlan plan(b, M, lengths);
  EXPECT_EQ(plan.microbatches(), M);
  EXPECT_EQ(plan.chunks(), 3);
  std::vector<int> seen(size_t(batch * T), 0);
  const int64_t per = batch / M;
  for (int m = 0; m < M; ++m) {
    int64_t offset = 0;
    for (int c = 0; c < 3; ++c) {
      const Unit u = plan.make_unit(m, c, &stats);
      EXPECT_EQ(u.ctx.microbatch, m);
      EXPECT_EQ(u.ctx.chunk, c);
      EXPECT_EQ(u.ctx.num_chunks, 3);
      EXPECT_EQ(u.ctx.offset, offset);
      EXPECT_EQ(u.ctx.len, lengths[size_t(c)]);
      EXPECT_EQ(u.ctx.batch, per);
      EXPECT_EQ(u.ctx.stats, &stats);
      EXPECT_EQ(u.ctx.loss_scale, plan.loss_scale());
      ASSERT_EQ(u.tokens.numel(), per * u.ctx.len);
      for (int64_t s = 0; s < per; ++s)
        for (int64_t t = 0; t < u.ctx.len; ++t) {
          const int64_t seq = m * per + s, pos = offset + t, i = s * u.ctx.len + t;
          EXPECT_EQ(u.tokens.data<int32_t>()[i], int32_t(seq * 1000 + pos));
          EXPECT_EQ(u.ctx.targets.data<int32_t>()[i], b.targets[size_t(seq * T + pos)]);
          ++seen[size_t(seq * T + pos)];
        }
      offset += u.ctx.len;
    }
  }
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "token " << i;
}

TEST(Units, LossScaleIsOneOverTheAnswerTokensOfTheWholeBatch) {
  const Batch b = numbered_batch(4, 9);  // 5 answer tokens (even positions) per sequence
  EXPECT_DOUBLE_EQ(UnitPlan(b, 2, {4, 5}).loss_scale(), 1.0 / 20);
  Batch none = b;
  for (int32_t& t : none.targets) t = -1;
  EXPECT_EQ(UnitPlan(none, 1, {9}).loss_scale(), 0.0);  // no answers: no loss, not a division by zero
}

TEST(Units, BadShapesAreRefusedWithTheFix) {
  const Batch b = numbered_batch(4, 10);
  expect_error([&] { UnitPlan(b, 3, {10}); }, "use a --microbatches that divides --batch");
  expect_error([&] { UnitPlan(b, 0, {10}); }, "microbatches");
  expect_error([&] { UnitPlan(b, 2, {4, 5}); }, "10");  // lengths must sum to seq_len
  expect_error([&] { UnitPlan(b, 2, {10, 0}); }, "chunk");
}
