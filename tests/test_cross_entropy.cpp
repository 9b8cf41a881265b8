#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "core/error.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernel_test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

constexpr int64_t kRows = 3 * 10, kVocab = 17;  // batch 3, len 10

// Targets in [0, vocab), about one in five ignored (-1).
std::vector<int32_t> random_targets(Rng& rng) {
  std::vector<int32_t> t(kRows);
  for (auto& id : t) id = rng.uniform() < 0.2 ? -1 : int32_t(rng.below(kVocab));
  return t;
}

// The definitions, in long double without the max shift (its exponent range holds e^1000):
// loss = log(sum_v e^l_v) - l_target, p_v = e^l_v / sum, argmax = first index of the max.
struct Reference {
  long double loss_sum = 0;
  int64_t correct = 0, counted = 0;
  std::vector<double> dlogits;
};

template <class T>
Reference reference(const std::vector<T>& logits, const std::vector<int32_t>& targets, double scale) {
  static_assert(std::numeric_limits<long double>::max_exponent > 2000, "the reference needs a wide long double");
  Reference ref;
  ref.dlogits.assign(logits.size(), 0.0);
  for (int64_t r = 0; r < kRows; ++r) {
    if (targets[r] == -1) continue;
    const T* l = &logits[r * kVocab];
    long double z = 0;
    T max = l[0];
    for (int64_t v = 0; v < kVocab; ++v) {
      z += std::exp((long double)l[v]);
      max = std::max(max, l[v]);
    }
    int64_t argmax = 0;
    while (l[argmax] != max) ++argmax;
    ref.loss_sum += std::log(z) - l[targets[r]];
    ref.correct += argmax == targets[r];
    ref.counted += 1;
    for (int64_t v = 0; v < kVocab; ++v)
      ref.dlogits[r * kVocab + v] = double(scale * (std::exp((long double)l[v]) / z - (v == targets[r])));
  }
  return ref;
}

template <class T>
void check_against_reference(double shift, double tol) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " shift " + std::to_string(shift));
  Rng rng(seed);
  auto logits = random_vec<double>(rng, kRows * kVocab, 3.0);
  for (auto& l : logits) l += shift;
  const auto lT = as<T>(logits);
  const auto targets = random_targets(rng);
  const double scale = rng.uniform(0.1, 2.0);
  const Reference ref = reference(lT, targets, scale);

  const LossStats s = cross_entropy_forward<T>(lT.data(), targets.data(), kRows, kVocab);
  EXPECT_LE(std::abs(s.loss_sum - double(ref.loss_sum)), tol * double(ref.loss_sum));
  EXPECT_EQ(s.correct, ref.correct);
  EXPECT_EQ(s.counted, ref.counted);

  std::vector<T> dlogits(kRows * kVocab, T(NAN));  // NaN: every entry must be written
  cross_entropy_backward<T>(lT.data(), targets.data(), T(scale), dlogits.data(), kRows, kVocab);
  EXPECT_LE(rel_err(dlogits, ref.dlogits), tol);
  for (int64_t r = 0; r < kRows; ++r) {
    if (targets[r] != -1) continue;
    for (int64_t v = 0; v < kVocab; ++v) ASSERT_EQ(dlogits[r * kVocab + v], T(0)) << "ignored row " << r;
  }
}

TEST(CrossEntropy, MatchesReference) {
  check_against_reference<double>(0.0, 1e-14);
  check_against_reference<float>(0.0, 1e-6);
}

// Logits near 1000 overflow exp() without the row-max shift, in float and in double.
TEST(CrossEntropy, StableForLargeLogits) {
  check_against_reference<double>(1000.0, 1e-13);
  check_against_reference<float>(1000.0, 1e-6);
}

TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  auto logits = random_vec<double>(rng, kRows * kVocab, 3.0);
  const auto targets = random_targets(rng);
  const double scale = rng.uniform(0.1, 2.0);
  std::vector<double> dlogits(logits.size());
  cross_entropy_backward<double>(logits.data(), targets.data(), scale, dlogits.data(), kRows, kVocab);
  auto loss = [&] {
    return scale * cross_entropy_forward<double>(logits.data(), targets.data(), kRows, kVocab).loss_sum;
  };
  EXPECT_LE(fd_error(loss, &logits, dlogits, rng), 1e-7);
}

// Integer logits in {0, 1, 2} tie often; the prediction is the first index of the maximum.
TEST(CrossEntropy, ArgmaxTiesPickFirstIndex) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  std::vector<float> logits(kRows * kVocab);
  for (auto& l : logits) l = float(rng.below(3));
  const auto targets = random_targets(rng);
  const LossStats s = cross_entropy_forward<float>(logits.data(), targets.data(), kRows, kVocab);
  EXPECT_EQ(s.correct, reference(logits, targets, 1.0).correct);

  const double row[4] = {1, 5, 5, 2};
  const int32_t first = 1, second = 2;
  EXPECT_EQ(cross_entropy_forward<double>(row, &first, 1, 4).correct, 1);
  EXPECT_EQ(cross_entropy_forward<double>(row, &second, 1, 4).correct, 0);
}

TEST(CrossEntropy, OutOfRangeTargetNamesTargetRowAndVocab) {
  Rng rng(fresh_seed());
  const auto logits = random_vec<double>(rng, kRows * kVocab);
  std::vector<double> dlogits(logits.size());
  for (int32_t bad : {int32_t(kVocab), int32_t(-2), int32_t(1 << 30)}) {
    auto targets = random_targets(rng);
    targets[4] = bad;
    const std::function<void()> passes[] = {
        [&] { cross_entropy_forward<double>(logits.data(), targets.data(), kRows, kVocab); },
        [&] { cross_entropy_backward<double>(logits.data(), targets.data(), 1.0, dlogits.data(), kRows, kVocab); }};
    for (const auto& pass : passes) {
      try {
        pass();
        ADD_FAILURE() << "target " << bad << " was accepted";
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("target " + std::to_string(bad)), std::string::npos) << msg;
        EXPECT_NE(msg.find("row 4"), std::string::npos) << msg;
        EXPECT_NE(msg.find("[0, 17)"), std::string::npos) << msg;
      }
    }
  }
}

}  // namespace
