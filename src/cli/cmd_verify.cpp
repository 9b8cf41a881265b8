// `stateflow verify`
#include <cmath>
#include <iostream>
#include <stdexcept>

#include "cli/commands.h"
#include "cli/common.h"
#include "pipeline/chunking.h"
#include "train/verify.h"

namespace stateflow::cli {

void add_verify_command(CLI::App& root) {
  auto* app = root.add_subcommand(
      "verify",
      "Check that pipelined, chunked training gives the gradients of one stage and one chunk: one step, "
      "from the same weights and batch, under several chunkings; exits 1 above tolerance");
  auto opts = std::make_shared<VerifyOptions>();
  auto model = std::make_shared<ModelOptions>();
  auto data = std::make_shared<DataOptions>();
  auto pipe = std::make_shared<PipelineOptions>();
  pipe->chunks = 0;
  model->add(*app, "tiny", "f64");
  data->add(*app);
  pipe->add(*app);
  app->get_option("--chunks")->description("Compare only this many nearly-equal chunks (default: a built-in set)");
  add_data_parallel_option(*app, opts->data_parallel);
  app->add_option("--batch", opts->batch, "Sequences in the step (shared by the data-parallel replicas)")
      ->capture_default_str();
  app->add_option("--seq-len", opts->seq_len, "Tokens per sequence")->capture_default_str();
  app->add_option("--tolerance", opts->tolerance, "Max relative difference allowed (default 1e-10 f64, 1e-4 f32)")
      ->check([](const std::string& v) {
        double t = 0;
        try {
          t = std::stod(v);
        } catch (const std::exception&) {
        }
        return t > 0 && std::isfinite(t) ? std::string()
                                         : v + " is not a positive, finite relative difference";
      });
  app->callback([=]() {
    VerifyOptions o = *opts;
    apply_common_options(o, *model, *data, *pipe);
    o.schedule = pipe->schedule;
    SF_CHECK(!pipe->chunks_auto, "verify --chunks auto: verify compares given chunkings; take the lengths that "
                                 "plan --auto chose (--chunk-lengths a,b,c or its plan file)");
    if (app->count("--chunks") || app->count("--chunk-lengths"))
      o.chunkings.push_back(pipe->resolve_chunks(o.seq_len));
    VerifyResult r = run_verify(o);
    print_verify(r, std::cout);
    if (!r.passed()) throw ExitCode(1);
  });
}

}  // namespace stateflow::cli
