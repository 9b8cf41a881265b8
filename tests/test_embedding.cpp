#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "kernels/cpu/embedding.h"
#include "kernel_test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

constexpr int64_t kRows = 3 * 9, kDim = 6, kVocab = 13;  // batch 3, len 9: ids repeat

std::vector<int32_t> random_tokens(Rng& rng) {
  std::vector<int32_t> t(kRows);
  for (auto& id : t) id = int32_t(rng.below(kVocab));
  return t;
}

template <class T>
void check_forward() {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  auto tokens = random_tokens(rng);
  auto table = random_vec<T>(rng, kVocab * kDim);
  std::vector<T> out(kRows * kDim, T(NAN));
  embedding_forward<T>(tokens.data(), table.data(), out.data(), kRows, kDim, kVocab);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t i = 0; i < kDim; ++i) ASSERT_EQ(out[r * kDim + i], table[tokens[r] * kDim + i]) << r << "," << i;
}

TEST(Embedding, ForwardGathersRows) {
  check_forward<double>();
  check_forward<float>();
}

// Backward adds into dtable: start from non-zero values and let ids repeat.
template <class T>
void check_backward() {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  auto tokens = random_tokens(rng);
  auto dout = random_vec<T>(rng, kRows * kDim);
  auto dtable = random_vec<T>(rng, kVocab * kDim);
  std::vector<double> ref(dtable.begin(), dtable.end());
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t i = 0; i < kDim; ++i) ref[tokens[r] * kDim + i] += double(dout[r * kDim + i]);
  embedding_backward<T>(tokens.data(), dout.data(), dtable.data(), kRows, kDim);
  EXPECT_LE(rel_err(dtable, ref), sizeof(T) == 8 ? 1e-15 : 1e-6);
}

TEST(Embedding, BackwardScatterAddsRows) {
  check_backward<double>();
  check_backward<float>();
}

TEST(Embedding, BackwardMatchesFiniteDifferences) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  auto tokens = random_tokens(rng);
  auto table = random_vec<double>(rng, kVocab * kDim);
  auto dout = random_vec<double>(rng, kRows * kDim);
  std::vector<double> dtable(kVocab * kDim, 0.0);
  embedding_backward<double>(tokens.data(), dout.data(), dtable.data(), kRows, kDim);
  auto loss = [&] {
    std::vector<double> out(kRows * kDim);
    embedding_forward<double>(tokens.data(), table.data(), out.data(), kRows, kDim, kVocab);
    double l = 0;
    for (size_t i = 0; i < out.size(); ++i) l += out[i] * dout[i];
    return l;
  };
  EXPECT_LE(fd_error(loss, &table, dtable, rng), 1e-7);
}

TEST(Embedding, OutOfRangeTokenNamesIdPositionAndVocab) {
  Rng rng(fresh_seed());
  auto table = random_vec<float>(rng, kVocab * kDim);
  std::vector<float> out(kRows * kDim);
  for (int32_t bad : {int32_t(kVocab), int32_t(-1), int32_t(1000000)}) {
    auto tokens = random_tokens(rng);
    tokens[5] = bad;
    try {
      embedding_forward<float>(tokens.data(), table.data(), out.data(), kRows, kDim, kVocab);
      ADD_FAILURE() << "token id " << bad << " was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("token id " + std::to_string(bad)), std::string::npos) << msg;
      EXPECT_NE(msg.find("position 5"), std::string::npos) << msg;
      EXPECT_NE(msg.find("[0, 13)"), std::string::npos) << msg;
    }
  }
}

}  // namespace
