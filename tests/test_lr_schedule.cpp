// The learning-rate schedule at its key points, against the formulas written out.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/rng.h"
#include "test_util.h"
#include "train/lr_schedule.h"

using namespace stateflow;
using stateflow::testing::expect_error;
using stateflow::testing::fresh_seed;

TEST(LrSchedule, ValuesAtKeyPoints) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  const double peak = 1e-3 * (1 + rng.uniform()), min = peak * 0.1 * rng.uniform();
  const int64_t warmup = 2 + static_cast<int64_t>(rng.below(50));
  const int64_t total = warmup + 2 * (1 + static_cast<int64_t>(rng.below(200)));  // even decay length
  LrSchedule s{peak, min, warmup, total};
  EXPECT_DOUBLE_EQ(s.at(0), peak / warmup);
  EXPECT_DOUBLE_EQ(s.at(warmup / 2), peak * (warmup / 2 + 1) / warmup);
  EXPECT_DOUBLE_EQ(s.at(warmup - 1), peak);
  EXPECT_DOUBLE_EQ(s.at(warmup), peak);
  EXPECT_NEAR(s.at((warmup + total) / 2), (peak + min) / 2, 1e-15);
  const int64_t q = warmup + (total - warmup) / 4;  // a quarter into the decay
  double progress = double(q - warmup) / double(total - warmup);
  EXPECT_NEAR(s.at(q), min + (peak - min) * 0.5 * (1 + std::cos(std::numbers::pi * progress)), 1e-15);
  EXPECT_NEAR(s.at(total), min, 1e-18);
  EXPECT_EQ(s.at(total + 1), min);
  EXPECT_EQ(s.at(total * 10), min);
  for (int64_t t = 1; t <= total; ++t) {
    if (t < warmup) {
      EXPECT_GT(s.at(t), s.at(t - 1)) << "step " << t;
    } else if (t > warmup) {
      EXPECT_LT(s.at(t), s.at(t - 1)) << "step " << t;
    }
  }
}

TEST(LrSchedule, NoWarmupAndConstant) {
  EXPECT_EQ((LrSchedule{2e-3, 1e-4, 0, 100}.at(0)), 2e-3);
  LrSchedule constant{5e-4, 5e-4, 0, 10};
  for (int64_t t : {0, 3, 10, 99}) EXPECT_DOUBLE_EQ(constant.at(t), 5e-4);
  EXPECT_EQ((LrSchedule{1e-3, 0, 10, 10}.at(9)), 1e-3);  // warmup == total: straight to min after warmup
  EXPECT_EQ((LrSchedule{1e-3, 0, 10, 10}.at(10)), 0.0);
}

TEST(LrSchedule, ValidationNamesTheField) {
  expect_error([] { LrSchedule{0, 0, 0, 10}.at(0); }, "peak");
  expect_error([] { LrSchedule{NAN, 0, 0, 10}.at(0); }, "peak");
  expect_error([] { LrSchedule{1e-3, 2e-3, 0, 10}.at(0); }, "min");
  expect_error([] { LrSchedule{1e-3, -1, 0, 10}.at(0); }, "min");
  expect_error([] { LrSchedule{1e-3, 0, -1, 10}.at(0); }, "warmup");
  expect_error([] { LrSchedule{1e-3, 0, 20, 10}.at(0); }, "total");
  expect_error([] { LrSchedule{1e-3, 0, 0, 10}.at(-1); }, "step");
}
