// `stateflow bench`
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "cli/common.h"
#include "train/bench.h"

namespace stateflow::cli {

void add_bench_command(CLI::App& root) {
  auto* app = root.add_subcommand(
      "bench", "Run schedules side by side on the same model and batches: tokens/s, peak memory per stage, bubble");
  auto opts = std::make_shared<BenchOptions>();
  auto model = std::make_shared<ModelOptions>();
  auto data = std::make_shared<DataOptions>();
  auto pipe = std::make_shared<PipelineOptions>();
  auto schedules = std::make_shared<std::string>("1f1b,stateflow");
  auto json = std::make_shared<std::string>();
  pipe->stages = opts->stages, pipe->microbatches = opts->microbatches, pipe->chunks = 8;
  model->add(*app, "small", "f32");
  data->add(*app);
  pipe->add(*app);
  app->get_option("--schedule")->description("(unused by bench: see --schedules)");
  app->get_option("--chunks")->description("Chunks N per sequence for stateflow (1f1b and gpipe run whole sequences)");
  app->add_option("--schedules", *schedules, "Comma-separated schedules to compare")->capture_default_str();
  app->add_option("--batch", opts->batch, "Sequences per step")->capture_default_str();
  app->add_option("--seq-len", opts->seq_len, "Tokens per sequence")->capture_default_str();
  app->add_option("--warmup-steps", opts->warmup_steps, "Untimed steps first")->capture_default_str();
  app->add_option("--steps", opts->steps, "Timed steps")->capture_default_str();
  app->add_option("--json", *json, "Also write the results as JSON to this file");
  app->callback([=]() {
    BenchOptions o = *opts;
    apply_common_options(o, *model, *data, *pipe);
    o.chunk_lengths = pipe->resolve_chunks(o.seq_len);
    o.schedules.clear();
    std::stringstream ss(*schedules);
    for (std::string s; std::getline(ss, s, ',');) o.schedules.push_back(s);
    BenchResult r = run_bench(o);
    print_bench(r, o, std::cout);
    if (!json->empty()) write_bench_json(r, o, *json);
  });
}

}  // namespace stateflow::cli
