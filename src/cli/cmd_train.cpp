// `stateflow train`
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "train/trainer.h"

namespace stateflow::cli {

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
  app->add_option("--steps", opts->steps, "Optimizer steps")->capture_default_str();
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
  app->callback([=]() {
    TrainOptions o = *opts;
    o.model = model->resolve();
    o.dtype = parse_dtype(model->dtype);
    o.device = model->resolve_device();
    o.data = data->data;
    o.stages = pipe->stages, o.microbatches = pipe->microbatches, o.schedule = pipe->schedule;
    o.transport = pipe->transport, o.timeout_s = pipe->timeout_s, o.recompute = pipe->recompute_full();
    o.chunk_lengths = pipe->resolve_chunks(o.seq_len);
    Trainer trainer(o);
    trainer.run(std::cout);
  });
}

}  // namespace stateflow::cli
