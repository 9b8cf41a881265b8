// `stateflow verify` on the tiny preset meets the bounds in both precisions.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "test_util.h"
#include "train/verify.h"

using namespace stateflow;

TEST(Verify, TinyPresetF64WithinOneE10) {
  VerifyOptions o;
  o.dtype = DType::F64;
  VerifyResult r = run_verify(o);
  EXPECT_GE(r.columns.size(), 6u);
  EXPECT_LE(r.max_rel_grad_diff, 1e-10);
  EXPECT_TRUE(r.passed());
  std::ostringstream os;
  print_verify(r, os);
  EXPECT_NE(os.str().find("max_rel_grad_diff="), std::string::npos);
}

TEST(Verify, TinyPresetF32WithinOneE4) {
  VerifyOptions o;
  o.dtype = DType::F32;
  VerifyResult r = run_verify(o);
  EXPECT_LE(r.max_rel_grad_diff, 1e-4);
  EXPECT_GT(r.max_rel_grad_diff, 0.0) << "f32 chunking reassociates sums: an exact 0 means nothing was compared";
}

TEST(Verify, FailsWhenToleranceIsImpossible) {
  VerifyOptions o;
  o.dtype = DType::F32;
  o.tolerance = 1e-30;
  o.chunkings = {{20, 25}};
  EXPECT_FALSE(run_verify(o).passed());
}

// What --device cuda does (there bf16 rounding differs from chunking to chunking), on the CPU
// in f32: every chunking's error against the float64 CPU run of the same weights is held to
// twice the unsplit run's, and both errors are reported.
TEST(Verify, AgainstFloat64EachChunkingStaysWithinTwiceTheUnsplitError) {
  VerifyOptions o;
  o.dtype = DType::F32;
  o.against_f64 = true;
  o.chunkings = {{20, 25}, {9, 1, 35}};
  const VerifyResult r = run_verify(o);
  ASSERT_EQ(r.columns.size(), 2u);
  EXPECT_GT(r.unsplit.mean_grad_diff, 0.0) << "f32 against f64: an exact 0 means nothing was compared";
  EXPECT_LT(r.unsplit.mean_grad_diff, 1e-4);
  for (const VerifyColumn& c : r.columns) {
    EXPECT_LE(c.mean_grad_diff, 2 * r.unsplit.mean_grad_diff) << c.label;
    EXPECT_TRUE(c.passed) << c.label;
  }
  std::ostringstream os;
  print_verify(r, os);
  EXPECT_NE(os.str().find("errors against the float64 CPU run"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("the unsplit run's: loss"), std::string::npos) << os.str();
  EXPECT_NE(os.str().find("  [u] unsplit: 45"), std::string::npos) << os.str();
}

TEST(Verify, BadTolerancesAreRefusedNotReplacedByTheDefault) {
  for (double t : {-1.0, std::nan(""), double(INFINITY)}) {
    VerifyOptions o;
    o.tolerance = t;
    stateflow::testing::expect_error([&] { run_verify(o); }, "--tolerance must be a positive, finite relative difference");
  }
  VerifyOptions o;
  o.against_f64 = true;
  o.tolerance = 1e-3;
  stateflow::testing::expect_error([&] { run_verify(o); }, "leave --tolerance out");
}
