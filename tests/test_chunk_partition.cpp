#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "pipeline/chunk_partition.h"
#include "test_util.h"

using namespace stateflow;
using stateflow::testing::fresh_seed;

namespace {

int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t(0)); }

// A hybrid's unit cost: linear work plus attention pairs that dominate at long prefixes.
const CostTerms kHybrid{1e-4, 1e-7, 4e-11};

}  // namespace

TEST(ChunkPartition, EqualIsAlphaZero) {
  EXPECT_EQ(alpha_partition(kHybrid, 1, 1024, 4, 0, 1), (std::vector<int64_t>{256, 256, 256, 256}));
  EXPECT_EQ(alpha_partition(kHybrid, 1, 1000, 3, 0, 1), (std::vector<int64_t>{333, 334, 333}));
  EXPECT_EQ(alpha_partition(kHybrid, 1, 100, 1, 0.7, 64), (std::vector<int64_t>{100}));
}

// Balanced chunks (exact lengths) cost the same within what rounding to whole tokens moves:
// at most one token's cost either side of the cut, per chunk.
TEST(ChunkPartition, BalancedHasEqualPredictedCost) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(cat("seed ", seed));
  Rng rng(seed);
  for (int trial = 0; trial < 30; ++trial) {
    const CostTerms cost{1e-4 * rng.uniform(), 1e-7 * (0.1 + rng.uniform()), 1e-10 * rng.uniform()};
    const double b = 1 + trial % 4;
    const int64_t T = 4096 + int64_t(rng.uniform() * 60000);
    const int N = 2 + trial % 15;
    const std::vector<int64_t> l = alpha_partition(cost, b, T, N, 1.0, 1);
    ASSERT_EQ(int(l.size()), N);
    EXPECT_EQ(sum(l), T);
    const std::vector<double> c = chunk_costs(cost, b, l);
    const auto [lo, hi] = std::minmax_element(c.begin(), c.end());
    // One token at the end of the sequence costs the most: b (per_token + per_pair T).
    const double token = b * (cost.per_token + cost.per_pair * double(T));
    EXPECT_LE(*hi - *lo, 2 * token) << "N " << N << " T " << T;
    // Later chunks are never longer: their prefix only adds cost.
    for (int k = 1; k < N; ++k) EXPECT_LE(l[size_t(k)], l[size_t(k - 1)] + 1);
  }
}

TEST(ChunkPartition, AlphaMovesCutsLinearlyAndRounds) {
  const int64_t T = 65536;
  const int N = 8;
  const std::vector<double> eq = equal_cuts(T, N), bal = balanced_cuts(kHybrid, 1, T, N);
  for (double alpha : partition_alphas()) {
    SCOPED_TRACE(cat("alpha ", alpha));
    for (int64_t multiple : {int64_t(1), int64_t(64), int64_t(2048)}) {
      const std::vector<int64_t> l = alpha_partition(kHybrid, 1, T, N, alpha, multiple);
      if (l.empty()) continue;  // past balanced the cuts may cross
      ASSERT_EQ(int(l.size()), N);
      EXPECT_EQ(sum(l), T);
      int64_t cut = 0;
      for (int k = 0; k + 1 < N; ++k) {
        cut += l[size_t(k)];
        EXPECT_EQ(cut % multiple, 0);
        const double exact = (1 - alpha) * eq[size_t(k)] + alpha * bal[size_t(k)];
        EXPECT_LE(std::abs(double(cut) - exact), double(multiple) / 2 + 1e-6);
      }
      for (int64_t s : l) EXPECT_GE(s, multiple);
    }
  }
  // Balanced chunks of a hybrid shrink along the sequence.
  const std::vector<int64_t> balanced = alpha_partition(kHybrid, 1, T, N, 1.0, 2048);
  EXPECT_GT(balanced.front(), balanced.back());
}

TEST(ChunkPartition, TooManyChunksForTheMultipleIsAnError) {
  EXPECT_THROW(alpha_partition(kHybrid, 1, 4096, 3, 0.5, 2048), Error);
  try {
    alpha_partition(kHybrid, 1, 4096, 3, 0.5, 2048);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--chunk-multiple"), std::string::npos) << e.what();
  }
}

// Far past balanced, the cuts cross: that alpha has no partition, and says so by being empty.
TEST(ChunkPartition, CrossingCutsGiveNoPartition) {
  const CostTerms steep{0, 1e-9, 1e-7};
  EXPECT_TRUE(alpha_partition(steep, 1, 4096, 16, 5.0, 1).empty());
}
