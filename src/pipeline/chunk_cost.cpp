#include "pipeline/chunk_cost.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "model/mixer.h"
#include "model/model.h"
#include "pipeline/partition.h"

namespace stateflow {

CostTerms& CostTerms::operator+=(const CostTerms& o) {
  fixed += o.fixed, per_token += o.per_token, per_pair += o.per_pair;
  return *this;
}

namespace {

// Weighted least squares over the regressors in `use` (a bit mask); false when singular.
bool solve_subset(const std::vector<std::array<double, 3>>& rows, const std::vector<double>& values, unsigned use,
                  std::array<double, 3>& coef) {
  std::array<int, 3> idx{};
  int k = 0;
  for (int j = 0; j < 3; ++j)
    if (use & (1u << j)) idx[k++] = j;
  // Normal equations of the rows scaled by 1/value (relative error).
  double A[3][4] = {};
  for (size_t n = 0; n < rows.size(); ++n) {
    const double w = values[n] > 0 ? 1 / values[n] : 1;
    for (int i = 0; i < k; ++i) {
      for (int j = 0; j < k; ++j) A[i][j] += w * w * rows[n][idx[i]] * rows[n][idx[j]];
      A[i][3] += w * w * rows[n][idx[i]] * values[n];
    }
  }
  // Gauss-Jordan with partial pivoting on the k x k system.
  for (int col = 0; col < k; ++col) {
    int pivot = col;
    for (int row = col + 1; row < k; ++row)
      if (std::abs(A[row][col]) > std::abs(A[pivot][col])) pivot = row;
    if (std::abs(A[pivot][col]) < 1e-300) return false;
    std::swap(A[pivot], A[col]);
    for (int row = 0; row < k; ++row) {
      if (row == col) continue;
      const double f = A[row][col] / A[col][col];
      for (int j = col; j < 4; ++j) A[row][j] -= f * A[col][j];
    }
  }
  coef = {0, 0, 0};
  for (int i = 0; i < k; ++i) coef[idx[i]] = A[i][3] / A[i][i];
  return true;
}

}  // namespace

std::array<double, 3> fit_nonnegative(const std::vector<std::array<double, 3>>& rows,
                                      const std::vector<double>& values, unsigned allowed) {
  std::array<double, 3> best{0, 0, 0};
  double best_residual = std::numeric_limits<double>::infinity();
  for (unsigned use = 1; use < 8; ++use) {
    if (use & ~allowed) continue;
    std::array<double, 3> coef;
    if (!solve_subset(rows, values, use, coef) || coef[0] < 0 || coef[1] < 0 || coef[2] < 0) continue;
    double residual = 0;
    for (size_t n = 0; n < rows.size(); ++n) {
      const double e = (coef[0] * rows[n][0] + coef[1] * rows[n][1] + coef[2] * rows[n][2] - values[n]) /
                       (values[n] > 0 ? values[n] : 1);
      residual += e * e;
    }
    if (residual < best_residual) best_residual = residual, best = coef;
  }
  return best;
}

namespace {

// fit_nonnegative on regressors(sample) of checked samples; `model` names the fit in errors.
template <class Regressors>
std::array<double, 3> fit_samples(const std::vector<CostSample>& samples, const char* model, unsigned allowed,
                                  Regressors regressors) {
  SF_CHECK(!samples.empty(), model, ": no samples to fit");
  std::vector<std::array<double, 3>> rows;
  std::vector<double> values;
  for (const CostSample& x : samples) {
    SF_CHECK(x.value >= 0 && x.s >= 1 && x.b >= 1 && x.c >= 0, model, ": a sample (b ", x.b, ", s ", x.s, ", c ", x.c,
             ") has value ", x.value, "; a measurement must be a number >= 0");
    rows.push_back(regressors(x));
    values.push_back(x.value);
  }
  return fit_nonnegative(rows, values, allowed);
}

}  // namespace

CostTerms fit_cost_terms(const std::vector<CostSample>& samples, bool with_pairs) {
  const std::array<double, 3> c = fit_samples(samples, "cost model", with_pairs ? 7u : 3u, [](const CostSample& x) {
    return std::array<double, 3>{1.0, x.b * x.s, x.b * (x.c * x.s + x.s * x.s / 2)};
  });
  return {c[0], c[1], c[2]};
}

WorkTerms fit_work_terms(const std::vector<CostSample>& samples) {
  const std::array<double, 3> c = fit_samples(samples, "memory model", 7u, [](const CostSample& x) {
    return std::array<double, 3>{1.0, x.b * x.s, x.b * x.c};
  });
  return {c[0], c[1], c[2]};
}

double PassCosts::forward_work_bytes(double b, double s, double c) const {
  double most = 0;
  for (const LayerWork& w : work) most = std::max(most, w.forward.at(b, s, c));
  return most;
}

double PassCosts::backward_work_bytes(double b, double s, double c, bool recompute) const {
  double most = 0;
  for (const LayerWork& w : work)
    most = std::max(most, recompute ? w.stash_bytes_per_token * b * s + std::max(w.forward.at(b, s, c), w.backward.at(b, s, c))
                                    : w.backward.at(b, s, c));
  return most;
}

std::vector<std::string> layer_kinds(const ModelConfig& m) {
  std::vector<std::string> out{"embedding"};
  for (char letter : m.blocks()) {
    out.push_back(mixer_for_letter(letter).name + "_block");
    out.push_back("mlp_block");
  }
  out.push_back("lm_head");
  return out;
}

std::vector<PassCosts> CostModel::stage_costs(const ModelConfig& m, int stages) const {
  const std::vector<std::string> kinds_of = layer_kinds(m);
  std::vector<PassCosts> out;
  for (auto [begin, end] : stage_layer_ranges(m, stages)) {
    PassCosts stage;
    std::vector<std::string> seen;  // a kind's working memory counts once per stage
    for (int i = begin; i < end; ++i) {
      auto it = kinds.find(kinds_of[i]);
      SF_CHECK(it != kinds.end(), "the cost profile has no layer of kind '", kinds_of[i],
               "': profile this model (its profile is of another model)");
      stage.forward += it->second.forward, stage.backward += it->second.backward;
      stage.stash_bytes_per_token += it->second.stash_bytes_per_token;
      if (std::find(seen.begin(), seen.end(), kinds_of[i]) == seen.end())
        seen.push_back(kinds_of[i]), stage.work.insert(stage.work.end(), it->second.work.begin(), it->second.work.end());
    }
    out.push_back(stage);
  }
  return out;
}

}  // namespace stateflow
