// The Mamba-3 per-token GPU operations are ops (mixers/mamba3/mamba3_ops_op.cpp): each pass
// against its float64 reference, parameter gradients added to a non-zero start, is
// tests/cuda/test_op_defs_cuda.cpp's. Here what a relative error cannot say: the cumulative
// angle wraps into [-pi, pi] as the CPU op does, compared modulo 2 pi (an angle next to +-pi
// may land on the other side). Skips when no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "cuda_test_util.h"
#include "kernels/cuda/op_buffers.h"
#include "kernels/op_def.h"
#include "test_util.h"

namespace stateflow {
namespace {

using namespace stateflow::testing;

constexpr double kPi = 3.14159265358979323846;  // (CUDA C++17: no <numbers>)

TEST(Mamba3OpsCuda, AnglesWrapModuloTwoPiAsTheCpuOpDoes) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const OpDef& op = op_named("mamba3_angles");
  const OpShape& shape = op.test_shapes.front();
  OpHost host = draw_inputs(op, shape, DType::BF16, seed);
  // The op's steps and start keep the angles inside (-pi, pi); these wrap them often.
  for (double& dt : host.at("dt")) dt = round_to_storage(100 * dt, DType::F32);  // in [0.1, 2)
  for (double& phi : host.at("phi_in")) phi = round_to_storage(6 * phi, DType::F32);
  OpBuffers dev(op, shape, DType::BF16);
  dev.upload(host);
  dev.poison_outputs();
  dev.run(op.pass("fwd"));
  op.pass("fwd").reference(shape, DType::BF16, host);
  sync_ok();
  const OpHost got = dev.download();
  for (const char* name : {"phi", "phi_out"}) {
    const Vec &g = got.at(name), &ref = host.at(name);
    EXPECT_FALSE(has_nan(g)) << name;
    double worst = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      worst = std::max(worst, std::abs(std::remainder(g[i] - ref[i], 2 * kPi)));
      ASSERT_LE(std::abs(g[i]), kPi + 1e-6) << name << "[" << i << "] not reduced";
    }
    std::printf("  %-8s abs err mod 2pi %.3e\n", name, worst);
    EXPECT_LE(worst, 1e-4) << name;
  }
}

}  // namespace
}  // namespace stateflow
