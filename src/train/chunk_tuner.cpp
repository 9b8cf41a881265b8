#include "train/chunk_tuner.h"

#include <algorithm>

#include "core/error.h"
#include "pipeline/chunking.h"

namespace stateflow {

ChunkTuner::ChunkTuner(AutoChunks auto_chunks, int rounds, double min_gain)
    : chosen_(std::move(auto_chunks)), space_(chosen_.space), rounds_left_(rounds), min_gain_(min_gain) {
  profiled_ = tuned_ = chosen_.costs.stage_costs(chosen_.space.model, chosen_.space.stages);
  for (int pass = 0; pass < 2; ++pass) rows_[pass].resize(profiled_.size()), values_[pass].resize(profiled_.size());
}

namespace {

// The linear and pair parts of a term set at one unit.
std::array<double, 3> parts(const CostTerms& t, double b, double s, double c) {
  return {t.fixed + t.per_token * b * s, t.per_pair * b * (c * s + s * s / 2), 0};
}

CostTerms scaled(const CostTerms& t, const std::array<double, 3>& f) {
  return {t.fixed * f[0], t.per_token * f[0], t.per_pair * f[1]};
}

}  // namespace

std::optional<TuningDecision> ChunkTuner::after_step(const PipelineStepResult& step,
                                                     const std::vector<int64_t>& lengths, Pipeline& pipe) {
  if (rounds_left_ <= 0) return std::nullopt;
  if (!warmed_up_) {
    warmed_up_ = true;  // first calls allocate and pick algorithms: not the run's speed
    return std::nullopt;
  }
  --rounds_left_;
  const int P = space_.stages, N = int(lengths.size());
  const double b = double(space_.batch / chosen_.plan.microbatches);
  // Mean forward and backward time of every (stage, chunk), over microbatches and processes.
  std::vector<std::vector<double>> mean[2];
  for (auto& m : mean) m.assign(size_t(P), std::vector<double>(size_t(N), 0));
  std::vector<std::vector<int>> count(size_t(P), std::vector<int>(size_t(N), 0));
  for (const StageStepResult& st : step.stages)
    for (const TimedAction& a : st.timeline) {
      if (!is_compute(a.action)) continue;
      mean[a.action.op == Op::Forward ? 0 : 1][size_t(a.action.stage)][size_t(a.action.chunk)] += a.end - a.start;
      if (a.action.op == Op::Forward) ++count[size_t(a.action.stage)][size_t(a.action.chunk)];
    }
  for (int r = 0; r < P; ++r)
    for (int k = 0; k < N; ++k)
      for (auto& m : mean) {
        const int n = count[size_t(r)][size_t(k)];
        m[size_t(r)][size_t(k)] = pipe.max_over_processes(n ? m[size_t(r)][size_t(k)] / n : 0.0);
      }
  // Refit each stage: forward first (recomputation runs it again inside the backward).
  for (int r = 0; r < P; ++r) {
    const PassCosts& prof = profiled_[size_t(r)];
    PassCosts& tuned = tuned_[size_t(r)];
    int64_t prefix = 0;
    for (int k = 0; k < N; ++k) {
      const double s = double(lengths[size_t(k)]), c = double(prefix);
      rows_[0][size_t(r)].push_back(parts(prof.forward, b, s, c));
      values_[0][size_t(r)].push_back(mean[0][size_t(r)][size_t(k)]);
      prefix += lengths[size_t(k)];
    }
    const unsigned forward_terms = prof.forward.per_pair > 0 ? 3u : 1u, backward_terms = prof.backward.per_pair > 0 ? 3u : 1u;
    tuned.forward = scaled(prof.forward, fit_nonnegative(rows_[0][size_t(r)], values_[0][size_t(r)], forward_terms));
    prefix = 0;
    for (int k = 0; k < N; ++k) {
      const double s = double(lengths[size_t(k)]), c = double(prefix);
      const double recomputed = chosen_.plan.recompute ? tuned.forward.at(b, s, c) : 0;
      rows_[1][size_t(r)].push_back(parts(prof.backward, b, s, c));
      values_[1][size_t(r)].push_back(std::max(0.0, mean[1][size_t(r)][size_t(k)] - recomputed));
      prefix += lengths[size_t(k)];
    }
    tuned.backward = scaled(prof.backward, fit_nonnegative(rows_[1][size_t(r)], values_[1][size_t(r)], backward_terms));
  }
  // What the profile cannot see: the time messages between stages add. The latency per
  // message that makes the simulator's step as long as the measured one (the makespan grows
  // with it), found by bisection.
  Plan current = chosen_.plan;
  current.chunk_lengths = lengths;
  space_.message_s = 0;
  predict_plan(chosen_.costs, tuned_, space_, current);
  if (P > 1 && step.makespan_s > current.step_s) {
    double lo = 0, hi = step.makespan_s;
    for (int i = 0; i < 50; ++i) {
      space_.message_s = (lo + hi) / 2;
      predict_plan(chosen_.costs, tuned_, space_, current);
      (current.step_s < step.makespan_s ? lo : hi) = space_.message_s;
    }
    space_.message_s = lo;
  }
  predict_plan(chosen_.costs, tuned_, space_, current);
  const std::vector<Plan> ranked = search_plans(chosen_.costs, tuned_, space_);
  TuningDecision d;
  d.message = cat("chunk tuning: step measured ", step.makespan_s, " s; costs refitted to this run, ",
                  space_.message_s * 1e3, " ms per message between stages; predicted ", current.step_s,
                  " s for the current chunks");
  if (ranked.empty() || !ranked.front().fits) return d;
  const Plan& best = ranked.front();
  const double gain = 1 - best.step_s / current.step_s;
  if (best.chunk_lengths != lengths && gain >= min_gain_) {
    d.chunk_lengths = best.chunk_lengths;
    d.message += cat("; switching to N ", best.chunks, ", alpha ", best.alpha, ", chunks ",
                     format_chunk_lengths(best.chunk_lengths), ": predicted ", best.step_s, " s (", 100 * gain,
                     " % faster)");
  } else {
    d.message += cat("; keeping them (the best partition, N ", best.chunks, " alpha ", best.alpha,
                     ", is predicted ", 100 * gain, " % faster; the threshold is ", 100 * min_gain_, " %)");
  }
  return d;
}

}  // namespace stateflow
