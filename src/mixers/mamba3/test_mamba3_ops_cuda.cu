// The Mamba-3 layer's per-token operations on the GPU against the CPU ones (mamba3_ops.h) in
// float64 on the same bf16-rounded inputs: every output and every gradient, parameter
// gradients added to a non-zero start. Skips when no GPU is present.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "mixers/mamba3/mamba3_config.h"
#include "mixers/mamba3/mamba3_ops.h"
#include "mixers/mamba3/mamba3_ops_cuda.h"
#include "cuda_test_util.h"
#include "test_util.h"

namespace stateflow {
namespace {

using namespace stateflow::testing;

constexpr double kBand = 1.5e-2;   // bf16 outputs
constexpr double kFp32 = 2e-5;     // fp32 outputs from bf16-exact inputs
constexpr double kPi = 3.14159265358979323846;  // (CUDA C++17: no <numbers>)

void expect_close(const char* name, const Vec& got, const Vec& ref, double tol) {
  EXPECT_FALSE(has_nan(got)) << name << ": NaN (unwritten)";
  const double e = rel_err(got, ref);
  std::printf("  %-10s rel err %.3e\n", name, e);
  EXPECT_LE(e, tol) << name;
}

Vec plus(Vec a, const Vec& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] += b[i];
  return a;
}

TEST(Mamba3OpsCuda, GatesMatchTheCpuOpIncludingTheDecayFloor) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t batch = 2, len = 70, rows = batch * len, H = 3, n = rows * H;
  Vec dd_dt = rounded<bf16>(normal_vec(rng, n)), dd_A = rounded<bf16>(normal_vec(rng, n));
  for (int64_t i = 0; i < n; i += 7) dd_A[i] = -12;  // softplus(-12) < the floor: A clamps
  const Vec trap = rounded<bf16>(normal_vec(rng, n)), dt_bias = rounded<float>(normal_vec(rng, H));
  const Vec ddt = rounded<float>(normal_vec(rng, n)), dadt = rounded<float>(normal_vec(rng, n)),
            dlam = rounded<float>(normal_vec(rng, n)), g0 = rounded<float>(normal_vec(rng, H));
  Vec dt(n), adt(n), lam(n), d_dd_dt(n), d_dd_A(n), d_trap(n), d_bias(H, 0.0);
  mamba3_gates_forward<double>(dd_dt.data(), dd_A.data(), trap.data(), dt_bias.data(), dt.data(), adt.data(),
                               lam.data(), rows, H, kMamba3AFloor);
  mamba3_gates_backward<double>(dd_dt.data(), dd_A.data(), trap.data(), dt_bias.data(), ddt.data(), dadt.data(),
                                dlam.data(), d_dd_dt.data(), d_dd_A.data(), d_trap.data(), d_bias.data(), rows, H,
                                kMamba3AFloor);
  Dev<bf16> g_dd_dt(dd_dt), g_dd_A(dd_A), g_trap(trap), o_dd_dt(n), o_dd_A(n), o_trap(n);
  Dev<float> g_bias(dt_bias), g_ddt(ddt), g_dadt(dadt), g_dlam(dlam), o_dt(n), o_adt(n), o_lam(n), o_dbias(g0);
  Dev<char> ws(mamba3_gates_backward_workspace_bytes(rows, H, batch));
  mamba3_gates_forward_cuda(g_dd_dt.p, g_dd_A.p, g_trap.p, g_bias.p, o_dt.p, o_adt.p, o_lam.p, rows, H, kMamba3AFloor,
                            nullptr);
  mamba3_gates_backward_cuda(g_dd_dt.p, g_dd_A.p, g_trap.p, g_bias.p, g_ddt.p, g_dadt.p, g_dlam.p, o_dd_dt.p,
                             o_dd_A.p, o_trap.p, o_dbias.p, rows, H, batch, kMamba3AFloor, ws.p, nullptr);
  sync_ok();
  expect_close("dt", o_dt.get(), dt, kFp32);
  expect_close("adt", o_adt.get(), adt, kFp32);
  expect_close("lam", o_lam.get(), lam, kFp32);
  expect_close("d_dd_dt", o_dd_dt.get(), d_dd_dt, kBand);
  expect_close("d_dd_A", o_dd_A.get(), d_dd_A, kBand);
  expect_close("d_trap", o_trap.get(), d_trap, kBand);
  expect_close("d_dt_bias", o_dbias.get(), plus(g0, d_bias), 1e-4);
}

