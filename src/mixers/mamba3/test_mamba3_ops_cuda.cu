// The Mamba-3 per-token GPU operations are ops (mixers/mamba3/mamba3_ops_op.cpp): each pass
// against its float64 reference, parameter gradients added to a non-zero start, is
// tests/cuda/test_op_defs_cuda.cpp's. Here what a relative error cannot say: the cumulative
// angle wraps into [-pi, pi] as the CPU op does, compared modulo 2 pi (an angle next to +-pi
// may land on the other side), and a sequence cut at multiples of kTokenBlock tokens gets
// bitwise the uncut angles (the kernel sums per 64-token segment). Skips when no GPU is present.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "cuda_test_util.h"
#include "kernels/cuda/op_buffers.h"
#include "kernels/cuda/reduce_cuda.h"
#include "mixers/mamba3/mamba3_ops_cuda.h"
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

// The angles of pieces run one after another, each starting from the last one's phi_out.
std::vector<float> angles_in_pieces(const Vec& ang, const Vec& dt, const Vec& phi_in, int64_t H, int64_t NA,
                                    const std::vector<int64_t>& pieces) {
  std::vector<float> phi;
  Dev<float> edge(phi_in);
  int64_t t0 = 0;
  for (int64_t len : pieces) {
    Dev<__nv_bfloat16> a(Vec(ang.begin() + t0 * NA, ang.begin() + (t0 + len) * NA));
    Dev<float> d(Vec(dt.begin() + t0 * H, dt.begin() + (t0 + len) * H));
    Dev<float> out(size_t(len * H * NA)), next(size_t(H * NA));
    mamba3_angles_forward_cuda(a.p, d.p, edge.p, out.p, next.p, 1, len, H, NA, nullptr);
    const std::vector<float> got = out.raw();
    phi.insert(phi.end(), got.begin(), got.end());
    EXPECT_EQ(cudaMemcpy(edge.p, next.p, size_t(H * NA) * sizeof(float), cudaMemcpyDeviceToDevice), cudaSuccess);
    t0 += len;
  }
  return phi;
}

TEST(Mamba3OpsCuda, AnglesOfPiecesCutAtTokenBlocksAreBitwiseTheUncutAngles) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t T = 300, H = 3, NA = 4;
  Vec ang = normal_vec(rng, size_t(T * NA)), dt(size_t(T * H)), phi_in = normal_vec(rng, size_t(H * NA));
  for (double& d : dt) d = 0.05 + 1.5 * std::abs(rng.normal());  // wraps often
  const std::vector<float> whole = angles_in_pieces(ang, dt, phi_in, H, NA, {T});
  EXPECT_TRUE(bitwise_equal(angles_in_pieces(ang, dt, phi_in, H, NA, {kTokenBlock, 2 * kTokenBlock, T - 3 * kTokenBlock}), whole));
  // Other cuts change the segments: the same angles up to rounding, modulo 2 pi.
  const std::vector<float> other = angles_in_pieces(ang, dt, phi_in, H, NA, {1, 99, 37, T - 137});
  double worst = 0;
  for (size_t i = 0; i < whole.size(); ++i) {
    worst = std::max(worst, std::abs(std::remainder(double(other[i]) - double(whole[i]), 2 * kPi)));
    ASSERT_LE(std::abs(other[i]), kPi + 1e-6);
  }
  EXPECT_LE(worst, 1e-4);
}

}  // namespace
}  // namespace stateflow
