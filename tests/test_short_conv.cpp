#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/cpu/short_conv.h"
#include "kernel_test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

constexpr int64_t kBatch = 3, kCh = 5;

// One chunk's inputs for every sequence of the batch, in double, plus the cotangents of
// L = <y, dy> + <prefix_out, dprefix_out>.
struct Conv {
  int64_t len, K;
  std::vector<double> x, prefix, w, dy, dprefix_out;
  std::vector<double> dw_base;  // dw starts here: the kernel accumulates into it
  Conv(Rng& rng, int64_t len_, int64_t K_)
      : len(len_), K(K_), x(random_vec<double>(rng, kBatch * len * kCh)),
        prefix(random_vec<double>(rng, kBatch * (K - 1) * kCh)), w(random_vec<double>(rng, kCh * K, 0.5)),
        dy(random_vec<double>(rng, kBatch * len * kCh)), dprefix_out(random_vec<double>(rng, kBatch * (K - 1) * kCh)),
        dw_base(random_vec<double>(rng, kCh * K)) {}
  int64_t P() const { return K - 1; }
};

template <class T>
struct ConvResult {
  std::vector<T> y, prefix_out, dx, dprefix_in, dw;
};

// Forward then backward in precision T. without_prefix / without_dprefix_out pass nullptr.
template <class T>
ConvResult<T> run(const Conv& c, bool without_prefix = false, bool without_dprefix_out = false) {
  const auto x = as<T>(c.x), prefix = as<T>(c.prefix), w = as<T>(c.w), dy = as<T>(c.dy), dpo = as<T>(c.dprefix_out);
  const T* p = without_prefix ? nullptr : prefix.data();
  const int64_t n = kBatch * c.len * kCh, np = kBatch * c.P() * kCh;
  // NaN where the kernel must overwrite.
  ConvResult<T> r{std::vector<T>(n, T(NAN)), std::vector<T>(np, T(NAN)), std::vector<T>(n, T(NAN)),
                  std::vector<T>(np, T(NAN)), as<T>(c.dw_base)};
  short_conv_forward<T>(x.data(), p, w.data(), r.y.data(), r.prefix_out.data(), kBatch, c.len, kCh, c.K);
  short_conv_backward<T>(x.data(), p, w.data(), dy.data(), without_dprefix_out ? nullptr : dpo.data(), r.dx.data(),
                         r.dprefix_in.data(), r.dw.data(), kBatch, c.len, kCh, c.K);
  for (size_t i = 0; i < r.dw.size(); ++i) r.dw[i] -= T(c.dw_base[i]);
  return r;
}

double loss(const Conv& c) {
  const auto r = run<double>(c);
  double l = 0;
  for (size_t i = 0; i < r.y.size(); ++i) l += r.y[i] * c.dy[i];
  for (size_t i = 0; i < r.prefix_out.size(); ++i) l += r.prefix_out[i] * c.dprefix_out[i];
  return l;
}

// Section 5 of MATH.md verbatim: xe = [prefix; x], y_t = silu(sum_j w[:, j] xe_{t+j}),
// prefix_out = last K-1 rows of xe.
void reference(const Conv& c, std::vector<double>& y, std::vector<double>& prefix_out) {
  const int64_t P = c.P(), L = c.len;
  y.assign(kBatch * L * kCh, 0.0);
  prefix_out.assign(kBatch * P * kCh, 0.0);
  for (int64_t b = 0; b < kBatch; ++b) {
    std::vector<double> xe(c.prefix.begin() + b * P * kCh, c.prefix.begin() + (b + 1) * P * kCh);
    xe.insert(xe.end(), c.x.begin() + b * L * kCh, c.x.begin() + (b + 1) * L * kCh);
    for (int64_t t = 0; t < L; ++t)
      for (int64_t ch = 0; ch < kCh; ++ch) {
        double pre = 0;
        for (int64_t j = 0; j < c.K; ++j) pre += c.w[ch * c.K + j] * xe[(t + j) * kCh + ch];
        y[(b * L + t) * kCh + ch] = pre / (1 + std::exp(-pre));
      }
    for (int64_t r = 0; r < P; ++r)
      for (int64_t ch = 0; ch < kCh; ++ch) prefix_out[(b * P + r) * kCh + ch] = xe[(L + r) * kCh + ch];
  }
}

