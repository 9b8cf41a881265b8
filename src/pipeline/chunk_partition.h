// Chunk partitions priced by the cost model (chunk_cost.h): equal chunks, cost-balanced chunks
// (every chunk the same predicted cost: attention makes late chunks dearer, so they get
// shorter), and the family between and beyond them,
//
//   cut_k(alpha) = (1 - alpha) * cut_k(equal) + alpha * cut_k(balanced),
//
// then rounded to a token multiple: 2048 keeps the GPU's chunked step bitwise equal to the
// unchunked one (kWeightGradTokens), a kernel's inner block keeps its tiles full, 1 is exact.
#pragma once
#include <cstdint>
#include <vector>

#include "pipeline/chunk_cost.h"

namespace stateflow {

// The alphas the planner tries (0 = equal, 1 = balanced, 1.25 = beyond balanced).
const std::vector<double>& partition_alphas();

// Cut positions (N - 1 of them, strictly increasing, in (0, T)) before rounding: equal, and
// balanced for a unit cost of `cost` with b sequences (the fixed term does not move them).
std::vector<double> equal_cuts(int64_t T, int N);
std::vector<double> balanced_cuts(const CostTerms& cost, double b, int64_t T, int N);

// The chunk lengths for alpha, cuts rounded to multiples of `multiple` (the last chunk takes
// what is left when T is not a multiple). Empty when this alpha has no valid partition (cuts
// out of order past balanced, or two cuts rounding onto each other). Throws Error naming the
// fix when N chunks of `multiple` tokens do not fit in T.
std::vector<int64_t> alpha_partition(const CostTerms& cost, double b, int64_t T, int N, double alpha,
                                     int64_t multiple);

// Predicted cost of every chunk of a partition.
std::vector<double> chunk_costs(const CostTerms& cost, double b, const std::vector<int64_t>& lengths);

}  // namespace stateflow
