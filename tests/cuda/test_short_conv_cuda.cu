// Short conv on the GPU: a forward run split into chunks (prefix_out -> prefix) gives bitwise
// the unsplit outputs (also where the pieces run shorter tiles than the whole), and so does
// the backward over chunks at multiples of 64; unsupported
// shapes are refused. The kernel against its float64 reference (with and without a carried
// prefix, chunks shorter than K-1, several row tiles, K from 1 to 8) is its op's test
// (kernels/ops/short_conv_op.cpp, tests/cuda/test_op_defs_cuda.cpp).
#include <gtest/gtest.h>

#include "kernels/cuda/short_conv_cuda.h"
#include "cuda_test_util.h"
#include "test_util.h"

namespace stateflow {
namespace {

using namespace testing;

template <class A>
class ShortConvCuda : public ::testing::Test {};
using ActTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(ShortConvCuda, ActTypes);

// MATH.md section 8: conv outputs do not depend on where the sequence is cut. Runs x[len, ch]
// whole and cut at `cuts` (the last is len), carrying the prefix.
template <class A>
void check_split_forward(int64_t len, int64_t ch, const std::vector<int64_t>& cuts) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", len " + std::to_string(len));
  Rng rng(seed);
  const int64_t K = 4, P = K - 1;
  const Vec x = normal_vec(rng, len * ch), w = normal_vec(rng, ch * K, 0.5);
  Dev<A> d_x(x), d_y(len * ch), d_pout(P * ch);
  Dev<float> d_w(w);
  short_conv_forward_cuda<A>(d_x.p, nullptr, d_w.p, d_y.p, d_pout.p, 1, len, ch, K, nullptr);
  sync_ok();
  const std::vector<A> whole = d_y.raw();
  std::vector<A> pieces;
  Dev<A> carry_a(P * ch), carry_b(P * ch);
  const A* prefix = nullptr;
  int64_t t0 = 0;
  for (int64_t cut : cuts) {
    const int64_t n = cut - t0;
    Dev<A> y(n * ch);
    A* out = prefix == carry_a.p ? carry_b.p : carry_a.p;
    short_conv_forward_cuda<A>(d_x.p + t0 * ch, prefix, d_w.p, y.p, out, 1, n, ch, K, nullptr);
    sync_ok();
    const std::vector<A> part = y.raw();
    pieces.insert(pieces.end(), part.begin(), part.end());
    prefix = out, t0 = cut;
  }
  EXPECT_TRUE(bitwise_equal(pieces, whole));
}

TYPED_TEST(ShortConvCuda, SplitForwardIsBitwiseTheWhole) {
  SKIP_WITHOUT_GPU();
  check_split_forward<TypeParam>(301, 32, {2, 130, 301});  // a piece shorter than K - 1 first
}

// The forward's tile shrinks for short chunks: the 32K-row whole runs 64-row tiles, the
// pieces 8- to 32-row ones, and every output row is still the same.
TYPED_TEST(ShortConvCuda, ForwardTilesOfAnyLengthGiveTheSameRows) {
  SKIP_WITHOUT_GPU();
  check_split_forward<TypeParam>(32768, 2048, {1024, 3000, 32768});
}

// The backward over chunks cut at multiples of 64, run last chunk first with the prefix
// gradient carried (dprefix_in -> dprefix_out), gives the unsplit dx, dw and dprefix bitwise.
TYPED_TEST(ShortConvCuda, SplitBackwardAtMultiplesOf64IsBitwiseTheWhole) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t len = 512, ch = 32, K = 4, P = K - 1;
  const Vec x = normal_vec(rng, len * ch), dy = normal_vec(rng, len * ch), w = normal_vec(rng, ch * K, 0.5);
  const Vec dw0 = normal_vec(rng, ch * K);
  Dev<A> d_x(x), d_dy(dy);
  Dev<float> d_w(w);
  // Returns dx (all rows), then dw, then the first chunk's dprefix_in, as floats.
  auto run = [&](const std::vector<int64_t>& cuts) {
    const size_t n_chunks = cuts.size() - 1;
    std::vector<Dev<A>> prefix;  // prefix[c]: what chunk c reads (chunk 0: none)
    std::vector<Dev<float>> dprefix;
    for (size_t c = 0; c <= n_chunks; ++c) prefix.emplace_back(size_t(P * ch)), dprefix.emplace_back(size_t(P * ch));
    for (size_t c = 0; c < n_chunks; ++c) {
      Dev<A> y(size_t((cuts[c + 1] - cuts[c]) * ch));
      short_conv_forward_cuda<A>(d_x.p + cuts[c] * ch, c ? prefix[c].p : nullptr, d_w.p, y.p, prefix[c + 1].p, 1,
                                 cuts[c + 1] - cuts[c], ch, K, nullptr);
    }
    Dev<A> dx(size_t(len * ch));
    Dev<float> dw(dw0);
    for (size_t c = n_chunks; c-- > 0;) {
      const int64_t n = cuts[c + 1] - cuts[c];
      Dev<char> ws(short_conv_backward_workspace_bytes(1, n, ch, K));
      short_conv_backward_cuda<A>(d_x.p + cuts[c] * ch, c ? prefix[c].p : nullptr, d_w.p, d_dy.p + cuts[c] * ch,
                                  c + 1 < n_chunks ? dprefix[c + 1].p : nullptr, dx.p + cuts[c] * ch, dprefix[c].p,
                                  dw.p, 1, n, ch, K, ws.p, nullptr);
    }
    sync_ok();
    std::vector<float> out;
    for (A v : dx.raw()) out.push_back(float(v));
    for (float v : dw.raw()) out.push_back(v);
    for (float v : dprefix[0].raw()) out.push_back(v);
    return out;
  };
  const std::vector<float> whole = run({0, len});
  EXPECT_TRUE(bitwise_equal(run({0, 256, len}), whole)) << "2 chunks";
  EXPECT_TRUE(bitwise_equal(run({0, 128, 448, len}), whole)) << "128 + 320 + 64";
}

TEST(ShortConvCudaChecks, RejectsUnsupportedShapes) {
  expect_error([] { short_conv_forward_cuda<float>(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4, 8, 9, nullptr); },
               "K = 9");
  expect_error([] { short_conv_forward_cuda<float>(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4, 12, 4, nullptr); },
               "ch = 12");
}

}  // namespace
}  // namespace stateflow
