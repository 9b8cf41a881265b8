// RoPE: a rotation by pos * theta^(-2e/r) per pair (reference below), chunk-invariant
// (a chunk at offset o rotates as rows o.. of the whole sequence, bitwise), scores depend
// only on the distance between positions, and backward is the transpose.
#include <gtest/gtest.h>

#include <cmath>

#include "mixers/attention/rope.h"
#include "test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

TEST(Rope, MatchesPairRotationReference) {
  Rng rng(fresh_seed());
  const RopeDims d{2, 5, 7, 3, 10, 6, 500.0};  // partial rotation: 6 of 10 dims
  const std::vector<double> x = random_vec<double>(rng, size_t(d.batch * d.len * d.heads * d.head_dim));
  std::vector<double> y = x;
  rope_forward<double>(d, y.data());
  std::vector<double> ref = x;
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t i = 0; i < d.len; ++i)
      for (int64_t h = 0; h < d.heads; ++h)
        for (int64_t e = 0; e < 3; ++e) {
          const size_t at = size_t(((b * d.len + i) * d.heads + h) * d.head_dim);
          const double a = double(d.offset + i) * std::pow(500.0, -2.0 * double(e) / 6.0);
          const double x1 = x[at + e], x2 = x[at + e + 3];
          ref[at + e] = x1 * std::cos(a) - x2 * std::sin(a);
          ref[at + e + 3] = x2 * std::cos(a) + x1 * std::sin(a);
        }
  EXPECT_LE(rel_err(y, ref), 1e-15);
}

TEST(Rope, ChunkAtOffsetRotatesAsTheWholeSequenceBitwise) {
  Rng rng(fresh_seed());
  RopeDims whole{1, 30, 0, 2, 8, 8, 10000.0};
  const int64_t row = whole.heads * whole.head_dim;
  std::vector<float> x = random_vec<float>(rng, size_t(whole.len * row)), chunk(x.begin() + 17 * row, x.end());
  rope_forward<float>(whole, x.data());
  RopeDims part = whole;
  part.offset = 17, part.len = 13;
  rope_forward<float>(part, chunk.data());
  EXPECT_TRUE(std::equal(chunk.begin(), chunk.end(), x.begin() + 17 * row));
}

TEST(Rope, ScoresDependOnlyOnDistance) {
  Rng rng(fresh_seed());
  const std::vector<double> q0 = random_vec<double>(rng, 8), k0 = random_vec<double>(rng, 8);
  auto score = [&](int64_t pq, int64_t pk) {
    std::vector<double> q = q0, k = k0;
    rope_forward<double>({1, 1, pq, 1, 8, 8, 10000.0}, q.data());
    rope_forward<double>({1, 1, pk, 1, 8, 8, 10000.0}, k.data());
    double s = 0;
    for (int e = 0; e < 8; ++e) s += q[e] * k[e];
    return s;
  };
  EXPECT_NEAR(score(9, 4), score(1005, 1000), 1e-10);
  EXPECT_GT(std::abs(score(9, 4) - score(9, 0)), 1e-6);  // the distance does matter
}

TEST(Rope, BackwardIsTheTranspose) {
  Rng rng(fresh_seed());
  const RopeDims d{2, 4, 3, 2, 6, 4, 100.0};
  const size_t n = size_t(d.batch * d.len * d.heads * d.head_dim);
  const std::vector<double> x = random_vec<double>(rng, n), g = random_vec<double>(rng, n);
  std::vector<double> rx = x, rtg = g;
  rope_forward<double>(d, rx.data());
  rope_backward<double>(d, rtg.data());
  double lhs = 0, rhs = 0;  // <R x, g> == <x, R^T g>
  for (size_t i = 0; i < n; ++i) lhs += rx[i] * g[i], rhs += x[i] * rtg[i];
  EXPECT_NEAR(lhs, rhs, 1e-12 * std::abs(lhs) + 1e-14);
}

TEST(Rope, OddOrOversizedRotaryDimIsAnError) {
  std::vector<double> x(8);
  expect_error([&] { rope_forward<double>({1, 1, 0, 1, 8, 5, 1e4}, x.data()); }, "rotary_dim 5 must be even");
  expect_error([&] { rope_forward<double>({1, 1, 0, 1, 8, 10, 1e4}, x.data()); }, "<= head_dim 8");
}
