// cuBLASLt GEMMs against the CPU triple loop in float64 on the same rounded inputs: every
// transpose combination with padded leading dimensions, alpha and beta; the dense-layer
// helpers against kernels/cpu/gemm.h, with short rows on their own algorithm and without;
// bitwise repeatability; the pinned algorithms' row invariance (the same rows give the same bits
// whatever M, and a sequence's rows the same bits whether it is cut at multiples of 2048 or
// not); short rows within twice the aligned algorithm's error; the bf16 cast.
#include <gtest/gtest.h>

#include <optional>
#include <utility>

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

// Each test on a GPU, with a fresh seed in every failure's trace and a cuBLASLt handle of its own.
template <class P>
class GemmCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    gemm_.emplace();  // once a GPU is known to be there
  }
  // What a test draws from and multiplies with: auto [rng, g] = this->rng_and_gemm();
  std::pair<Rng&, CublasGemm&> rng_and_gemm() { return {rng, *gemm_}; }

  const uint64_t seed = fresh_seed();
  const ::testing::ScopedTrace seed_trace{__FILE__, __LINE__, "seed " + std::to_string(seed)};
  Rng rng{seed};

 private:
  std::optional<CublasGemm> gemm_;
};
using Combos = ::testing::Types<Types<float, float>, Types<bf16, float>, Types<bf16, bf16>>;
TYPED_TEST_SUITE(GemmCuda, Combos);

// The band of the coarser of operand and result types.
template <class In, class Out>
double band() {
  return std::is_same_v<In, float> && std::is_same_v<Out, float> ? tolerance<float>() : tolerance<bf16>();
}

