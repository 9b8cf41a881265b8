// Short conv on the GPU against kernels/cpu/short_conv in float64 on the same rounded inputs:
// with and without a carried prefix and prefix gradient, chunks shorter than K-1, several row
// tiles, K from 1 to 8; outputs poisoned first; dw accumulates and is bitwise repeatable; and a
// forward run split into chunks (prefix_out -> prefix) gives bitwise the unsplit outputs, also
// where the pieces run shorter tiles than the whole.
#include <gtest/gtest.h>

#include "kernels/cpu/short_conv.h"
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

struct Case {
  int64_t batch, len, ch, K;
  bool prefix, dprefix;
};

template <class A>
void check_case(const Case& c, Rng& rng) {
  SCOPED_TRACE("batch " + std::to_string(c.batch) + " len " + std::to_string(c.len) + " ch " + std::to_string(c.ch) +
               " K " + std::to_string(c.K) + (c.prefix ? " prefix" : "") + (c.dprefix ? " dprefix" : ""));
  const int64_t P = c.K - 1, nx = c.batch * c.len * c.ch, np = c.batch * P * c.ch;
  const Vec x = rounded<A>(normal_vec(rng, nx)), dy = rounded<A>(normal_vec(rng, nx));
  const Vec prefix = rounded<A>(normal_vec(rng, np)), dpo = rounded<float>(normal_vec(rng, np));
  const Vec w = rounded<float>(normal_vec(rng, c.ch * c.K, 0.5)), dw0 = rounded<float>(normal_vec(rng, c.ch * c.K));
  Dev<A> d_x(x), d_dy(dy), d_prefix(prefix), d_y(nx), d_pout(np), d_dx(nx);
  Dev<float> d_w(w), d_dpo(dpo), d_dpin(np);
  Dev<char> ws(short_conv_backward_workspace_bytes(c.batch, c.len, c.ch, c.K));
  auto run = [&] {
    d_y.poison(), d_pout.poison(), d_dx.poison(), d_dpin.poison();
    Dev<float> d_dw(dw0);
    const A* pre = c.prefix ? d_prefix.p : nullptr;
    short_conv_forward_cuda<A>(d_x.p, pre, d_w.p, d_y.p, d_pout.p, c.batch, c.len, c.ch, c.K, nullptr);
    short_conv_backward_cuda<A>(d_x.p, pre, d_w.p, d_dy.p, c.dprefix ? d_dpo.p : nullptr, d_dx.p, d_dpin.p, d_dw.p,
                                c.batch, c.len, c.ch, c.K, ws.p, nullptr);
    sync_ok();
    return d_dw.raw();
  };
  const std::vector<float> dw_raw = run();
  Vec y(nx), pout(np), dx(nx), dpin(np), dw = dw0;
  const double* pre = c.prefix ? prefix.data() : nullptr;
  short_conv_forward<double>(x.data(), pre, w.data(), y.data(), pout.data(), c.batch, c.len, c.ch, c.K);
  short_conv_backward<double>(x.data(), pre, w.data(), dy.data(), c.dprefix ? dpo.data() : nullptr, dx.data(),
                              dpin.data(), dw.data(), c.batch, c.len, c.ch, c.K);
  const Vec dw_gpu(dw_raw.begin(), dw_raw.end());
  for (auto [name, got, ref, tol] :
       {std::tuple{"y", d_y.get(), y, tolerance<A>()}, {"prefix_out", d_pout.get(), pout, 0.0},
        {"dx", d_dx.get(), dx, tolerance<A>()}, {"dprefix_in", d_dpin.get(), dpin, tolerance<float>()},
        {"dw", dw_gpu, dw, tolerance<float>()}}) {
    EXPECT_FALSE(has_nan(got)) << name << ": NaN (unwritten element)";
    EXPECT_LE(rel_err(got, ref), tol) << name << " rel err " << rel_err(got, ref);
  }
  EXPECT_TRUE(bitwise_equal(run(), dw_raw)) << "dw not repeatable";
}

TYPED_TEST(ShortConvCuda, MatchesCpu) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (const Case& c : {Case{2, 37, 24, 4, true, true}, Case{2, 37, 24, 4, false, false},
                        Case{1, 2, 16, 4, true, true},      // chunk shorter than K - 1
                        Case{3, 300, 1032, 3, true, true},  // several row tiles, more than one block of channels
                        Case{1, 50, 8, 1, false, false}, Case{2, 9, 8, 8, true, true}})
    check_case<TypeParam>(c, rng);
}

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
