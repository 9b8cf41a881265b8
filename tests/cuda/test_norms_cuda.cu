// RMSNorm, gated RMSNorm and L2 norm on the GPU: dw over chunks cut at multiples of 64 tokens
// is the unsplit run's bitwise; the fused residual gives the separate add's bits, staged or not
// (norm_staged); unsupported widths are refused. Each norm against its float64
// reference at every lane-team and vector-per-lane width is its op's test
// (kernels/ops/norm_ops.cpp, tests/cuda/test_op_defs_cuda.cpp).
#include <gtest/gtest.h>

#include <tuple>

#include "kernels/cuda/elementwise_cuda.h"
#include "kernels/cuda/norms_cuda.h"
#include "cuda_test_util.h"
#include "test_util.h"

namespace stateflow {
namespace {

using namespace testing;

template <class A>
class NormsCuda : public ::testing::Test {};
using ActTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(NormsCuda, ActTypes);

enum class Kind { Rms, Gated, L2 };
const char* kind_name(Kind k) { return k == Kind::Rms ? "rmsnorm" : k == Kind::Gated ? "gated_rmsnorm" : "l2norm"; }

struct Outputs {
  Vec y, rstd, dx, dz, dw;
  std::vector<float> raw_dx, raw_dz, raw_dw;  // fp32 copies of the device bits
};

template <class A>
std::vector<float> raw_f32(const Dev<A>& d) {
  std::vector<float> r;
  for (A x : d.raw()) r.push_back(float(x));
  return r;
}

// Forward, then backward with the forward's own outputs (rstd; y for l2norm).
template <class A>
Outputs run_gpu(Kind kind, const Vec& x, const Vec& z, const Vec& w, const Vec& dy, const Vec& dw0, int64_t rows,
                int64_t dim, double eps, const TokenRows& tokens = {}) {
  Dev<A> d_x(x), d_z(z), d_dy(dy), d_y(x.size()), d_dx(x.size()), d_dz(x.size());
  Dev<float> d_w(w), d_dw(dw0), d_rstd(static_cast<size_t>(rows));
  for (auto* d : {&d_y, &d_dx, &d_dz}) d->poison();
  d_rstd.poison();
  Dev<char> ws(norm_backward_workspace_bytes(rows, dim, tokens));
  if (kind == Kind::Rms) {
    rmsnorm_forward_cuda<A>(d_x.p, d_w.p, d_y.p, d_rstd.p, rows, dim, eps, nullptr);
    rmsnorm_backward_cuda<A>(d_x.p, d_w.p, d_rstd.p, d_dy.p, d_dx.p, d_dw.p, rows, dim, tokens, ws.p, nullptr);
  } else if (kind == Kind::Gated) {
    gated_rmsnorm_forward_cuda<A>(d_x.p, d_z.p, d_w.p, d_y.p, d_rstd.p, rows, dim, eps, nullptr);
    gated_rmsnorm_backward_cuda<A>(d_x.p, d_z.p, d_w.p, d_rstd.p, d_dy.p, d_dx.p, d_dz.p, d_dw.p, rows, dim, tokens,
                                   ws.p, nullptr);
  } else {
    l2norm_forward_cuda<A>(d_x.p, d_y.p, d_rstd.p, rows, dim, eps, nullptr);
    l2norm_backward_cuda<A>(d_y.p, d_rstd.p, d_dy.p, d_dx.p, rows, dim, nullptr);
  }
  sync_ok();
  return {d_y.get(), d_rstd.get(), d_dx.get(), d_dz.get(), d_dw.get(), raw_f32(d_dx), raw_f32(d_dz), d_dw.raw()};
}

// dw over chunks of the sequences cut at multiples of 64 tokens, run last chunk first, is the
// unsplit run's bitwise (dx too: it is per row).
TYPED_TEST(NormsCuda, ChunksAtMultiplesOf64GiveTheUnsplitDwBitwise) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t batch = 2, len = 512, heads = 3, dim = 128, eps_rows = batch * len * heads;
  const Vec x = normal_vec(rng, eps_rows * dim), z = normal_vec(rng, eps_rows * dim), dy = normal_vec(rng, eps_rows * dim);
  const Vec w = normal_vec(rng, dim), dw0 = normal_vec(rng, dim);
  // Rows of tokens [t0, t1) of every sequence.
  auto rows_of = [&](const Vec& v, int64_t t0, int64_t t1) {
    Vec out;
    for (int64_t b = 0; b < batch; ++b)
      out.insert(out.end(), v.begin() + ((b * len + t0) * heads) * dim, v.begin() + ((b * len + t1) * heads) * dim);
    return out;
  };
  for (Kind kind : {Kind::Rms, Kind::Gated}) {
    SCOPED_TRACE(kind_name(kind));
    const Outputs whole = run_gpu<A>(kind, x, z, w, dy, dw0, eps_rows, dim, 1e-5, TokenRows{batch, heads});
    for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{0, 256, len}, std::vector<int64_t>{0, 128, 448, len}}) {
      Vec dw = dw0;
      for (size_t c = cuts.size() - 1; c-- > 0;) {
        const int64_t t0 = cuts[c], t1 = cuts[c + 1], n = batch * (t1 - t0) * heads;
        const Outputs part = run_gpu<A>(kind, rows_of(x, t0, t1), rows_of(z, t0, t1), w, rows_of(dy, t0, t1), dw, n,
                                        dim, 1e-5, TokenRows{batch, heads});
        dw.assign(part.raw_dw.begin(), part.raw_dw.end());
      }
      EXPECT_TRUE(bitwise_equal(std::vector<float>(dw.begin(), dw.end()), whole.raw_dw))
          << "dw, " << cuts.size() - 1 << " chunks";
    }
  }
}

