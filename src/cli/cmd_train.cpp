// `stateflow train`
#include <filesystem>
#include <iostream>
#include <new>
#include <optional>
#include <set>
#include <stdexcept>

#include "cli/commands.h"
#include "cli/common.h"
#include "train/checkpoint.h"
#include "train/resume_options.h"
#include "train/stop_signal.h"
#include "train/trainer.h"

namespace stateflow::cli {

// With --resume, every option not given on this command line is the checkpoint's, so that
// `stateflow train --resume DIR` continues the run as it was; each one given applies or is
// refused as train/resume_options.h says.
static TrainOptions resume_from_checkpoint(const CLI::App& app, const TrainOptions& given) {
  const std::string dir = find_checkpoint(given.resume);
  std::set<std::string> flags;
  for (const CLI::Option* opt : app.get_options())
    if (opt->count() && !opt->get_lnames().empty()) flags.insert("--" + opt->get_lnames()[0]);
  return resumed_options(TrainOptions::from_json(read_manifest(dir).state.options), given, flags, dir);
}

// A flag added to `train` without a resume rule would be silently dropped on --resume.
static void check_every_flag_has_a_resume_rule(const CLI::App& app) {
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->get_lnames().empty() || opt->get_lnames()[0] == "help") continue;
    if (!find_resume_rule("--" + opt->get_lnames()[0]))
      throw std::logic_error("train: --" + opt->get_lnames()[0] + " has no rule in train/resume_options.cpp");
  }
}

void add_train_command(CLI::App& root) {
  auto* app = root.add_subcommand(
      "train", "Train a model (default: the small preset on associative recall, 2 pipeline stages, CPU)");
  auto opts = std::make_shared<TrainOptions>();
  auto model = std::make_shared<ModelOptions>();
  auto data = std::make_shared<DataOptions>();
  auto pipe = std::make_shared<PipelineOptions>();
  pipe->stages = opts->stages, pipe->microbatches = int(opts->microbatches), pipe->chunks = opts->chunks;
  model->add(*app, "small", "f32");
  data->add(*app);
  pipe->add(*app);
  add_data_parallel_option(*app, opts->data_parallel);
  app->add_option("--bucket-mb", opts->bucket_mb,
                  "Data parallelism: gradients are summed over the replicas in buckets of this many MiB, each "
                  "started as soon as its layers' last backward is done")
      ->capture_default_str();
  app->add_option("--steps", opts->steps, "Optimizer steps (in all: a resumed run continues up to it)")
      ->capture_default_str();
  app->add_option("--batch", opts->batch, "Sequences per step")->capture_default_str();
  app->add_option("--seq-len", opts->seq_len, "Tokens per sequence")->capture_default_str();
  app->add_option("--lr", opts->lr, "Peak learning rate")->capture_default_str();
  app->add_option("--min-lr", opts->min_lr, "Learning rate at the end of the cosine decay")->capture_default_str();
  app->add_option("--warmup", opts->warmup, "Linear warmup steps")->capture_default_str();
  app->add_option("--weight-decay", opts->adamw.weight_decay, "AdamW decoupled weight decay (matrices only)")
      ->capture_default_str();
  app->add_option("--clip", opts->clip, "Clip the global gradient norm to this (0: off)")->capture_default_str();
  app->add_option("--log-every", opts->log_every, "Print progress every this many steps")->capture_default_str();
  app->add_option("--trace", opts->trace_path, "Write the last step's executed timeline as Chrome trace JSON");
  app->add_option("--metrics", opts->metrics_path, "Write one CSV line per step (step, loss, accuracy, ...) to this file");
  app->add_option("--save-dir", opts->save_dir,
                  "Save checkpoints into DIR/step-NNNNNN/ (at the end, on SIGINT/SIGTERM, and every --save-every "
                  "steps); see docs/checkpoints.md");
  app->add_option("--save-every", opts->save_every, "Save a checkpoint every this many steps (0: only at the end)")
      ->capture_default_str();
  app->add_option("--keep", opts->keep, "Keep the newest this many checkpoints (0: all)")->capture_default_str();
  app->add_option("--resume", opts->resume,
                  "Continue from a --save-dir (its newest complete checkpoint) or one step-NNNNNN directory; "
                  "options not given here are the checkpoint's");
  app->add_option("--eval-data", opts->eval_data.kind,
                  "Held-out data to evaluate on, of the kinds --data takes (recall: a stream the training "
                  "batches never draw); loss, perplexity and accuracy in the progress output and --metrics");
  app->add_option("--eval-data-path", opts->eval_data.path, "File for --eval-data text|tokens|tokens-u16|tokens-u32");
  app->add_option("--eval-every", opts->eval_every, "Evaluate every this many steps (0: only at the end)")
      ->capture_default_str();
  app->add_option("--eval-tokens", opts->eval_tokens,
                  "Tokens per evaluation: the first this many of --eval-data, in whole batches")
      ->capture_default_str();
  app->add_flag("--skip-nonfinite", opts->skip_nonfinite,
                "Skip steps whose loss or gradient is NaN/Inf (no update, a warning) instead of stopping");
  check_every_flag_has_a_resume_rule(*app);
  app->callback([=]() {
    TrainOptions o = *opts;
    apply_common_options(o, *model, *data, *pipe);
    o.schedule = pipe->schedule;
    std::optional<AutoChunks> chosen;
    if (pipe->chunks_auto) {
      SF_CHECK(o.resume.empty(), "--chunks auto with --resume: give the resumed run's chunks (--chunks N or "
                                 "--chunk-lengths; its log names the tuned ones)");
      SF_CHECK(pipe->chunk_lengths.empty(), "--chunks auto and --chunk-lengths both choose the chunks: give one");
      const double memory = o.device == Device::CPU ? 0 : 141.0 * double(int64_t(1) << 30);
      chosen = choose_chunks(
          pipe->auto_chunk_space(o.model, o.dtype, o.device, o.batch, o.seq_len, o.recompute, memory),
          pipe->profile_dir.empty() ? default_profile_dir() : pipe->profile_dir, std::cout, pipe->cost_profile);
      o.chunk_lengths = chosen->plan.chunk_lengths;
    } else if (o.resume.empty()) {
      o.chunk_lengths = pipe->resolve_chunks(o.seq_len);
    } else {
      o.chunks = pipe->chunks, o.chunk_lengths = pipe->given_chunk_lengths();
      o = resume_from_checkpoint(*app, o);
    }
    install_stop_handlers();
    try {
      Trainer trainer(o);
      if (chosen) trainer.enable_chunk_tuning(*chosen);
      trainer.run(std::cout);
      if (int sig = trainer.stopped_by()) throw ExitCode(128 + sig);
    } catch (const std::bad_alloc&) {
      fail("out of host memory: use a smaller --batch or --seq-len, more chunks (--chunks), or a smaller model");
    }
  });
}

}  // namespace stateflow::cli
