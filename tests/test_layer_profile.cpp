// LayerProfile's named parts (core/op_scope.h) with a clock whose marks are 1 ms apart: each
// part's device time, nested parts, the "(rest)" outside the outermost parts, and the thread's
// timer set only while a layer call runs (also when it throws).
#include <gtest/gtest.h>

#include <stdexcept>

#include "core/op_scope.h"
#include "pipeline/layer_profile.h"

namespace stateflow {
namespace {

class MillisecondMarks final : public DeviceClock {
 public:
  int mark() override { return marks_++; }
  double seconds_between(int from, int to) override { return (to - from) * 1e-3; }
  void clear() override { marks_ = 0; }
  void hold() override {}
  void release() override {}
  bool hold_timed_out() override { return false; }

 private:
  int marks_ = 0;
};

const OpTiming* find(const LayerProfile& p, const std::string& name) {
  for (const OpTiming& t : p.op_timings())
    if (t.name == name) return &t;
  return nullptr;
}

TEST(LayerProfile, TimesNamedPartsNestedAndTheRest) {
  LayerProfile profile(std::make_unique<MillisecondMarks>());
  EXPECT_EQ(thread_op_timer(), nullptr);
  auto layer = [] {  // marks: layer start 0, a 1, b 2-3, a 4, a 5-6, layer end 7
    {
      OpScope a("mlp.a");
      OpScope b("mlp.b");
    }
    OpScope again("mlp.a");
  };
  profile.time(3, "mlp", Pass::Forward, layer);
  profile.time(3, "mlp", Pass::Forward, layer);
  EXPECT_EQ(thread_op_timer(), nullptr);
  const OpTiming *a = find(profile, "mlp.a"), *b = find(profile, "mlp.b"), *rest = find(profile, "mlp.(rest)");
  ASSERT_TRUE(a && b && rest);
  EXPECT_EQ(a->calls, 4);
  EXPECT_NEAR(a->device_s, 2 * 4e-3, 1e-12);  // (4 - 1) + (6 - 5) ms per layer call
  EXPECT_EQ(b->calls, 2);
  EXPECT_NEAR(b->device_s, 2 * 1e-3, 1e-12);  // inside a: counted in a too, not twice in the rest
  EXPECT_NEAR(rest->device_s, 2 * 3e-3, 1e-12);
  EXPECT_EQ(rest->boundaries, 2 * 3);  // before, between and after the two outermost parts
  EXPECT_EQ(a->boundaries, 0);
  ASSERT_EQ(profile.timings().size(), 1u);
  EXPECT_NEAR(profile.timings()[0].device_s, 2 * 7e-3, 1e-12);
  EXPECT_NEAR(profile.last_device_s(), 7e-3, 1e-12);  // the last call alone
}

TEST(LayerProfile, ALayerThatThrowsLeavesNoTimerBehind) {
  LayerProfile profile(std::make_unique<MillisecondMarks>());
  EXPECT_THROW(profile.time(0, "gdn", Pass::Backward, [] { throw std::runtime_error("boom"); }),
               std::runtime_error);
  EXPECT_EQ(thread_op_timer(), nullptr);
  OpScope outside("gdn.core");  // no profile on: nothing recorded, nothing to end
  EXPECT_TRUE(profile.op_timings().empty());
}

TEST(LayerProfile, OnTheCpuPartsAreNotTimed) {
  LayerProfile profile(Device::CPU);
  profile.time(0, "gdn", Pass::Forward, [] {
    EXPECT_EQ(thread_op_timer(), nullptr);
    OpScope part("gdn.core");
  });
  EXPECT_TRUE(profile.op_timings().empty());
  ASSERT_EQ(profile.timings().size(), 1u);
}

}  // namespace
}  // namespace stateflow