// The RMS-norm backward adding the residual's gradient as it stores dx gives bitwise the
// separate add after it (a pre-norm residual block's backward), and the same dw.
TYPED_TEST(NormsCuda, RmsNormBackwardAddingToDxIsTheSeparateAdd) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t rows = 333, dim = 2048;  // a part-filled last token block
  const Vec x = normal_vec(rng, rows * dim), dy = normal_vec(rng, rows * dim), add = normal_vec(rng, rows * dim);
  const Vec w = normal_vec(rng, dim), dw0 = normal_vec(rng, dim);
  Dev<A> d_x(x), d_dy(dy), d_add(add), d_y(x.size()), d_dx_sep(x.size()), d_dx_fused(x.size());
  Dev<float> d_w(w), d_rstd(static_cast<size_t>(rows)), d_dw_sep(dw0), d_dw_fused(dw0);
  d_dx_fused.poison();
  Dev<char> ws(norm_backward_workspace_bytes(rows, dim, TokenRows{}));
  rmsnorm_forward_cuda<A>(d_x.p, d_w.p, d_y.p, d_rstd.p, rows, dim, 1e-5, nullptr);
  rmsnorm_backward_cuda<A>(d_x.p, d_w.p, d_rstd.p, d_dy.p, d_dx_sep.p, d_dw_sep.p, rows, dim, TokenRows{}, ws.p,
                           nullptr);
  add_inplace_cuda<A>(d_dx_sep.p, d_add.p, rows * dim, nullptr);
  rmsnorm_backward_cuda<A>(d_x.p, d_w.p, d_rstd.p, d_dy.p, d_dx_fused.p, d_dw_fused.p, rows, dim, TokenRows{}, ws.p,
                           nullptr, d_add.p);
  sync_ok();
  EXPECT_TRUE(bitwise_equal(d_dx_fused.raw(), d_dx_sep.raw())) << "dx";
  EXPECT_TRUE(bitwise_equal(d_dw_fused.raw(), d_dw_sep.raw())) << "dw";
}

