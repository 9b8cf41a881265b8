// Rng::advance skips draws exactly: the state after advance(k) is the state after k draws, for
// counts below, at and above the state's 256 bits, and jumps compose (for counts too large to
// step through).
#include <gtest/gtest.h>

#include "core/rng.h"
#include "test_util.h"

using namespace stateflow;

TEST(Rng, AdvanceIsThatManyDraws) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE(seed);
  for (uint64_t k : {0ull, 1ull, 2ull, 63ull, 255ull, 256ull, 257ull, 1000ull, 123457ull}) {
    Rng stepped(seed), jumped(seed);
    for (uint64_t i = 0; i < k; ++i) stepped.next_u64();
    jumped.advance(k);
    EXPECT_EQ(jumped.state(), stepped.state()) << k << " draws";
    EXPECT_EQ(jumped.next_u64(), stepped.next_u64());
  }
}

TEST(Rng, AdvancesCompose) {
  const uint64_t seed = stateflow::testing::fresh_seed();
  SCOPED_TRACE(seed);
  const uint64_t a = (uint64_t(1) << 40) + 12345, b = (uint64_t(3) << 50) + 7;
  Rng once(seed), twice(seed);
  once.advance(a + b);
  twice.advance(a);
  twice.advance(b);
  EXPECT_EQ(once.state(), twice.state());
  Rng other(seed);
  other.advance(a + b + 1);
  EXPECT_NE(once.state(), other.state());
}
