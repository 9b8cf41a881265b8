#include "pipeline/chunk_partition.h"

#include <cmath>

#include "core/error.h"

namespace stateflow {

const std::vector<double>& partition_alphas() {
  static const std::vector<double> alphas{0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25};
  return alphas;
}

std::vector<double> equal_cuts(int64_t T, int N) {
  std::vector<double> cuts;
  for (int k = 1; k < N; ++k) cuts.push_back(double(T) * k / N);
  return cuts;
}

std::vector<double> balanced_cuts(const CostTerms& cost, double b, int64_t T, int N) {
  // The chunks' variable costs sum to per_token*b*T + per_pair*b*T^2/2 for any partition, so
  // each gets 1/N of it; chunk k's length solves (per_pair*b/2) s^2 + b (per_token + per_pair c) s = share.
  const double total = cost.per_token * b * double(T) + cost.per_pair * b * double(T) * double(T) / 2;
  if (total <= 0) return equal_cuts(T, N);
  const double share = total / N, qa = cost.per_pair * b / 2;
  std::vector<double> cuts;
  double c = 0;
  for (int k = 1; k < N; ++k) {
    const double qb = b * (cost.per_token + cost.per_pair * c);
    // The stable root of qa s^2 + qb s - share = 0 (s > 0).
    const double s = qa > 0 ? 2 * share / (qb + std::sqrt(qb * qb + 4 * qa * share)) : share / qb;
    cuts.push_back(c += s);
  }
  return cuts;
}

std::vector<int64_t> alpha_partition(const CostTerms& cost, double b, int64_t T, int N, double alpha,
                                     int64_t multiple) {
  SF_CHECK(N >= 1 && multiple >= 1, "chunk partition: need N >= 1 chunks and a multiple >= 1");
  SF_CHECK(int64_t(N) * multiple <= T, "cannot cut ", T, " tokens into ", N, " chunks of at least ", multiple,
           " tokens: use fewer chunks, a longer sequence, or a smaller --chunk-multiple (1: exact lengths)");
  const std::vector<double> eq = equal_cuts(T, N), bal = balanced_cuts(cost, b, T, N);
  std::vector<int64_t> lengths;
  int64_t prev = 0;
  for (int k = 0; k + 1 < N; ++k) {
    const double x = (1 - alpha) * eq[size_t(k)] + alpha * bal[size_t(k)];
    const int64_t cut = std::llround(x / double(multiple)) * multiple;
    if (cut - prev < multiple || T - cut < int64_t(N - 1 - k) * multiple) return {};
    lengths.push_back(cut - prev);
    prev = cut;
  }
  lengths.push_back(T - prev);
  return lengths;
}

std::vector<double> chunk_costs(const CostTerms& cost, double b, const std::vector<int64_t>& lengths) {
  std::vector<double> out;
  int64_t c = 0;
  for (int64_t s : lengths) {
    out.push_back(cost.at(b, double(s), double(c)));
    c += s;
  }
  return out;
}

}  // namespace stateflow