TYPED_TEST(GemmCuda, EveryTransposeWithPaddedStridesAlphaAndBeta) {
  using In = typename TypeParam::in;
  using Out = typename TypeParam::out;
  auto [rng, g] = this->rng_and_gemm();
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

template <class In, class Out>
void linear_helpers_match_the_cpu_layers(Rng& rng) {
  CublasGemm g;
  const int64_t rows = 150, in = 96, out = 40, batch = 2;
  const Vec x = rounded<In>(normal_vec(rng, rows * in)), W = rounded<In>(normal_vec(rng, in * out));
  const Vec dy = rounded<In>(normal_vec(rng, rows * out));
  Vec dx0 = rounded<Out>(normal_vec(rng, rows * in)), dW0 = rounded<float>(normal_vec(rng, in * out));
  Dev<In> d_x(x), d_W(W), d_dy(dy);
  Dev<Out> d_y(size_t(rows * out)), d_dx(dx0), d_dx_new(size_t(rows * in));
  Dev<float> d_dW(dW0);
  d_y.poison(), d_dx_new.poison();
  linear_forward_cuda<In, Out>(g, d_x.p, d_W.p, d_y.p, rows, in, out, batch);
  linear_backward_data_cuda<In, Out>(g, d_dy.p, d_W.p, d_dx.p, rows, in, out, batch);
  linear_backward_data_cuda<In, Out>(g, d_dy.p, d_W.p, d_dx_new.p, rows, in, out, batch, /*accumulate=*/false);
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

// Two sequences of 75 rows: short tails, so the short-row algorithm runs them where it is on.
TYPED_TEST(GemmCuda, LinearHelpersMatchTheCpuLayers) {
  for (const bool short_rows : {false, true}) {
    SCOPED_TRACE(short_rows ? "short rows on their own algorithm" : "every row on the aligned one");
    FlagScope on(gemm_short_rows_for_thread(), short_rows);
    linear_helpers_match_the_cpu_layers<typename TypeParam::in, typename TypeParam::out>(this->rng);
  }
}

TYPED_TEST(GemmCuda, RepeatedCallsAreBitwiseEqual) {
  using In = typename TypeParam::in;
  using Out = typename TypeParam::out;
  auto [rng, g] = this->rng_and_gemm();
  FlagScope on(gemm_short_rows_for_thread(), true);
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
  // Aligned rows, and short ones (on the short-row algorithm).
  Dev<In> W(normal_vec(rng, out * in));
  for (const int64_t m : {rows, int64_t(1000)}) {
    SCOPED_TRACE("rows " + std::to_string(m));
    Dev<Out> y1(size_t(m * in)), y2(size_t(m * in));
    linear_forward_cuda<In, Out>(g, dy.p, W.p, y1.p, m, out, in, 1);
    linear_forward_cuda<In, Out>(g, dy.p, W.p, y2.p, m, out, in, 1);
    sync_ok();
    EXPECT_TRUE(bitwise_equal(y1.raw(), y2.raw()));
  }
}

// Rows [r0, r0 + m) of a product computed as part of M = 4096 rows and on their own, for
// several m (chunk lengths, 64-aligned or not): bitwise the same, for y = x W and dx += dy W^T,
// with every row on the aligned algorithm (gemm_short off).
TYPED_TEST(GemmCuda, PinnedAlgorithmsGiveTheSameRowsForAnyRowCount) {
  using In = typename TypeParam::in;
  using Out = typename TypeParam::out;
  auto [rng, g] = this->rng_and_gemm();
  FlagScope off(gemm_short_rows_for_thread(), false);
  const int64_t M = 4096, in = 256, out = 384;
  const Vec x = normal_vec(rng, M * in), W = normal_vec(rng, in * out), dy = normal_vec(rng, M * out);
  const Vec dx0 = normal_vec(rng, M * in);
  Dev<In> d_x(x), d_W(W), d_dy(dy);
  Dev<Out> y_all(size_t(M * out)), dx_all(dx0);
  linear_forward_cuda<In, Out>(g, d_x.p, d_W.p, y_all.p, M, in, out, 1);
  linear_backward_data_cuda<In, Out>(g, d_dy.p, d_W.p, dx_all.p, M, in, out, 1);
  sync_ok();
  const std::vector<Out> y_ref = y_all.raw(), dx_ref = dx_all.raw();
  for (auto [r0, m] : {std::pair<int64_t, int64_t>{0, 64}, {64, 320}, {1024, 2048}, {3000, 77}, {5, 1}, {0, M}}) {
    SCOPED_TRACE("rows " + std::to_string(r0) + " + " + std::to_string(m));
    Dev<Out> y(size_t(m * out)), dx(Vec(dx0.begin() + r0 * in, dx0.begin() + (r0 + m) * in));
    linear_forward_cuda<In, Out>(g, d_x.p + r0 * in, d_W.p, y.p, m, in, out, 1);
    linear_backward_data_cuda<In, Out>(g, d_dy.p + r0 * out, d_W.p, dx.p, m, in, out, 1);
    sync_ok();
    EXPECT_TRUE(bitwise_equal(y.raw(), std::vector<Out>(y_ref.begin() + r0 * out, y_ref.begin() + (r0 + m) * out)))
        << "y = x W";
    EXPECT_TRUE(bitwise_equal(dx.raw(), std::vector<Out>(dx_ref.begin() + r0 * in, dx_ref.begin() + (r0 + m) * in)))
        << "dx += dy W^T";
  }
}

// The rows of `batch` sequences of `len` tokens (x: [batch, len, cols]) from t0 to t0 + n.
template <class T>
std::vector<T> chunk_rows(const std::vector<T>& x, int64_t batch, int64_t len, int64_t cols, int64_t t0, int64_t n) {
  std::vector<T> c;
  for (int64_t b = 0; b < batch; ++b)
    c.insert(c.end(), x.begin() + (b * len + t0) * cols, x.begin() + (b * len + t0 + n) * cols);
  return c;
}

// With short rows on their own algorithm: sequences cut at multiples of 2048 tokens give bitwise
// the unsplit call's rows (whose tails run the short-row algorithm), one sequence and two; a
// narrow, deep product, the kind of shape where the two pins differ. Cuts elsewhere are only
// rounded otherwise: the next test bounds that.
TYPED_TEST(GemmCuda, ShortRowsGiveTheUnsplitBitsAtCutsOnMultiplesOf2048) {
  using In = typename TypeParam::in;
  using Out = typename TypeParam::out;
  auto [rng, g] = this->rng_and_gemm();
  FlagScope on(gemm_short_rows_for_thread(), true);
  const int64_t S = kGemmAlignedRows, in = 1024, out = 64;
  for (auto [batch, len] : {std::pair<int64_t, int64_t>{1, 2 * S + 300}, {2, 2 * S + 300}, {2, 700}}) {
    SCOPED_TRACE("batch " + std::to_string(batch) + " x len " + std::to_string(len));
    const int64_t M = batch * len;
    const Vec x = normal_vec(rng, M * in), W = normal_vec(rng, in * out), dy = normal_vec(rng, M * out);
    Dev<In> d_x(x), d_W(W), d_dy(dy);
    Dev<Out> y_all(size_t(M * out)), dx_all(size_t(M * in));
    linear_forward_cuda<In, Out>(g, d_x.p, d_W.p, y_all.p, M, in, out, batch);
    linear_backward_data_cuda<In, Out>(g, d_dy.p, d_W.p, dx_all.p, M, in, out, batch, /*accumulate=*/false);
    sync_ok();
    const std::vector<Out> y_ref = y_all.raw(), dx_ref = dx_all.raw();
    for (int64_t t0 = 0; t0 < len; t0 += S) {
      const int64_t n = std::min(S, len - t0), m = batch * n;
      SCOPED_TRACE("chunk from " + std::to_string(t0) + ", " + std::to_string(n) + " tokens");
      Dev<In> cx(chunk_rows(x, batch, len, in, t0, n)), cdy(chunk_rows(dy, batch, len, out, t0, n));
      Dev<Out> y(size_t(m * out)), dx(size_t(m * in));
      linear_forward_cuda<In, Out>(g, cx.p, d_W.p, y.p, m, in, out, batch);
      linear_backward_data_cuda<In, Out>(g, cdy.p, d_W.p, dx.p, m, in, out, batch, /*accumulate=*/false);
      sync_ok();
      EXPECT_TRUE(bitwise_equal(y.raw(), chunk_rows(y_ref, batch, len, out, t0, n))) << "y = x W";
      EXPECT_TRUE(bitwise_equal(dx.raw(), chunk_rows(dx_ref, batch, len, in, t0, n))) << "dx = dy W^T";
    }
  }
}

// The short-row algorithm's error against float64 is within twice the aligned one's (the rule for
// cuts off multiples of 2048): 1000 rows of a narrow, deep product.
TYPED_TEST(GemmCuda, ShortRowsStayWithinTwiceTheAlignedError) {
  using In = typename TypeParam::in;
  using Out = typename TypeParam::out;
  auto [rng, g] = this->rng_and_gemm();
  const int64_t rows = 1000, in = 2048, out = 64;
  const Vec x = rounded<In>(normal_vec(rng, rows * in)), W = rounded<In>(normal_vec(rng, in * out));
  Dev<In> d_x(x), d_W(W);
  Vec ref(rows * out);
  linear_forward<double>(x.data(), W.data(), ref.data(), rows, in, out);
  double err[2];
  for (const bool short_rows : {false, true}) {
    FlagScope on(gemm_short_rows_for_thread(), short_rows);
    Dev<Out> y(size_t(rows * out));
    linear_forward_cuda<In, Out>(g, d_x.p, d_W.p, y.p, rows, in, out, 1);
    sync_ok();
    err[short_rows] = rms_rel_err(y.get(), ref);
  }
  std::printf("[ %s -> %s, %lld x %lld x %lld ] rms rel error vs float64: aligned %.3e, short rows %.3e\n",
              std::is_same_v<In, float> ? "fp32" : "bf16", std::is_same_v<Out, float> ? "fp32" : "bf16",
              (long long)rows, (long long)out, (long long)in, err[0], err[1]);
  EXPECT_GT(err[0], 0.0);  // a rounded product: the comparison below measures something
  EXPECT_LE(err[1], 2 * err[0]);
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
