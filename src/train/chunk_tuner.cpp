#include "train/chunk_tuner.h"

#include <algorithm>

#include "core/error.h"
#include "pipeline/chunking.h"

namespace stateflow {

ChunkTuner::ChunkTuner(AutoChunks auto_chunks, int rounds, double min_gain)
    : plan_(std::move(auto_chunks.plan)),
      calibration_(std::move(auto_chunks.costs), std::move(auto_chunks.space)),
      rounds_left_(rounds),
      min_gain_(min_gain) {}

std::optional<TuningDecision> ChunkTuner::after_step(const PipelineStepResult& step,
                                                     const std::vector<int64_t>& lengths, Pipeline& pipe) {
  if (rounds_left_ <= 0) return std::nullopt;
  if (!warmed_up_) {
    warmed_up_ = true;  // first calls allocate and pick algorithms: not the run's speed
    return std::nullopt;
  }
  --rounds_left_;
  const int P = calibration_.space().stages, N = int(lengths.size());
  // Every process sees every stage's times (its own, the others' through the maximum).
  CostTable measured = mean_action_times(step.stages, P, N);
  for (auto* table : {&measured.forward_time, &measured.backward_time})
    for (auto& row : *table)
      for (double& t : row) t = pipe.max_over_processes(t);
  Plan current = plan_;
  current.chunk_lengths = lengths;
  calibration_.add(current, measured, step.makespan_s);
  calibration_.predict(current);
  const std::vector<Plan> ranked = search_plans(calibration_.costs(), calibration_.stages(), calibration_.space());
  TuningDecision d;
  d.message = cat("chunk tuning: step measured ", step.makespan_s, " s; costs refitted to this run, ",
                  calibration_.space().message_s * 1e3, " ms per message between stages; predicted ",
                  current.step_s, " s for the current chunks");
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