// The fused residual loaded with a row's first pass (norm_staged) gives the bits of loading it
// between dx's stores, and the switch changes nothing else: every kind at the team widths of
// the model's norms (2048-wide rows, a warp each; 128-wide heads, 16 lanes; 64, 8 lanes), dw in
// 64-token blocks of 3 rows a token, and the RMS norm adding a residual's gradient to dx.
TYPED_TEST(NormsCuda, StagedRowsGiveTheBitsOfLoadsAsTheyGo) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int64_t dim : {2048, 128, 64}) {
    const int64_t rows = 3 * 150;  // 150 tokens of 3 rows: a part-filled last token block
    const Vec x = normal_vec(rng, rows * dim), z = normal_vec(rng, rows * dim), dy = normal_vec(rng, rows * dim);
    const Vec w = normal_vec(rng, dim), dw0 = normal_vec(rng, dim);
    for (Kind kind : {Kind::Rms, Kind::Gated, Kind::L2}) {
      SCOPED_TRACE(std::string(kind_name(kind)) + ", dim " + std::to_string(dim));
      Outputs staged, as_they_go;
      {
        FlagScope on(norm_staged_for_thread(), true);
        staged = run_gpu<A>(kind, x, z, w, dy, dw0, rows, dim, 1e-5, TokenRows{1, 3});
      }
      {
        FlagScope off(norm_staged_for_thread(), false);
        as_they_go = run_gpu<A>(kind, x, z, w, dy, dw0, rows, dim, 1e-5, TokenRows{1, 3});
      }
      EXPECT_TRUE(bitwise_equal(staged.raw_dx, as_they_go.raw_dx)) << "dx";
      if (kind == Kind::Gated) EXPECT_TRUE(bitwise_equal(staged.raw_dz, as_they_go.raw_dz)) << "dz";
      if (kind != Kind::L2) EXPECT_TRUE(bitwise_equal(staged.raw_dw, as_they_go.raw_dw)) << "dw";
    }
    // the fused residual
    Dev<A> d_x(x), d_dy(dy), d_add(z), d_y(x.size()), d_dx_on(x.size()), d_dx_off(x.size());
    Dev<float> d_w(w), d_rstd(static_cast<size_t>(rows)), d_dw_on(dw0), d_dw_off(dw0);
    d_dx_on.poison(), d_dx_off.poison();
    Dev<char> ws(norm_backward_workspace_bytes(rows, dim, TokenRows{}));
    rmsnorm_forward_cuda<A>(d_x.p, d_w.p, d_y.p, d_rstd.p, rows, dim, 1e-5, nullptr);
    for (bool on : {true, false}) {
      FlagScope scope(norm_staged_for_thread(), on);
      rmsnorm_backward_cuda<A>(d_x.p, d_w.p, d_rstd.p, d_dy.p, on ? d_dx_on.p : d_dx_off.p,
                               on ? d_dw_on.p : d_dw_off.p, rows, dim, TokenRows{}, ws.p, nullptr, d_add.p);
    }
    sync_ok();
    EXPECT_TRUE(bitwise_equal(d_dx_on.raw(), d_dx_off.raw())) << "dx with the residual, dim " << dim;
    EXPECT_TRUE(bitwise_equal(d_dw_on.raw(), d_dw_off.raw())) << "dw with the residual, dim " << dim;
  }
}

