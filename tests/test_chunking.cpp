#include <gtest/gtest.h>

#include "core/error.h"
#include "pipeline/chunking.h"

using namespace stateflow;

TEST(Chunking, EvenLengthsDifferByAtMostOne) {
  for (int64_t T : {1, 7, 64, 100})
    for (int64_t n = 1; n <= T && n <= 17; ++n) {
      auto l = even_chunk_lengths(T, n);
      ASSERT_EQ(int64_t(l.size()), n);
      int64_t sum = 0, lo = T, hi = 0;
      for (int64_t x : l) sum += x, lo = std::min(lo, x), hi = std::max(hi, x);
      EXPECT_EQ(sum, T);
      EXPECT_LE(hi - lo, 1);
    }
}

TEST(Chunking, ErrorsNameTheProblem) {
  try {
    even_chunk_lengths(10, 11);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at most 10"), std::string::npos) << e.what();
  }
  try {
    validate_chunk_lengths({4, 4}, 10);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sum to 8"), std::string::npos) << e.what();
  }
  EXPECT_THROW(validate_chunk_lengths({5, 0, 5}, 10), Error);
  EXPECT_THROW(parse_chunk_lengths("3,x,4"), Error);
  EXPECT_THROW(parse_chunk_lengths("3,,4"), Error);
  EXPECT_EQ(parse_chunk_lengths("3,5,2"), (std::vector<int64_t>{3, 5, 2}));
  EXPECT_EQ(format_chunk_lengths({3, 5, 2}), "3,5,2");
}
