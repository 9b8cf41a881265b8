#include "train/cost_calibration.h"

#include <algorithm>

namespace stateflow {

namespace {

// The linear and pair parts of a term set at one unit.
std::array<double, 3> parts(const CostTerms& t, double b, double s, double c) {
  return {t.fixed + t.per_token * b * s, t.per_pair * b * (c * s + s * s / 2), 0};
}

CostTerms scaled(const CostTerms& t, const std::array<double, 3>& f) {
  return {t.fixed * f[0], t.per_token * f[0], t.per_pair * f[1]};
}

}  // namespace

CostCalibration::CostCalibration(CostModel costs, PlanSpace space)
    : costs_(std::move(costs)), space_(std::move(space)) {
  profiled_ = tuned_ = costs_.stage_costs(space_.model, space_.stages);
  for (int pass = 0; pass < 2; ++pass) rows_[pass].resize(profiled_.size()), values_[pass].resize(profiled_.size());
}

void CostCalibration::add(const Plan& p, const CostTable& measured, double step_s) {
  const int P = space_.stages, N = int(p.chunk_lengths.size());
  const double b = double(space_.batch / p.microbatches);
  // Forward first: recomputation runs it again inside the backward.
  for (int pass = 0; pass < 2; ++pass)
    for (int r = 0; r < P; ++r) {
      const PassCosts& prof = profiled_[size_t(r)];
      PassCosts& tuned = tuned_[size_t(r)];
      const CostTerms& terms = pass == 0 ? prof.forward : prof.backward;
      int64_t prefix = 0;
      for (int k = 0; k < N; ++k) {
        const double s = double(p.chunk_lengths[size_t(k)]), c = double(prefix);
        const double recomputed = pass == 1 && p.recompute ? tuned.forward.at(b, s, c) : 0;
        const double t = (pass == 0 ? measured.forward_time : measured.backward_time)[size_t(r)][size_t(k)];
        rows_[pass][size_t(r)].push_back(parts(terms, b, s, c));
        values_[pass][size_t(r)].push_back(std::max(0.0, t - recomputed));
        prefix += p.chunk_lengths[size_t(k)];
      }
      const std::array<double, 3> f =
          fit_nonnegative(rows_[pass][size_t(r)], values_[pass][size_t(r)], terms.per_pair > 0 ? 3u : 1u);
      (pass == 0 ? tuned.forward : tuned.backward) = scaled(terms, f);
    }
  Plan q = p;
  space_.message_s = 0;
  predict(q);
  if (space_.shared_device) {
    // Stages sharing a device time each other's work into their actions (their kernels
    // interleave on its stream): keep the fitted shape, scale it to the measured step.
    if (q.step_s > 0 && step_s > 0)
      for (PassCosts& t : tuned_) t.forward = t.forward.scaled(step_s / q.step_s), t.backward = t.backward.scaled(step_s / q.step_s);
    return;
  }
  if (P > 1 && step_s > q.step_s) {
    double lo = 0, hi = step_s;
    for (int i = 0; i < 50; ++i) {
      space_.message_s = (lo + hi) / 2;
      predict(q);
      (q.step_s < step_s ? lo : hi) = space_.message_s;
    }
    space_.message_s = lo;
  }
}

CostTable mean_action_times(const std::vector<StageStepResult>& stages, int P, int N) {
  CostTable t;
  t.forward_time.assign(size_t(P), std::vector<double>(size_t(N), 0));
  t.backward_time.assign(size_t(P), std::vector<double>(size_t(N), 0));
  std::vector<std::vector<int>> count(size_t(P), std::vector<int>(size_t(N), 0));
  for (const StageStepResult& st : stages)
    for (const TimedAction& a : st.timeline) {
      if (!is_compute(a.action)) continue;
      const size_t r = size_t(a.action.stage), k = size_t(a.action.chunk);
      (a.action.op == Op::Forward ? t.forward_time : t.backward_time)[r][k] += a.end - a.start;
      if (a.action.op == Op::Forward) ++count[r][k];
    }
  for (int r = 0; r < P; ++r)
    for (int k = 0; k < N; ++k)
      if (const int n = count[size_t(r)][size_t(k)]) {
        t.forward_time[size_t(r)][size_t(k)] /= n;
        t.backward_time[size_t(r)][size_t(k)] /= n;
      }
  return t;
}

}  // namespace stateflow