// A backward's dw reduction left to the caller (dw_later, what dw_beside runs on the side stream)
// and run on another stream afterwards gives the in-place call's dw, and the same dx: both RMS
// kinds, 1K tokens of 2048-wide rows and of 16 heads of 128.
TYPED_TEST(NormsCuda, DwReductionLeftToTheCallerGivesTheSameBits) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  for (const auto& [kind, dim, per_token] : {std::tuple<Kind, int64_t, int64_t>{Kind::Rms, 2048, 1},
                                             {Kind::Gated, 128, 16}}) {
    SCOPED_TRACE(kind_name(kind));
    const int64_t rows = 1024 * per_token;
    const TokenRows tokens{1, per_token};
    const size_t n = size_t(rows * dim);
    Dev<A> x(normal_vec(rng, n)), z(normal_vec(rng, n)), dy(normal_vec(rng, n));
    Dev<float> w(normal_vec(rng, dim)), rstd(static_cast<size_t>(rows));
    const Vec dw0 = normal_vec(rng, dim);
    Dev<A> y(n);
    if (kind == Kind::Rms) rmsnorm_forward_cuda<A>(x.p, w.p, y.p, rstd.p, rows, dim, 1e-5, nullptr);
    else gated_rmsnorm_forward_cuda<A>(x.p, z.p, w.p, y.p, rstd.p, rows, dim, 1e-5, nullptr);
    std::vector<std::vector<char>> outs;
    for (bool later : {false, true}) {
      Dev<A> dx(n), dz(n);
      Dev<float> dw(dw0);
      Dev<char> ws(norm_backward_workspace_bytes(rows, dim, tokens));
      DwReduction dw_sum;
      DwReduction* dw_later = later ? &dw_sum : nullptr;
      if (kind == Kind::Rms)
        rmsnorm_backward_cuda<A>(x.p, w.p, rstd.p, dy.p, dx.p, dw.p, rows, dim, tokens, ws.p, nullptr, nullptr, dw_later);
      else
        gated_rmsnorm_backward_cuda<A>(x.p, z.p, w.p, rstd.p, dy.p, dx.p, dz.p, dw.p, rows, dim, tokens, ws.p, nullptr,
                                       GateRows{}, dw_later);
      sync_ok();
      EXPECT_EQ(bool(dw_sum), later);
      if (dw_sum) {
        dw_sum(other);
        ASSERT_EQ(cudaStreamSynchronize(other), cudaSuccess);
      }
      std::vector<char> out;
      dw.append_bytes(out), dx.append_bytes(out);
      if (kind == Kind::Gated) dz.append_bytes(out);
      outs.push_back(out);
    }
    EXPECT_TRUE(outs[0] == outs[1]);
  }
  cudaStreamDestroy(other);
}

// Two L2 norms in one launch (l2norm_pair: the GDN's q and k) give each norm's own call's bits,
// forward (y, rstd) and backward (dx): 16 heads of 128 (16-lane teams) over 1000 tokens, and
// 37 rows of 2048 (whole warps, a part-filled last one).
TYPED_TEST(NormsCuda, TwoL2NormsInOneLaunchGiveTheirOwnCallsBits) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (const auto& [rows, dim] : {std::pair<int64_t, int64_t>{16 * 1000, 128}, {37, 2048}}) {
    SCOPED_TRACE("rows " + std::to_string(rows) + ", dim " + std::to_string(dim));
    const size_t n = size_t(rows * dim);
    Dev<A> x0(normal_vec(rng, n)), x1(normal_vec(rng, n)), dy0(normal_vec(rng, n)), dy1(normal_vec(rng, n));
    std::vector<std::vector<char>> outs;
    for (bool pair : {true, false}) {
      Dev<A> y0(n), y1(n), dx0(n), dx1(n);
      Dev<float> r0(static_cast<size_t>(rows)), r1(static_cast<size_t>(rows));
      for (auto* d : {&y0, &y1, &dx0, &dx1}) d->poison();
      FlagScope scope(l2norm_pair_for_thread(), pair);
      const L2NormRows<A> fwd[2] = {{x0.p, y0.p, r0.p}, {x1.p, y1.p, r1.p}};
      l2norm_forward_pair_cuda<A>(fwd, rows, dim, 1e-6, nullptr);
      const L2NormRows<A> bwd[2] = {{nullptr, y0.p, r0.p, dy0.p, dx0.p}, {nullptr, y1.p, r1.p, dy1.p, dx1.p}};
      l2norm_backward_pair_cuda<A>(bwd, rows, dim, nullptr);
      sync_ok();
      std::vector<char> out;
      for (const Dev<A>* d : {&y0, &y1, &dx0, &dx1}) d->append_bytes(out);
      r0.append_bytes(out), r1.append_bytes(out);
      outs.push_back(out);
    }
    EXPECT_TRUE(outs[0] == outs[1]);
  }
}

