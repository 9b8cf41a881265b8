// AdamW on the GPU against model/optimizer's AdamW on float parameters: several steps with
// fresh gradients, a decayed matrix and an undecayed vector; p, m and v must be bitwise equal
// to the CPU's after every step, and the bf16 copy the rounding of p.
#include <gtest/gtest.h>

#include "kernels/cuda/adamw_cuda.h"
#include "model/optimizer.h"
#include "cuda_test_util.h"
#include "test_util.h"

namespace stateflow {
namespace {

using namespace testing;

std::vector<float> values(const Tensor& t) { return std::vector<float>(t.data<float>(), t.data<float>() + t.numel()); }

TEST(AdamWCuda, BitwiseEqualToTheCpuOptimizer) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  Param mat = make_param("w", {33, 17}, DType::F32), vec = make_param("b", {41}, DType::F32);
  for (Param* p : {&mat, &vec})
    for (int64_t i = 0; i < p->value.numel(); ++i) p->value.data<float>()[i] = float(rng.normal());
  AdamWConfig cfg;
  cfg.weight_decay = 0.1, cfg.beta2 = 0.99;
  AdamW cpu({&mat, &vec}, cfg);
  struct DevParam {
    Param* p;
    Dev<float> value, grad, m, v;
    Dev<bf16> copy;
  };
  std::vector<DevParam> dev;
  for (Param* p : {&mat, &vec}) {
    const size_t n = size_t(p->value.numel());
    dev.push_back({p, Dev<float>(n), Dev<float>(n), Dev<float>(Vec(n, 0.0)), Dev<float>(Vec(n, 0.0)), Dev<bf16>(n)});
    dev.back().value.put(values(p->value));
  }
  for (int step = 1; step <= 4; ++step) {
    const double lr = 1e-2 / step;
    for (DevParam& d : dev) {
      for (int64_t i = 0; i < d.p->grad.numel(); ++i) d.p->grad.data<float>()[i] = float(0.1 * rng.normal());
      d.grad.put(values(d.p->grad));
      d.copy.poison();
      const double decay = takes_weight_decay(*d.p) ? cfg.weight_decay : 0.0;
      adamw_update_cuda(d.value.p, d.grad.p, d.m.p, d.v.p, d.p->value.numel(), lr, decay, cfg, step, d.copy.p, nullptr);
    }
    cpu.step(lr);
    sync_ok();
    for (size_t i = 0; i < dev.size(); ++i) {
      const DevParam& d = dev[i];
      SCOPED_TRACE(d.p->name + " step " + std::to_string(step));
      EXPECT_TRUE(bitwise_equal(d.value.raw(), values(d.p->value))) << "p";
      EXPECT_TRUE(bitwise_equal(d.m.raw(), values(cpu.exp_avg(i)))) << "m";
      EXPECT_TRUE(bitwise_equal(d.v.raw(), values(cpu.exp_avg_sq(i)))) << "v";
      std::vector<bf16> rounded_p;
      for (float x : values(d.p->value)) rounded_p.push_back(__float2bfloat16(x));
      EXPECT_TRUE(bitwise_equal(d.copy.raw(), rounded_p)) << "bf16 copy";
    }
  }
}

// A bf16 copy that is a column block of a wider matrix (model/param.h's shared copies): the same
// bits in its columns, the other columns left alone.
TEST(AdamWCuda, ABf16CopyInColumnsOfAWiderMatrixGetsTheSameBits) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t rows = 33, cols = 17, ld = 40, at = 8, n = rows * cols;
  const Vec p = normal_vec(rng, size_t(n)), g = normal_vec(rng, size_t(n), 0.1);
  const Vec zeros(size_t(n), 0.0);
  Dev<float> p1(p), p2(p), g1(g), m1(zeros), v1(zeros), m2(zeros), v2(zeros);
  Dev<bf16> own(static_cast<size_t>(n)), wide(static_cast<size_t>(rows * ld));
  own.poison(), wide.poison();
  const AdamWConfig cfg{};
  adamw_update_cuda(p1.p, g1.p, m1.p, v1.p, n, 1e-2, 0.1, cfg, 1, own.p, nullptr);
  adamw_update_cuda(p2.p, g1.p, m2.p, v2.p, n, 1e-2, 0.1, cfg, 1, wide.p + at, nullptr, cols, ld);
  sync_ok();
  const std::vector<bf16> o = own.raw(), w = wide.raw();
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(bitwise_equal(std::vector<bf16>(w.begin() + r * ld + at, w.begin() + r * ld + at + cols),
                              std::vector<bf16>(o.begin() + r * cols, o.begin() + (r + 1) * cols)))
        << "row " << r;
    EXPECT_TRUE(std::isnan(float(w[size_t(r * ld)])) && std::isnan(float(w[size_t(r * ld + at + cols)]))) << "row " << r;
  }
}

TEST(AdamWCudaChecks, RejectsBadSettings) {
  AdamWConfig cfg;
  expect_error([&] { adamw_update_cuda(nullptr, nullptr, nullptr, nullptr, 4, -1.0, 0.0, cfg, 1, nullptr, nullptr); },
               "learning rate");
  expect_error([&] { adamw_update_cuda(nullptr, nullptr, nullptr, nullptr, 4, 1e-3, 0.0, cfg, 0, nullptr, nullptr); },
               "step");
}

}  // namespace
}  // namespace stateflow
