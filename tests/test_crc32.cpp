// CRC-32: the standard check value, a bit-at-a-time reference on random data, and that a
// running CRC over pieces equals the CRC of the whole.
#include <gtest/gtest.h>

#include "core/crc32.h"
#include "test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

// The definition: shift one bit at a time through the reflected polynomial.
static uint32_t crc32_bitwise(const std::vector<uint8_t>& data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (uint8_t byte : data) {
    crc ^= byte;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

TEST(Crc32, CheckValueAndEmpty) {
  EXPECT_EQ(crc32("123456789", 9), 0xCBF43926u);  // the catalogued check value of CRC-32/ISO-HDLC
  EXPECT_EQ(crc32("", 0), 0u);
}

TEST(Crc32, MatchesBitwiseReferenceAndRunsOverPieces) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<uint8_t> data(rng.below(5000));
    for (auto& b : data) b = static_cast<uint8_t>(rng.below(256));
    const uint32_t whole = crc32(data.data(), data.size());
    EXPECT_EQ(whole, crc32_bitwise(data));
    const size_t cut = data.empty() ? 0 : rng.below(data.size());
    EXPECT_EQ(crc32(data.data() + cut, data.size() - cut, crc32(data.data(), cut)), whole);
    if (!data.empty()) {  // any single flipped bit changes it
      data[rng.below(data.size())] ^= static_cast<uint8_t>(1u << rng.below(8));
      EXPECT_NE(crc32(data.data(), data.size()), whole);
    }
  }
}
