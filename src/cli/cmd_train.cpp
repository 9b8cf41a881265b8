// `stateflow train`
#include <filesystem>
#include <iostream>
#include <new>

#include "cli/commands.h"
#include "cli/common.h"
#include "train/checkpoint.h"
#include "train/stop_signal.h"
#include "train/trainer.h"

namespace stateflow::cli {

// With --resume, every option not given on this command line is the checkpoint's, so that
// `stateflow train --resume DIR` continues the run as it was. Where it runs (--device), how
// stages talk (--transport, --timeout) and --trace always come from this command line.
static TrainOptions resumed_options(const CLI::App& app, const TrainOptions& given) {
  const std::string dir = find_checkpoint(given.resume);
  TrainOptions o = TrainOptions::from_json(read_manifest(dir).state.options);
  auto keep_given = [&](std::initializer_list<const char*> flags, auto& field, const auto& value) {
    for (const char* f : flags)
      if (app.count(f)) field = value;
  };
  keep_given({"--preset", "--config"}, o.model, given.model);
  keep_given({"--dtype"}, o.dtype, given.dtype);
  keep_given({"--data"}, o.data.kind, given.data.kind);
  keep_given({"--data-path"}, o.data.path, given.data.path);
  keep_given({"--data-vocab"}, o.data.vocab_size, given.data.vocab_size);
  keep_given({"--data-seed"}, o.data.seed, given.data.seed);
  keep_given({"--recall-pairs"}, o.data.recall.num_pairs, given.data.recall.num_pairs);
  keep_given({"--recall-queries"}, o.data.recall.num_queries, given.data.recall.num_queries);
  keep_given({"--steps"}, o.steps, given.steps);
  keep_given({"--batch"}, o.batch, given.batch);
  keep_given({"--seq-len"}, o.seq_len, given.seq_len);
  keep_given({"--stages"}, o.stages, given.stages);
  keep_given({"--microbatches"}, o.microbatches, given.microbatches);
  keep_given({"--bucket-mb"}, o.bucket_mb, given.bucket_mb);
  keep_given({"--schedule"}, o.schedule, given.schedule);
  keep_given({"--lr"}, o.lr, given.lr);
  keep_given({"--min-lr"}, o.min_lr, given.min_lr);
  keep_given({"--warmup"}, o.warmup, given.warmup);
  keep_given({"--weight-decay"}, o.adamw.weight_decay, given.adamw.weight_decay);
  keep_given({"--clip"}, o.clip, given.clip);
  keep_given({"--log-every"}, o.log_every, given.log_every);
  keep_given({"--save-every"}, o.save_every, given.save_every);
  keep_given({"--keep"}, o.keep, given.keep);
  keep_given({"--skip-nonfinite"}, o.skip_nonfinite, given.skip_nonfinite);
  // Keep saving beside the checkpoint resumed from, wherever that directory is now.
  o.save_dir = app.count("--save-dir") ? given.save_dir : std::filesystem::path(dir).parent_path().string();
  o.device = given.device, o.transport = given.transport, o.timeout_s = given.timeout_s;
  o.data_parallel = given.data_parallel;  // may change: the replicas slice the same global batches
  o.trace_path = given.trace_path;
  o.resume = given.resume;
  return o;
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
  app->add_flag("--skip-nonfinite", opts->skip_nonfinite,
                "Skip steps whose loss or gradient is NaN/Inf (no update, a warning) instead of stopping");
  app->callback([=]() {
    TrainOptions o = *opts;
    apply_common_options(o, *model, *data, *pipe);
    o.schedule = pipe->schedule;
    if (!o.resume.empty()) o = resumed_options(*app, o);
    if (o.resume.empty() || app->count("--chunks") || app->count("--chunk-lengths"))
      o.chunk_lengths = pipe->resolve_chunks(o.seq_len);
    install_stop_handlers();
    try {
      Trainer trainer(o);
      trainer.run(std::cout);
      if (int sig = trainer.stopped_by()) throw ExitCode(128 + sig);
    } catch (const std::bad_alloc&) {
      fail("out of host memory: use a smaller --batch or --seq-len, more chunks (--chunks), or a smaller model");
    }
  });
}

}  // namespace stateflow::cli
