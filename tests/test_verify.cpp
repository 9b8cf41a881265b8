// `stateflow verify` on the tiny preset meets the bounds in both precisions.
#include <gtest/gtest.h>

#include <sstream>

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