// The gated norm's z and dz as a column block of a wider matrix (GateRows: the GDN's output gate
// beside q, k and v in one GEMM's output): the bits of contiguous ones, columns outside left alone.
TYPED_TEST(NormsCuda, GateColumnBlocksGiveTheContiguousBits) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t tokens = 150, heads = 3, dim = 128, rows = tokens * heads, at = 64, ld = at + heads * dim + 40;
  const Vec x = normal_vec(rng, rows * dim), z = normal_vec(rng, rows * dim), dy = normal_vec(rng, rows * dim);
  const Vec w = normal_vec(rng, dim), dw0 = normal_vec(rng, dim);
  const TokenRows per_head{1, heads};
  const Outputs contiguous = run_gpu<A>(Kind::Gated, x, z, w, dy, dw0, rows, dim, 1e-5, per_head);

  Vec z_wide(size_t(tokens * ld), 0.0);
  for (int64_t t = 0; t < tokens; ++t)
    std::copy(z.begin() + t * heads * dim, z.begin() + (t + 1) * heads * dim, z_wide.begin() + t * ld + at);
  Dev<A> d_x(x), d_z(z_wide), d_dy(dy), d_y(x.size()), d_dx(x.size()), d_dz(z_wide.size());
  Dev<float> d_w(w), d_dw(dw0), d_rstd(static_cast<size_t>(rows));
  d_y.poison(), d_dx.poison(), d_dz.poison();
  Dev<char> ws(norm_backward_workspace_bytes(rows, dim, per_head));
  const GateRows z_rows{heads, ld};
  gated_rmsnorm_forward_cuda<A>(d_x.p, d_z.p + at, d_w.p, d_y.p, d_rstd.p, rows, dim, 1e-5, nullptr, z_rows);
  gated_rmsnorm_backward_cuda<A>(d_x.p, d_z.p + at, d_w.p, d_rstd.p, d_dy.p, d_dx.p, d_dz.p + at, d_dw.p, rows, dim,
                                 per_head, ws.p, nullptr, z_rows);
  sync_ok();
  const std::vector<float> dz_wide = raw_f32(d_dz);
  std::vector<float> dz;
  for (int64_t t = 0; t < tokens; ++t) {
    dz.insert(dz.end(), dz_wide.begin() + t * ld + at, dz_wide.begin() + t * ld + at + heads * dim);
    EXPECT_TRUE(std::isnan(dz_wide[size_t(t * ld)]) && std::isnan(dz_wide[size_t(t * ld + ld - 1)])) << "token " << t;
  }
  EXPECT_TRUE(bitwise_equal(raw_f32(d_y), std::vector<float>(contiguous.y.begin(), contiguous.y.end()))) << "y";
  EXPECT_TRUE(bitwise_equal(raw_f32(d_dx), contiguous.raw_dx)) << "dx";
  EXPECT_TRUE(bitwise_equal(dz, contiguous.raw_dz)) << "dz";
  EXPECT_TRUE(bitwise_equal(d_dw.raw(), contiguous.raw_dw)) << "dw";
}

TEST(NormsCudaChecks, RejectsUnsupportedWidths) {
  EXPECT_THROW(rmsnorm_forward_cuda<float>(nullptr, nullptr, nullptr, nullptr, 4, 12, 1e-5, nullptr), Error);
  EXPECT_THROW(l2norm_forward_cuda<float>(nullptr, nullptr, nullptr, 4, 8192, 1e-5, nullptr), Error);
}

}  // namespace
}  // namespace stateflow
