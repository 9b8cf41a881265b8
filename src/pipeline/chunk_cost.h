// The chunk cost model (MATH.md section 9, docs/design.md "The chunk cost model"): the time of
// one layer's forward or backward on one unit of b sequences, chunk length s and prefix c
// (the chunk's first token),
//
//   t(s, c) = fixed + per_token * b*s + per_pair * b*(c*s + s*s/2)
//
// fixed: per-call overheads (launches, small reductions); per_token: everything linear in the
// tokens (projections, MLP, recurrent cores); per_pair: attention's query-key pairs, which
// grow with the prefix. A stage's cost is the sum of its layers' terms (the terms are linear),
// so costs profiled once per layer kind price any pipeline depth and any partition.
#pragma once
#include <array>
#include <map>
#include <string>
#include <vector>

#include "model/config.h"

namespace stateflow {

struct CostTerms {
  double fixed = 0, per_token = 0, per_pair = 0;
  // b: sequences of the unit, s: chunk length, c: prefix length.
  double at(double b, double s, double c) const { return fixed + per_token * b * s + per_pair * b * (c * s + s * s / 2); }
  CostTerms& operator+=(const CostTerms& o);
  CostTerms scaled(double f) const { return {fixed * f, per_token * f, per_pair * f}; }
};

// One measured call: its unit's shape and what it took.
struct CostSample {
  double b = 1, s = 0, c = 0, value = 0;
};

// Least squares of values ~ sum_j coef_j * rows[i][j] in relative error (row i weighs
// values[i]^-1), every coef >= 0: the best fit over the subsets of the regressors in `allowed`
// (bit j: regressor j) whose unconstrained solution is non-negative. Regressors outside
// `allowed` get 0.
std::array<double, 3> fit_nonnegative(const std::vector<std::array<double, 3>>& rows,
                                      const std::vector<double>& values, unsigned allowed);

// fit_nonnegative on the regressors (1, b*s, b*(c*s + s*s/2)): (each sample weighs value^-1, so short chunks' overheads
// count as much as long chunks' time), every term >= 0 (the best fit over the subsets of terms
// whose unconstrained solution is non-negative). with_pairs false keeps per_pair = 0 (layers
// whose cost does not grow with the prefix). Throws Error without samples or with a value < 0.
CostTerms fit_cost_terms(const std::vector<CostSample>& samples, bool with_pairs);

// Transient working memory of one layer call: the bytes it holds above what the stage holds
// before and after it (GEMM outputs before they are stashed, kernel workspaces, attention's
// row statistics, gradients on their way), on a unit of b sequences, chunk length s, prefix c.
struct WorkTerms {
  double fixed = 0, per_token = 0, per_prefix = 0;
  double at(double b, double s, double c) const { return fixed + per_token * b * s + per_prefix * b * c; }
};

// fit_nonnegative on the regressors (1, b*s, b*c); samples' values are bytes. Throws Error
// without samples or with a value < 0.
WorkTerms fit_work_terms(const std::vector<CostSample>& samples);

// One layer kind's working memory per pass and its stash (recomputation holds one layer's
// stash on top of its backward's working memory).
struct LayerWork {
  WorkTerms forward, backward;
  double stash_bytes_per_token = 0;
};

// A layer kind's forward and backward (backward alone: under --recompute the forward runs again),
// or a stage's: its layers' times summed.
struct PassCosts {
  CostTerms forward, backward;
  double stash_bytes_per_token = 0;  // what a unit's forward keeps for its backward, per b*s
  // Working memory: one entry per layer kind (a stage's layers run one at a time, so its
  // working memory is the largest of its kinds').
  std::vector<LayerWork> work;
  // The largest working memory of a forward or backward (with recompute: the recomputed layer's
  // stash and the larger of its two passes) at a unit of b sequences, chunk length s, prefix c.
  double forward_work_bytes(double b, double s, double c) const;
  double backward_work_bytes(double b, double s, double c, bool recompute) const;
};

// Per layer kind (Layer::kind(): "embedding", "gdn_block", "mlp_block", "attention_block",
// "lm_head", ...), as profiled on one device.
struct CostModel {
  std::map<std::string, PassCosts> kinds;
  double resident_bytes_per_parameter = 0;  // weights, grads, optimizer state (and GPU copies)
  double input_bytes_per_value = 4;         // a layer input's element (recomputation keeps them)

  // Each stage's summed terms (stages cut as the pipeline cuts them). Throws Error naming a
  // layer kind that was not profiled.
  std::vector<PassCosts> stage_costs(const ModelConfig& m, int stages) const;
};

// The kind of every layer of a model, in the model's flat order (model.h: embedding, then a
// mixer block and an MLP block per letter of the pattern, then the LM head).
std::vector<std::string> layer_kinds(const ModelConfig& m);

}  // namespace stateflow
