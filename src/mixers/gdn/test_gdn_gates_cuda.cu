// GDN gates on the GPU: the per-head parameter gradients over chunks cut at multiples of the
// step they are added in (2048 tokens, or 64 with the gate_steps lever off) equal the unsplit
// run's bitwise, and with either step match the float64 reference over several steps, the last
// one short. The kernels against their float64 reference at the op's shapes (head counts that
// do and do not divide the block, accumulating parameter gradients, bitwise repeats) are their
// op's test (mixers/gdn/gdn_gates_op.cpp, tests/cuda/test_op_defs_cuda.cpp).
#include <gtest/gtest.h>

#include "core/error.h"
#include "kernels/cuda/reduce_cuda.h"
#include "kernels/cuda/weight_grad_cuda.h"
#include "mixers/gdn/gdn_gates.h"
#include "mixers/gdn/gdn_gates_cuda.h"
#include "cuda_test_util.h"
#include "test_util.h"

namespace stateflow {
namespace {

using namespace testing;

template <class A>
class GdnGatesCuda : public ::testing::Test {};
using ActTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(GdnGatesCuda, ActTypes);

// Two sequences of two whole 2048-token steps and a short third; 5 heads (not a divisor of
// the kernel's 256-thread block); fresh random inputs.
struct GatesCase {
  uint64_t seed = fresh_seed();
  int64_t batch = 2, len = 2 * kWeightGradTokens + 320, heads = 5;
  Vec a, b, dg, dbeta, A_log, dt_bias, dA0, ddt0;
  GatesCase() {
    Rng rng(seed);
    const size_t n = size_t(batch * len * heads);
    a = normal_vec(rng, n), b = normal_vec(rng, n), dg = normal_vec(rng, n), dbeta = normal_vec(rng, n);
    A_log = normal_vec(rng, size_t(heads), 0.5), dt_bias = normal_vec(rng, size_t(heads), 0.5);
    dA0 = normal_vec(rng, size_t(heads)), ddt0 = normal_vec(rng, size_t(heads));
  }
  // Tokens [t0, t1) of every sequence.
  Vec rows_of(const Vec& v, int64_t t0, int64_t t1) const {
    Vec out;
    for (int64_t s = 0; s < batch; ++s)
      out.insert(out.end(), v.begin() + (s * len + t0) * heads, v.begin() + (s * len + t1) * heads);
    return out;
  }
  // dA_log, ddt_bias after the backward of the chunks between `cuts`, last chunk first.
  template <class A>
  std::pair<std::vector<float>, std::vector<float>> run(const std::vector<int64_t>& cuts, int64_t step) const {
    Dev<float> d_Alog(A_log), d_dt(dt_bias), d_dA(dA0), d_ddt(ddt0);
    for (size_t c = cuts.size() - 1; c-- > 0;) {
      const int64_t t0 = cuts[c], t1 = cuts[c + 1], rows = batch * (t1 - t0);
      Dev<A> d_a(rows_of(a, t0, t1)), d_b(rows_of(b, t0, t1)), d_da(size_t(rows * heads)), d_db(size_t(rows * heads));
      Dev<float> d_dg(rows_of(dg, t0, t1)), d_dbeta(rows_of(dbeta, t0, t1));
      Dev<char> ws(gdn_gates_backward_workspace_bytes(rows, heads, batch));
      gdn_gates_backward_cuda<A>(d_a.p, d_b.p, d_Alog.p, d_dt.p, d_dg.p, d_dbeta.p, d_da.p, d_db.p, d_dA.p, d_ddt.p,
                                 rows, heads, batch, ws.p, nullptr, step);
      sync_ok();
    }
    return {d_dA.raw(), d_ddt.raw()};
  }
};

// dA_log and ddt_bias over chunks cut at multiples of the step, run last chunk first, equal
// the unsplit run's bitwise: 2048-token steps (the default) and 64-token ones (the lever off).
TYPED_TEST(GdnGatesCuda, ChunksAtMultiplesOfTheStepGiveTheUnsplitParameterGradientsBitwise) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const GatesCase c;
  SCOPED_TRACE("seed " + std::to_string(c.seed));
  const int64_t S = kWeightGradTokens, L = c.len;
  const std::vector<std::pair<int64_t, std::vector<std::vector<int64_t>>>> cases = {
      {S, {{0, S, L}, {0, 2 * S, L}, {0, S, 2 * S, L}}},
      {kTokenBlock, {{0, 256, L}, {0, 128, 448, S + 64, L}, {0, S, L - 64, L}}}};
  for (const auto& [step, cutss] : cases) {
    const auto whole = c.run<A>({0, L}, step);
    for (const std::vector<int64_t>& cuts : cutss) {
      const auto split = c.run<A>(cuts, step);
      EXPECT_TRUE(bitwise_equal(split.first, whole.first)) << "dA_log, step " << step << ", " << cuts.size() - 1
                                                           << " chunks";
      EXPECT_TRUE(bitwise_equal(split.second, whole.second))
          << "ddt_bias, step " << step << ", " << cuts.size() - 1 << " chunks";
    }
  }
}

// Either step gives the float64 reference's parameter gradients (to fp32 summation error),
// also when chunks are cut off the step.
TYPED_TEST(GdnGatesCuda, ParameterGradientsMatchTheFloat64ReferenceWithEitherStep) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const GatesCase c;
  SCOPED_TRACE("seed " + std::to_string(c.seed));
  const int64_t rows = c.batch * c.len, n = rows * c.heads;
  const Vec a = rounded<A>(c.a), b = rounded<A>(c.b), dg = rounded<float>(c.dg), dbeta = rounded<float>(c.dbeta);
  const Vec A_log = rounded<float>(c.A_log), dt_bias = rounded<float>(c.dt_bias);
  Vec da(static_cast<size_t>(n)), db(static_cast<size_t>(n)), dA = rounded<float>(c.dA0), ddt = rounded<float>(c.ddt0);
  gdn_gates_backward<double>(a.data(), b.data(), A_log.data(), dt_bias.data(), dg.data(), dbeta.data(), da.data(),
                             db.data(), dA.data(), ddt.data(), rows, c.heads);
  for (int64_t step : {kWeightGradTokens, kTokenBlock})
    for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{0, c.len}, std::vector<int64_t>{0, 1000, c.len}}) {
      const auto got = c.run<A>(cuts, step);
      EXPECT_LT(rel_err(got.first, dA), 1e-5) << "dA_log, step " << step << ", " << cuts.size() - 1 << " chunks";
      EXPECT_LT(rel_err(got.second, ddt), 1e-5) << "ddt_bias, step " << step << ", " << cuts.size() - 1 << " chunks";
    }
}

TEST(GdnGatesCudaSteps, AStepThatIsNoMultipleOfTheTokenBlockIsRefused) {
  for (int64_t step : {int64_t(0), int64_t(100), 2 * kWeightGradTokens}) {
    try {
      gdn_gates_backward_cuda<float>(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                     nullptr, 0, 4, 1, nullptr, nullptr, step);
      ADD_FAILURE() << "step_tokens = " << step << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("step_tokens = " + std::to_string(step)), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace stateflow
