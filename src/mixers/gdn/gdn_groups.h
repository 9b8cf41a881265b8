// Grouped value heads in Gated DeltaNet (MATH.md section 2, "GVA"): HV = group x H value heads,
// value head j reading query/key head j / group (Qwen3-Next's and fla's order: each q/k head's
// value heads are consecutive). The core runs per value head, so the layer hands it a copy of
// q and k per value head and sums their gradients back over each group.
//
//   expand:  x [rows, heads, d]          ->  y [rows, heads * group, d],  y[r, h*group + j] = x[r, h]
//   sum:     dy [rows, heads * group, d]  ->  dx [rows, heads, d],  dx[r, h] = sum_j dy[r, h*group + j],
//            added j = 0, 1, ... in that order (per token: chunk-invariant, the same bits every run)
// Outputs are overwritten.
#pragma once
#include <cstdint>

namespace stateflow {

template <class T>
void gdn_expand_groups(const T* x, T* y, int64_t rows, int64_t heads, int64_t group, int64_t d);
template <class T>
void gdn_sum_groups(const T* dy, T* dx, int64_t rows, int64_t heads, int64_t group, int64_t d);

}  // namespace stateflow