TEST(Mamba3OpsCuda, AnglesMatchTheCpuOpModuloTwoPi) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t batch = 2, len = 70, rows = batch * len, H = 3, NA = 4;
  const Vec ang = rounded<bf16>(normal_vec(rng, rows * NA));
  Vec dt(rows * H);
  for (double& x : dt) x = double(float(rng.uniform(0.01, 2.0)));  // large steps: the angle wraps often
  const Vec phi_in = rounded<float>(normal_vec(rng, batch * H * NA, 3.0));
  const Vec dphi = rounded<float>(normal_vec(rng, rows * H * NA)), dphi_out = rounded<float>(normal_vec(rng, batch * H * NA));
  const Vec ddt0 = rounded<float>(normal_vec(rng, rows * H));
  Vec phi(rows * H * NA), phi_out(batch * H * NA), dang(rows * NA), ddt = ddt0, dphi_in(batch * H * NA);
  mamba3_angles_forward<double>(ang.data(), dt.data(), phi_in.data(), phi.data(), phi_out.data(), batch, len, H, NA);
  mamba3_angles_backward<double>(ang.data(), dt.data(), dphi.data(), dphi_out.data(), dang.data(), ddt.data(),
                                 dphi_in.data(), batch, len, H, NA);
  Dev<bf16> g_ang(ang), o_dang(rows * NA);
  Dev<float> g_dt(dt), g_phi_in(phi_in), g_dphi(dphi), g_dphi_out(dphi_out), o_phi(phi.size()), o_phi_out(phi_out.size()),
      o_ddt(ddt0), o_dphi_in(dphi_in.size());
  Dev<char> ws(mamba3_angles_backward_workspace_bytes(rows, H, NA));
  mamba3_angles_forward_cuda(g_ang.p, g_dt.p, g_phi_in.p, o_phi.p, o_phi_out.p, batch, len, H, NA, nullptr);
  mamba3_angles_backward_cuda(g_ang.p, g_dt.p, g_dphi.p, g_dphi_out.p, o_dang.p, o_ddt.p, o_dphi_in.p, batch, len, H,
                              NA, ws.p, nullptr);
  sync_ok();
  // An angle next to +-pi may land on the other side: compare modulo 2 pi.
  auto wrapped_err = [](const Vec& got, const Vec& ref) {
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, std::abs(std::remainder(got[i] - ref[i], 2 * kPi)));
    return worst;
  };
  const Vec gphi = o_phi.get(), gphi_out = o_phi_out.get();
  EXPECT_FALSE(has_nan(gphi));
  std::printf("  phi        abs err mod 2pi %.3e, phi_out %.3e\n", wrapped_err(gphi, phi), wrapped_err(gphi_out, phi_out));
  EXPECT_LE(wrapped_err(gphi, phi), 1e-4);
  EXPECT_LE(wrapped_err(gphi_out, phi_out), 1e-4);
  for (double x : gphi) EXPECT_LE(std::abs(x), kPi + 1e-6) << "angle not reduced";
  expect_close("dang", o_dang.get(), dang, kBand);
  expect_close("ddt", o_ddt.get(), ddt, 1e-4);
  expect_close("dphi_in", o_dphi_in.get(), dphi_in, 1e-5);
}

TEST(Mamba3OpsCuda, RotaryBcMatchesTheCpuOpWithGroupsAndRanks) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t batch = 2, len = 70, rows = batch * len, H = 4, R = 2, G = 2, N = 16, NA = 4;
  const Vec bc = rounded<bf16>(normal_vec(rng, rows * R * G * N)), bias = rounded<float>(normal_vec(rng, H * R * N));
  const Vec phi = rounded<float>(normal_vec(rng, rows * H * NA, 2.0));
  const Vec dout = rounded<bf16>(normal_vec(rng, rows * H * R * N)), dbias0 = rounded<float>(normal_vec(rng, H * R * N));
  Vec out(rows * H * R * N);
  mamba3_rotary_bc_forward<double>(bc.data(), bias.data(), phi.data(), out.data(), rows, H, R, G, N, NA);
  Dev<bf16> g_bc(bc), g_dout(dout), o_out(out.size()), o_dbc(bc.size());
  Dev<float> g_bias(bias), g_phi(phi), o_dbias(dbias0), o_dphi(Vec(rows * H * NA, 0.0));
  Dev<char> ws(mamba3_rotary_bc_backward_workspace_bytes(rows, H, R, N, batch));
  mamba3_rotary_bc_forward_cuda(g_bc.p, g_bias.p, g_phi.p, o_out.p, rows, H, R, G, N, NA, nullptr);
  mamba3_rotary_bc_backward_cuda(g_dout.p, o_out.p, g_phi.p, o_dbc.p, o_dbias.p, o_dphi.p, rows, H, R, G, N, NA, batch,
                                 ws.p, nullptr);
  sync_ok();
  const Vec gout = o_out.get();
  expect_close("out", gout, out, kBand);
  // The CPU backward on the GPU's (bf16) forward output, as the GPU used it for dphi.
  Vec dbc(bc.size()), dbias(H * R * N, 0.0), dphi(rows * H * NA, 0.0);
  mamba3_rotary_bc_backward<double>(dout.data(), gout.data(), phi.data(), dbc.data(), dbias.data(), dphi.data(), rows,
                                    H, R, G, N, NA);
  expect_close("dbc", o_dbc.get(), dbc, kBand);
  expect_close("dbias", o_dbias.get(), plus(dbias0, dbias), 1e-5);
  expect_close("dphi", o_dphi.get(), dphi, 1e-5);
}