// Chunk lengths below, at and above K-1, and the empty chunk.
const int64_t kLens[] = {0, 1, 2, 3, 4, 17};
const int64_t kKernels[] = {4, 2};

TEST(ShortConv, ForwardMatchesReference) {
  for (int64_t K : kKernels)
    for (int64_t len : kLens) {
      const uint64_t seed = fresh_seed();
      SCOPED_TRACE("seed " + std::to_string(seed) + " K " + std::to_string(K) + " len " + std::to_string(len));
      Rng rng(seed);
      const Conv c(rng, len, K);
      std::vector<double> y, prefix_out;
      reference(c, y, prefix_out);
      const auto d = run<double>(c);
      const auto f = run<float>(c);
      EXPECT_LE(rel_err(d.y, y), 1e-15);
      EXPECT_LE(rel_err(f.y, y), 1e-6);
      EXPECT_EQ(d.prefix_out, prefix_out);  // a copy of input rows: exact
      EXPECT_EQ(f.prefix_out, as<float>(prefix_out));
    }
}

TEST(ShortConv, BackwardMatchesFiniteDifferences) {
  for (int64_t K : kKernels)
    for (int64_t len : kLens) {
      const uint64_t seed = fresh_seed();
      SCOPED_TRACE("seed " + std::to_string(seed) + " K " + std::to_string(K) + " len " + std::to_string(len));
      Rng rng(seed);
      Conv c(rng, len, K);
      const auto g = run<double>(c);
      auto L = [&] { return loss(c); };
      EXPECT_LE(fd_error(L, &c.prefix, g.dprefix_in, rng), 1e-7) << "dprefix_in";
      if (len == 0) {  // nothing to convolve: the prefix passes straight through
        EXPECT_EQ(g.dprefix_in, c.dprefix_out);
        EXPECT_EQ(g.dw, std::vector<double>(c.w.size(), 0.0));
        continue;
      }
      EXPECT_LE(fd_error(L, &c.x, g.dx, rng), 1e-7) << "dx";
      EXPECT_LE(fd_error(L, &c.w, g.dw, rng), 1e-7) << "dw";
    }
}

// Negative control: a backward that drops the gradient of the emitted prefix (dprefix_out)
// is what forgetting the StateFlow edge looks like; the FD check must flag it.
TEST(ShortConv, FiniteDifferenceCheckFlagsMissingPrefixGradient) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  Conv c(rng, 17, 4);
  const auto wrong = run<double>(c, false, /*without_dprefix_out=*/true);
  EXPECT_GE(fd_error([&] { return loss(c); }, &c.x, wrong.dx, rng), 1e-3);
}

TEST(ShortConv, NullPointersMeanZeros) {
  for (int64_t len : kLens) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + " len " + std::to_string(len));
    Rng rng(seed);
    Conv c(rng, len, 4);
    const auto null_prefix = run<double>(c, /*without_prefix=*/true);
    std::fill(c.prefix.begin(), c.prefix.end(), 0.0);
    const auto zero_prefix = run<double>(c);
    EXPECT_EQ(null_prefix.y, zero_prefix.y);
    EXPECT_EQ(null_prefix.prefix_out, zero_prefix.prefix_out);
    EXPECT_EQ(null_prefix.dx, zero_prefix.dx);
    EXPECT_EQ(null_prefix.dw, zero_prefix.dw);

    const auto null_dpo = run<double>(c, false, /*without_dprefix_out=*/true);
    std::fill(c.dprefix_out.begin(), c.dprefix_out.end(), 0.0);
    const auto zero_dpo = run<double>(c);
    EXPECT_EQ(null_dpo.dx, zero_dpo.dx);
    EXPECT_EQ(null_dpo.dprefix_in, zero_dpo.dprefix_in);
    EXPECT_EQ(null_dpo.dw, zero_dpo.dw);
  }
}

