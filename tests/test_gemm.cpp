#include <gtest/gtest.h>

#include <random>

#include "core/rng.h"
#include "kernels/cpu/gemm.h"

using namespace stateflow;

template <class T>
static void check_gemm(bool ta, bool tb, double tol) {
  Rng rng(std::random_device{}());
  const int64_t M = 37, N = 29, K = 41;
  std::vector<T> A(M * K), B(K * N), C(M * N), R(M * N);
  for (auto& a : A) a = rng.normal();
  for (auto& b : B) b = rng.normal();
  for (int64_t i = 0; i < M * N; ++i) C[i] = R[i] = rng.normal();
  int64_t lda = ta ? M : K, ldb = tb ? K : N;
  gemm<T>(ta, tb, M, N, K, T(0.7), A.data(), lda, B.data(), ldb, T(0.3), C.data(), N);
  gemm_reference<T>(ta, tb, M, N, K, T(0.7), A.data(), lda, B.data(), ldb, T(0.3), R.data(), N);
  double worst = 0, ref = 0;
  for (int64_t i = 0; i < M * N; ++i) {
    worst = std::max(worst, std::abs(double(C[i] - R[i])));
    ref = std::max(ref, std::abs(double(R[i])));
  }
  EXPECT_LE(worst / ref, tol) << "trans_a=" << ta << " trans_b=" << tb;
}

TEST(Gemm, MatchesReferenceF64) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) check_gemm<double>(ta, tb, 1e-13);
}

TEST(Gemm, MatchesReferenceF32) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) check_gemm<float>(ta, tb, 1e-5);
}
