// What `stateflow train --resume` does with each option given again on its command line
// (docs/checkpoints.md, "Resuming"). Every flag of the train command has exactly one rule
// here (the command refuses to start otherwise), so no option is ever silently dropped.
#pragma once
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "train/train_options.h"

namespace stateflow {

enum class OnResume {
  Applies,      // given: overrides the checkpoint's value from the resumed step on
  MustMatch,    // given: must equal the checkpoint's value (but for a model's name and stage
                // cuts, which apply), else the resume is refused
  ThisRunOnly,  // never taken from the checkpoint: where and how this process runs
};

struct ResumeRule {
  std::vector<std::string> flags;  // the command-line flags it covers, e.g. {"--preset", "--config"}
  OnResume rule;
  std::string why;  // MustMatch: why the checkpoint's value is the only one that fits
  // Copies the option's field(s) from the command line's options into the run's.
  std::function<void(TrainOptions& run, const TrainOptions& given)> take;
};

const std::vector<ResumeRule>& resume_rules();
// The rule for a flag ("--lr"), or nullptr.
const ResumeRule* find_resume_rule(const std::string& flag);

// The options of a run resumed from the checkpoint in step_dir, whose options were `saved`:
// the checkpoint's, with each flag in given_flags taken from `given` (Applies) or checked
// against the checkpoint's (MustMatch: an Error naming the flag, both values and why), and
// the ThisRunOnly options always `given`'s. New checkpoints go beside step_dir unless
// --save-dir is given. A new --seq-len without a new chunking keeps the number of chunks.
TrainOptions resumed_options(const TrainOptions& saved, const TrainOptions& given,
                             const std::set<std::string>& given_flags, const std::string& step_dir);

}  // namespace stateflow