// Rank expansion and the output gate, SISO (no rank parameters) and MIMO.
class Mamba3RankOpsCuda : public ::testing::TestWithParam<int64_t> {};

TEST_P(Mamba3RankOpsCuda, ExpandXAndOutputGateMatchTheCpuOps) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t batch = 2, len = 70, rows = batch * len, H = 3, R = GetParam(), P = 8, W = H * R * P;
  const bool mimo = R > 1;
  const Vec x = rounded<bf16>(normal_vec(rng, rows * H * P)), z = rounded<bf16>(normal_vec(rng, rows * H * P));
  const Vec y = rounded<bf16>(normal_vec(rng, rows * H * R * P)), dout = rounded<bf16>(normal_vec(rng, rows * H * P));
  const Vec dX = rounded<bf16>(normal_vec(rng, rows * H * R * P));
  const Vec mx = rounded<float>(normal_vec(rng, W)), mz = rounded<float>(normal_vec(rng, W)),
            mo = rounded<float>(normal_vec(rng, W));
  const Vec g0x = rounded<float>(normal_vec(rng, W)), g0z = rounded<float>(normal_vec(rng, W)),
            g0o = rounded<float>(normal_vec(rng, W));
  const double *pmx = mimo ? mx.data() : nullptr, *pmz = mimo ? mz.data() : nullptr, *pmo = mimo ? mo.data() : nullptr;
  Vec X(rows * H * R * P), dx(x.size()), dmx(W, 0.0), out(rows * H * P), dy(y.size()), dz(z.size()), dmz(W, 0.0),
      dmo(W, 0.0);
  mamba3_expand_x_forward<double>(x.data(), pmx, X.data(), rows, H, R, P);
  mamba3_expand_x_backward<double>(x.data(), pmx, dX.data(), dx.data(), mimo ? dmx.data() : nullptr, rows, H, R, P);
  mamba3_output_gate_forward<double>(y.data(), z.data(), pmz, pmo, out.data(), rows, H, R, P);
  mamba3_output_gate_backward<double>(y.data(), z.data(), pmz, pmo, dout.data(), dy.data(), dz.data(),
                                      mimo ? dmz.data() : nullptr, mimo ? dmo.data() : nullptr, rows, H, R, P);
  Dev<bf16> g_x(x), g_z(z), g_y(y), g_dout(dout), g_dX(dX), o_X(X.size()), o_dx(dx.size()), o_out(out.size()),
      o_dy(dy.size()), o_dz(dz.size());
  Dev<float> g_mx(mx), g_mz(mz), g_mo(mo), o_dmx(g0x), o_dmz(g0z), o_dmo(g0o);
  Dev<char> ws(2 * mamba3_rank_params_workspace_bytes(rows, H, R, P, batch));
  if (mimo) {
    mamba3_expand_x_forward_cuda(g_x.p, g_mx.p, o_X.p, rows, H, R, P, nullptr);
    mamba3_expand_x_backward_cuda(g_x.p, g_mx.p, g_dX.p, o_dx.p, o_dmx.p, rows, H, R, P, batch, ws.p, nullptr);
  }
  mamba3_output_gate_forward_cuda(g_y.p, g_z.p, mimo ? g_mz.p : nullptr, mimo ? g_mo.p : nullptr, o_out.p, rows, H, R,
                                  P, nullptr);
  mamba3_output_gate_backward_cuda(g_y.p, g_z.p, mimo ? g_mz.p : nullptr, mimo ? g_mo.p : nullptr, g_dout.p, o_dy.p,
                                   o_dz.p, mimo ? o_dmz.p : nullptr, mimo ? o_dmo.p : nullptr, rows, H, R, P, batch,
                                   ws.p, nullptr);
  sync_ok();
  if (mimo) {
    expect_close("X", o_X.get(), X, kBand);
    expect_close("dx", o_dx.get(), dx, kBand);
    expect_close("dmimo_x", o_dmx.get(), plus(g0x, dmx), 1e-4);
    expect_close("dmimo_z", o_dmz.get(), plus(g0z, dmz), 1e-4);
    expect_close("dmimo_o", o_dmo.get(), plus(g0o, dmo), 1e-4);
  }
  expect_close("out", o_out.get(), out, kBand);
  expect_close("dy", o_dy.get(), dy, kBand);
  expect_close("dz", o_dz.get(), dz, kBand);
}

INSTANTIATE_TEST_SUITE_P(Ranks, Mamba3RankOpsCuda, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return "R" + std::to_string(info.param); });

}  // namespace
}  // namespace stateflow
