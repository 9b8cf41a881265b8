// cuBLASLt GEMMs against the CPU triple loop in float64 on the same rounded inputs: every
// transpose combination with padded leading dimensions, alpha and beta; the dense-layer
// helpers against kernels/cpu/gemm.h; bitwise repeatability; the pinned algorithms' row
// invariance (the same rows give the same bits whatever M); the bf16 cast.
#include <gtest/gtest.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cuda/gemm_cuda.h"
#include "cuda_test_util.h"
#include "test_util.h"

namespace stateflow {
namespace {

using namespace testing;

template <class In, class Out>
struct Types {
  using in = In;
  using out = Out;
};

template <class P>
class GemmCuda : public ::testing::Test {};
using Combos = ::testing::Types<Types<float, float>, Types<bf16, float>, Types<bf16, bf16>>;
TYPED_TEST_SUITE(GemmCuda, Combos);

// The band of the coarser of operand and result types.
template <class In, class Out>
double band() {
  return std::is_same_v<In, float> && std::is_same_v<Out, float> ? tolerance<float>() : tolerance<bf16>();
}

TYPED_TEST(GemmCuda, EveryTransposeWithPaddedStridesAlphaAndBeta) {
  SKIP_WITHOUT_GPU();
  using In = typename TypeParam::in;
  using Out = typename TypeParam::out;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  CublasGemm g;
  const int64_t M = 37, N = 53, K = 71;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (float beta : {0.f, 0.75f}) {
        SCOPED_TRACE("trans_a " + std::to_string(ta) + " trans_b " + std::to_string(tb) + " beta " + std::to_string(beta));
        const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, lda = a_cols + 3;
        const int64_t b_rows = tb ? N : K, b_cols = tb ? K : N, ldb = b_cols + 5;
        const int64_t ldc = N + 2;
        const Vec A = rounded<In>(normal_vec(rng, size_t(a_rows * lda)));
        const Vec B = rounded<In>(normal_vec(rng, size_t(b_rows * ldb)));
        Vec C = rounded<Out>(normal_vec(rng, size_t(M * ldc)));
        Dev<In> dA(A), dB(B);
        Dev<Out> dC(C);
        if (beta == 0.f) dC.poison();  // beta = 0 must not read C
        const float alpha = 1.25f;
        gemm_cuda<In, Out>(g, ta, tb, M, N, K, alpha, dA.p, lda, dB.p, ldb, beta, dC.p, ldc);
        sync_ok();
        gemm_reference<double>(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
        const Vec got = dC.get();
        Vec got_c, ref_c;  // compare the M x N block only; the padding must be left alone
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < ldc; ++j) {
            if (j < N) got_c.push_back(got[i * ldc + j]), ref_c.push_back(C[i * ldc + j]);
            else if (beta != 0.f) ASSERT_EQ(got[i * ldc + j], C[i * ldc + j]) << "padding written";
          }
        EXPECT_FALSE(has_nan(got_c));
        const double err = rel_err(got_c, ref_c);
        EXPECT_LE(err, (band<In, Out>())) << "rel err " << err;
      }
}

TYPED_TEST(GemmCuda, LinearHelpersMatchTheCpuLayers) {
  SKIP_WITHOUT_GPU();
  using In = typename TypeParam::in;
  using Out = typename TypeParam::out;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  CublasGemm g;
  const int64_t rows = 150, in = 96, out = 40, batch = 2;
  const Vec x = rounded<In>(normal_vec(rng, rows * in)), W = rounded<In>(normal_vec(rng, in * out));
  const Vec dy = rounded<In>(normal_vec(rng, rows * out));
  Vec dx0 = rounded<Out>(normal_vec(rng, rows * in)), dW0 = rounded<float>(normal_vec(rng, in * out));
  Dev<In> d_x(x), d_W(W), d_dy(dy);
  Dev<Out> d_y(size_t(rows * out)), d_dx(dx0), d_dx_new(size_t(rows * in));
  Dev<float> d_dW(dW0);
  d_y.poison(), d_dx_new.poison();
  linear_forward_cuda<In, Out>(g, d_x.p, d_W.p, d_y.p, rows, in, out);
  linear_backward_data_cuda<In, Out>(g, d_dy.p, d_W.p, d_dx.p, rows, in, out);
  linear_backward_data_cuda<In, Out>(g, d_dy.p, d_W.p, d_dx_new.p, rows, in, out, /*accumulate=*/false);
  linear_backward_weight_cuda<In>(g, d_x.p, d_dy.p, d_dW.p, rows, in, out, batch);
  sync_ok();
  Vec y(rows * out), dx = dx0, dx_new(rows * in, 0.0), dW = dW0;
  linear_forward<double>(x.data(), W.data(), y.data(), rows, in, out);
  linear_backward_data<double>(dy.data(), W.data(), dx.data(), rows, in, out);
  linear_backward_data<double>(dy.data(), W.data(), dx_new.data(), rows, in, out);
  linear_backward_weight<double>(x.data(), dy.data(), dW.data(), rows, in, out);
  const double tol = band<In, Out>();
  EXPECT_LE(rel_err(d_y.get(), y), tol) << "y";
  EXPECT_LE(rel_err(d_dx.get(), dx), tol) << "dx";
  EXPECT_LE(rel_err(d_dx_new.get(), dx_new), tol) << "dx overwritten (accumulate = false)";
  EXPECT_LE(rel_err(d_dW.get(), dW), (band<In, float>())) << "dW";
}

TYPED_TEST(GemmCuda, RepeatedCallsAreBitwiseEqual) {
  SKIP_WITHOUT_GPU();
  using In = typename TypeParam::in;
  using Out = typename TypeParam::out;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  CublasGemm g;
  // A long reduction (the weight-gradient shape: K = tokens) is where split-K would appear.
  const int64_t rows = 8192, in = 256, out = 192;
  Dev<In> x(normal_vec(rng, rows * in)), dy(normal_vec(rng, rows * out));
  const Vec dW0 = normal_vec(rng, in * out);
  std::vector<std::vector<float>> runs;
  for (int r = 0; r < 2; ++r) {
    Dev<float> dW(dW0);
    linear_backward_weight_cuda<In>(g, x.p, dy.p, dW.p, rows, in, out, 1);
    sync_ok();
    runs.push_back(dW.raw());
  }
  EXPECT_TRUE(bitwise_equal(runs[0], runs[1]));
  Dev<Out> y1(size_t(rows * in)), y2(size_t(rows * in));
  Dev<In> W(normal_vec(rng, out * in));
  linear_forward_cuda<In, Out>(g, dy.p, W.p, y1.p, rows, out, in);
  linear_forward_cuda<In, Out>(g, dy.p, W.p, y2.p, rows, out, in);
  sync_ok();
  EXPECT_TRUE(bitwise_equal(y1.raw(), y2.raw()));
}

// Rows [r0, r0 + m) of a product computed as part of M = 4096 rows and on their own, for
// several m (chunk lengths, 64-aligned or not): bitwise the same, for y = x W and dx += dy W^T.
TYPED_TEST(GemmCuda, PinnedAlgorithmsGiveTheSameRowsForAnyRowCount) {
  SKIP_WITHOUT_GPU();
  using In = typename TypeParam::in;
  using Out = typename TypeParam::out;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  CublasGemm g;
  const int64_t M = 4096, in = 256, out = 384;
  const Vec x = normal_vec(rng, M * in), W = normal_vec(rng, in * out), dy = normal_vec(rng, M * out);
  const Vec dx0 = normal_vec(rng, M * in);
  Dev<In> d_x(x), d_W(W), d_dy(dy);
  Dev<Out> y_all(size_t(M * out)), dx_all(dx0);
  linear_forward_cuda<In, Out>(g, d_x.p, d_W.p, y_all.p, M, in, out);
  linear_backward_data_cuda<In, Out>(g, d_dy.p, d_W.p, dx_all.p, M, in, out);
  sync_ok();
  const std::vector<Out> y_ref = y_all.raw(), dx_ref = dx_all.raw();
  for (auto [r0, m] : {std::pair<int64_t, int64_t>{0, 64}, {64, 320}, {1024, 2048}, {3000, 77}, {5, 1}, {0, M}}) {
    SCOPED_TRACE("rows " + std::to_string(r0) + " + " + std::to_string(m));
    Dev<Out> y(size_t(m * out)), dx(Vec(dx0.begin() + r0 * in, dx0.begin() + (r0 + m) * in));
    linear_forward_cuda<In, Out>(g, d_x.p + r0 * in, d_W.p, y.p, m, in, out);
    linear_backward_data_cuda<In, Out>(g, d_dy.p + r0 * out, d_W.p, dx.p, m, in, out);
    sync_ok();
    EXPECT_TRUE(bitwise_equal(y.raw(), std::vector<Out>(y_ref.begin() + r0 * out, y_ref.begin() + (r0 + m) * out)))
        << "y = x W";
    EXPECT_TRUE(bitwise_equal(dx.raw(), std::vector<Out>(dx_ref.begin() + r0 * in, dx_ref.begin() + (r0 + m) * in)))
        << "dx += dy W^T";
  }
}

TEST(CastToBf16Cuda, RoundsLikeTheHost) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const Vec x = normal_vec(rng, 100003, 3.0);
  Dev<float> src(x);
  Dev<bf16> dst(x.size());
  dst.poison();
  cast_to_bf16_cuda(src.p, dst.p, int64_t(x.size()), nullptr);
  sync_ok();
  std::vector<bf16> host(x.size());
  for (size_t i = 0; i < x.size(); ++i) host[i] = __float2bfloat16(float(x[i]));
  EXPECT_TRUE(bitwise_equal(dst.raw(), host));
}

}  // namespace
}  // namespace stateflow
