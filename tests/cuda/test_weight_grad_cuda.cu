// weight_grad_cuda (dW += x^T dy in fixed token steps, last step first) against the CPU triple
// loop in float64 on the same rounded inputs; its chunk invariance (one call over the sequences
// equals calls over pieces cut at multiples of the step, made last piece first, bitwise), with
// small steps and with the default kWeightGradTokens; run-to-run repeatability.
#include <gtest/gtest.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cuda/weight_grad_cuda.h"
#include "cuda_test_util.h"
#include "test_util.h"

namespace stateflow {
namespace {

using namespace testing;

template <class In>
class WeightGradCuda : public ::testing::Test {};
using Inputs = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(WeightGradCuda, Inputs);

struct Problem {
  int64_t batch, len, in, out;
  Vec x, dy, dW0;  // x [batch * len, in], dy [batch * len, out], dW0 [in, out]
};

template <class In>
Problem make_problem(Rng& rng, int64_t batch, int64_t len, int64_t in, int64_t out) {
  const int64_t rows = batch * len;
  return {batch, len, in, out, rounded<In>(normal_vec(rng, rows * in)), rounded<In>(normal_vec(rng, rows * out)),
          rounded<float>(normal_vec(rng, in * out))};
}

// Calls weight_grad_cuda on tokens [t0, t1) of every sequence, for each piece [t0, t1) in the
// order given, with steps of `step` tokens; returns dW.
template <class In>
std::vector<float> run_pieces(const Problem& p, const std::vector<std::pair<int64_t, int64_t>>& pieces, int64_t step) {
  CublasGemm g;
  Dev<In> x(p.x), dy(p.dy);
  Dev<float> dW(p.dW0);
  for (auto [t0, t1] : pieces) {
    const WeightGradOperands<In> ops{x.p + t0 * p.in, p.in, p.len * p.in, dy.p + t0 * p.out, p.out, p.len * p.out};
    weight_grad_cuda<In>(g, ops, dW.p, p.batch, t1 - t0, p.in, p.out, step);
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return dW.raw();
}

template <class In>
std::vector<float> run_whole(const Problem& p, int64_t step) {
  return run_pieces<In>(p, {{0, p.len}}, step);
}

TYPED_TEST(WeightGradCuda, MatchesTheCpuReference) {
  SKIP_WITHOUT_GPU();
  using In = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (auto [in, out] : {std::pair<int64_t, int64_t>{136, 200}, {256, 128}, {37, 5}})
    for (int64_t step : {int64_t(64), kWeightGradTokens}) {
      SCOPED_TRACE("in " + std::to_string(in) + " out " + std::to_string(out) + " step " + std::to_string(step));
      const Problem p = make_problem<In>(rng, 2, 200, in, out);
      Vec ref = p.dW0;
      linear_backward_weight<double>(p.x.data(), p.dy.data(), ref.data(), p.batch * p.len, in, out);
      const std::vector<float> got = run_whole<In>(p, step);
      Vec got_d(got.begin(), got.end());
      EXPECT_FALSE(has_nan(got_d));
      // Every entry written: the increments are O(sqrt(rows)), far above the band.
      const double err = rel_err(got_d, ref);
      EXPECT_LE(err, tolerance<In>()) << "rel err " << err;
    }
}

TYPED_TEST(WeightGradCuda, PiecesAtMultiplesOfTheStepRunLastFirstAreBitwiseTheWholeCall) {
  SKIP_WITHOUT_GPU();
  using In = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (auto [in, out] : {std::pair<int64_t, int64_t>{136, 200}, {37, 5}}) {
    SCOPED_TRACE("in " + std::to_string(in) + " out " + std::to_string(out));
    const Problem p = make_problem<In>(rng, 2, 512, in, out);
    const std::vector<float> whole = run_whole<In>(p, 64);
    EXPECT_TRUE(bitwise_equal(run_pieces<In>(p, {{256, 512}, {0, 256}}, 64), whole)) << "2 pieces";
    EXPECT_TRUE(bitwise_equal(run_pieces<In>(p, {{448, 512}, {128, 448}, {0, 128}}, 64), whole)) << "128 + 320 + 64";
    std::vector<std::pair<int64_t, int64_t>> eight;
    for (int64_t t1 = 512; t1 > 0; t1 -= 64) eight.push_back({t1 - 64, t1});
    EXPECT_TRUE(bitwise_equal(run_pieces<In>(p, eight, 64), whole)) << "8 pieces";
    // A short last step (len 200 = 64 + 128 + 8).
    const Problem q = make_problem<In>(rng, 3, 200, in, out);
    EXPECT_TRUE(bitwise_equal(run_pieces<In>(q, {{192, 200}, {64, 192}, {0, 64}}, 64), run_whole<In>(q, 64)))
        << "short tail";
  }
  // The default step, as the layers call it: a sequence of two whole steps and a short one.
  const int64_t S = kWeightGradTokens;
  const Problem p = make_problem<In>(rng, 1, 2 * S + 300, 64, 48);
  EXPECT_TRUE(bitwise_equal(run_pieces<In>(p, {{2 * S, 2 * S + 300}, {S, 2 * S}, {0, S}}, S), run_whole<In>(p, S)))
      << "pieces of kWeightGradTokens";
}

TYPED_TEST(WeightGradCuda, RunsAreBitwiseRepeatable) {
  SKIP_WITHOUT_GPU();
  using In = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const Problem p = make_problem<In>(rng, 1, 4096, 256, 192);
  EXPECT_TRUE(bitwise_equal(run_whole<In>(p, kWeightGradTokens), run_whole<In>(p, kWeightGradTokens)));
}

}  // namespace
}  // namespace stateflow
