#include "train/resume_options.h"

#include <nlohmann/json.hpp>

#include "train/checkpoint.h"

namespace stateflow {

using R = TrainOptions;

const std::vector<ResumeRule>& resume_rules() {
  static const std::string same_math =
      "the resumed weights and optimizer state were trained for this model in this precision";
  static const std::string same_data =
      "the data stream continues at the checkpoint's position, which counts batches or tokens of the checkpoint's "
      "data; change them only in a new run";
  static const std::vector<ResumeRule> rules = {
      // What the checkpoint's tensors are: checked again, field by field, when they are loaded.
      {{"--preset", "--config"}, OnResume::MustMatch, same_math, [](R& o, const R& g) { o.model = g.model; }},
      // Its blocks must match; its stage cuts may move (parameters are matched by name).
      {{"--pattern"}, OnResume::MustMatch, same_math, [](R& o, const R& g) { o.model.pattern = g.model.pattern; }},
      {{"--dtype"}, OnResume::MustMatch, same_math, [](R& o, const R& g) { o.dtype = g.dtype; }},
      {{"--data"}, OnResume::MustMatch, same_data, [](R& o, const R& g) { o.data.kind = g.data.kind; }},
      {{"--data-vocab"}, OnResume::MustMatch, same_data, [](R& o, const R& g) { o.data.vocab_size = g.data.vocab_size; }},
      {{"--data-seed"}, OnResume::MustMatch, same_data, [](R& o, const R& g) { o.data.seed = g.data.seed; }},
      {{"--recall-pairs"}, OnResume::MustMatch, same_data,
       [](R& o, const R& g) { o.data.recall.num_pairs = g.data.recall.num_pairs; }},
      {{"--recall-queries"}, OnResume::MustMatch, same_data,
       [](R& o, const R& g) { o.data.recall.num_queries = g.data.recall.num_queries; }},
      // The file may have moved since.
      {{"--data-path"}, OnResume::Applies, "", [](R& o, const R& g) { o.data.path = g.data.path; }},
      // Shape and schedule: parameters are matched by name, chunking does not change the math.
      {{"--stages"}, OnResume::Applies, "", [](R& o, const R& g) { o.stages = g.stages; }},
      {{"--microbatches"}, OnResume::Applies, "", [](R& o, const R& g) { o.microbatches = g.microbatches; }},
      {{"--bucket-mb"}, OnResume::Applies, "", [](R& o, const R& g) { o.bucket_mb = g.bucket_mb; }},
      {{"--chunks"}, OnResume::Applies, "", [](R& o, const R& g) { o.chunks = g.chunks, o.chunk_lengths.clear(); }},
      {{"--chunk-lengths"}, OnResume::Applies, "", [](R& o, const R& g) { o.chunk_lengths = g.chunk_lengths; }},
      {{"--schedule"}, OnResume::Applies, "", [](R& o, const R& g) { o.schedule = g.schedule; }},
      {{"--recompute"}, OnResume::Applies, "", [](R& o, const R& g) { o.recompute = g.recompute; }},
      {{"--batch"}, OnResume::Applies, "", [](R& o, const R& g) { o.batch = g.batch; }},
      {{"--seq-len"}, OnResume::Applies, "", [](R& o, const R& g) { o.seq_len = g.seq_len; }},
      // The learning-rate schedule and optimizer from the resumed step on.
      {{"--steps"}, OnResume::Applies, "", [](R& o, const R& g) { o.steps = g.steps; }},
      {{"--lr"}, OnResume::Applies, "", [](R& o, const R& g) { o.lr = g.lr; }},
      {{"--min-lr"}, OnResume::Applies, "", [](R& o, const R& g) { o.min_lr = g.min_lr; }},
      {{"--warmup"}, OnResume::Applies, "", [](R& o, const R& g) { o.warmup = g.warmup; }},
      {{"--weight-decay"}, OnResume::Applies, "", [](R& o, const R& g) { o.adamw.weight_decay = g.adamw.weight_decay; }},
      {{"--clip"}, OnResume::Applies, "", [](R& o, const R& g) { o.clip = g.clip; }},
      {{"--skip-nonfinite"}, OnResume::Applies, "", [](R& o, const R& g) { o.skip_nonfinite = g.skip_nonfinite; }},
      // Held-out evaluation: a run may start, stop or move it.
      {{"--eval-data"}, OnResume::Applies, "", [](R& o, const R& g) { o.eval_data.kind = g.eval_data.kind; }},
      {{"--eval-data-path"}, OnResume::Applies, "", [](R& o, const R& g) { o.eval_data.path = g.eval_data.path; }},
      {{"--eval-every"}, OnResume::Applies, "", [](R& o, const R& g) { o.eval_every = g.eval_every; }},
      {{"--eval-tokens"}, OnResume::Applies, "", [](R& o, const R& g) { o.eval_tokens = g.eval_tokens; }},
      // Output.
      {{"--log-every"}, OnResume::Applies, "", [](R& o, const R& g) { o.log_every = g.log_every; }},
      {{"--metrics"}, OnResume::Applies, "", [](R& o, const R& g) { o.metrics_path = g.metrics_path; }},
      {{"--save-dir"}, OnResume::Applies, "", [](R& o, const R& g) { o.save_dir = g.save_dir; }},
      {{"--save-every"}, OnResume::Applies, "", [](R& o, const R& g) { o.save_every = g.save_every; }},
      {{"--keep"}, OnResume::Applies, "", [](R& o, const R& g) { o.keep = g.keep; }},
      // Where this process runs and how it talks to its peers: the checkpoint has no say.
      {{"--device"}, OnResume::ThisRunOnly, "", [](R& o, const R& g) { o.device = g.device; }},
      {{"--transport"}, OnResume::ThisRunOnly, "", [](R& o, const R& g) { o.transport = g.transport; }},
      {{"--timeout"}, OnResume::ThisRunOnly, "", [](R& o, const R& g) { o.timeout_s = g.timeout_s; }},
      {{"--sm-split"}, OnResume::ThisRunOnly, "", [](R& o, const R& g) { o.split_sms = g.split_sms; }},
      // The replicas slice the same global batches: any count continues the run.
      {{"--data-parallel"}, OnResume::ThisRunOnly, "", [](R& o, const R& g) { o.data_parallel = g.data_parallel; }},
      {{"--trace"}, OnResume::ThisRunOnly, "", [](R& o, const R& g) { o.trace_path = g.trace_path; }},
      {{"--resume"}, OnResume::ThisRunOnly, "", [](R& o, const R& g) { o.resume = g.resume; }},
      // Handed to the launcher, not part of the options.
      {{"--rank", "--world-size", "--local-rank", "--rendezvous"}, OnResume::ThisRunOnly, "", [](R&, const R&) {}},
      // --chunks auto's search (refused with --resume; the chosen lengths are what a run keeps).
      {{"--chunk-multiple", "--profile-dir", "--cost-profile"}, OnResume::ThisRunOnly, "", [](R&, const R&) {}},
  };
  return rules;
}

const ResumeRule* find_resume_rule(const std::string& flag) {
  for (const ResumeRule& r : resume_rules())
    for (const std::string& f : r.flags)
      if (f == flag) return &r;
  return nullptr;
}

// "data_seed 3 vs 5, ...": the option fields in which a and b differ (the model's field by field,
// ignoring its name and stage cuts).
static std::string option_differences(const TrainOptions& a, const TrainOptions& b) {
  const nlohmann::json ja = a.to_json(), jb = b.to_json();
  std::string out;
  for (auto it = ja.begin(); it != ja.end(); ++it) {
    if (jb.at(it.key()) == *it) continue;
    const std::string d = it.key() == "model" ? model_differences(a.model, b.model)
                                              : cat(it.key(), " ", it->dump(), " vs ", jb.at(it.key()).dump());
    if (!d.empty()) out += (out.empty() ? "" : ", ") + d;
  }
  return out;
}

TrainOptions resumed_options(const TrainOptions& saved, const TrainOptions& given,
                             const std::set<std::string>& given_flags, const std::string& step_dir) {
  TrainOptions o = saved;
  for (const ResumeRule& r : resume_rules()) {
    std::string flag;
    for (const std::string& f : r.flags)
      if (given_flags.count(f)) flag = f;
    if (r.rule == OnResume::ThisRunOnly) {
      r.take(o, given);
    } else if (!flag.empty() && r.rule == OnResume::Applies) {
      r.take(o, given);
    } else if (!flag.empty()) {
      TrainOptions asked = o;
      r.take(asked, given);
      const std::string diff = option_differences(o, asked);
      SF_CHECK(diff.empty(), flag, " differs from the checkpoint's (checkpoint vs command line: ", diff, "): ", r.why,
               ". Leave ", flag, " out to use the checkpoint's (", step_dir, ")");
      o = asked;  // what may differ (a name, the stage cuts) is the command line's
    }
  }
  if (!given_flags.count("--save-dir")) o.save_dir = save_dir_of(step_dir);
  const bool new_chunking = given_flags.count("--chunks") || given_flags.count("--chunk-lengths");
  if (o.seq_len != saved.seq_len && !new_chunking && !saved.chunk_lengths.empty())
    o.chunks = int64_t(saved.chunk_lengths.size()), o.chunk_lengths.clear();
  return o;
}

}  // namespace stateflow