// prefix_out may be the prefix buffer itself (the carried state updated in place).
TEST(ShortConv, PrefixUpdatedInPlace) {
  for (int64_t len : kLens) {
    const uint64_t seed = fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + " len " + std::to_string(len));
    Rng rng(seed);
    const Conv c(rng, len, 4);
    const auto expected = run<double>(c).prefix_out;
    auto state = c.prefix;
    std::vector<double> y(c.x.size());
    short_conv_forward<double>(c.x.data(), state.data(), c.w.data(), y.data(), state.data(), kBatch, len, kCh, 4);
    EXPECT_EQ(state, expected);
  }
}

// Rows [begin, end) of every sequence of a [batch, T, ch] tensor, as a [batch, end-begin, ch] one.
std::vector<double> rows_of(const std::vector<double>& v, int64_t T, int64_t begin, int64_t end) {
  std::vector<double> out;
  for (int64_t b = 0; b < kBatch; ++b)
    out.insert(out.end(), v.begin() + (b * T + begin) * kCh, v.begin() + (b * T + end) * kCh);
  return out;
}

template <class T>
void put_rows(std::vector<T>& v, int64_t total, int64_t begin, const std::vector<T>& piece) {
  const int64_t n = int64_t(piece.size()) / (kBatch * kCh);
  for (int64_t b = 0; b < kBatch; ++b)
    std::copy_n(piece.begin() + b * n * kCh, n * kCh, v.begin() + (b * total + begin) * kCh);
}

// The StateFlow contract: running a sequence as pieces, passing prefix_out forward and
// dprefix_in backward (in reverse order), reproduces the unsplit run: outputs and the final
// prefix bitwise (each output is the same K-term sum), gradients up to reassociation.
template <class T>
void check_split(double grad_tol) {
  constexpr int64_t kT = 40, kK = 4;
  const std::vector<std::vector<int64_t>> splits = {
      {10, 30}, {1, 2, 1, 7, 29}, {3, 3, 3, 31}, {13, 14, 13}, {0, 2, 0, 1, 37}};
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const Conv whole(rng, kT, kK);  // non-zero initial prefix and final-prefix gradient
  const auto ref = run<T>(whole);
  for (const auto& pieces : splits) {
    std::string tag;
    for (int64_t p : pieces) tag += std::to_string(p) + " ";
    SCOPED_TRACE("pieces " + tag);
    std::vector<T> y(ref.y.size()), dx(ref.dx.size()), dw(whole.w.size(), T(0));
    auto state = as<T>(whole.prefix);
    std::vector<std::vector<T>> prefixes;  // the prefix each piece received, for its backward
    std::vector<int64_t> starts;
    const auto w = as<T>(whole.w);
    int64_t start = 0;
    for (int64_t len : pieces) {
      const auto xp = as<T>(rows_of(whole.x, kT, start, start + len));
      std::vector<T> yp(xp.size()), next(state.size());
      short_conv_forward<T>(xp.data(), state.data(), w.data(), yp.data(), next.data(), kBatch, len, kCh, kK);
      put_rows(y, kT, start, yp);
      prefixes.push_back(state);
      starts.push_back(start);
      state = next;
      start += len;
    }
    EXPECT_EQ(y, ref.y);
    EXPECT_EQ(state, ref.prefix_out);

    auto dstate = as<T>(whole.dprefix_out);
    for (size_t i = pieces.size(); i-- > 0;) {
      const int64_t len = pieces[i], s = starts[i];
      const auto xp = as<T>(rows_of(whole.x, kT, s, s + len)), dyp = as<T>(rows_of(whole.dy, kT, s, s + len));
      std::vector<T> dxp(xp.size()), dprev(dstate.size());
      short_conv_backward<T>(xp.data(), prefixes[i].data(), w.data(), dyp.data(), dstate.data(), dxp.data(),
                             dprev.data(), dw.data(), kBatch, len, kCh, kK);
      put_rows(dx, kT, s, dxp);
      dstate = dprev;
    }
    EXPECT_LE(rel_err(dx, ref.dx), grad_tol) << "dx";
    EXPECT_LE(rel_err(dstate, ref.dprefix_in), grad_tol) << "dprefix (initial)";
    EXPECT_LE(rel_err(dw, ref.dw), grad_tol) << "dw";
  }
}

TEST(ShortConv, SplitSequenceEqualsUnsplit) {
  check_split<double>(1e-12);
  check_split<float>(1e-5);
}

}  // namespace
