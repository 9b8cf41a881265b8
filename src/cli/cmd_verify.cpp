// `stateflow verify`
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "train/chunking.h"
#include "train/verify.h"

namespace stateflow::cli {

void add_verify_command(CLI::App& root) {
  auto* app = root.add_subcommand(
      "verify",
      "Check that chunked training gives the gradients of unchunked training: one step, unchunked and chunked, "
      "from the same weights and batch; exits 1 above tolerance");
  auto opts = std::make_shared<VerifyOptions>();
  auto model = std::make_shared<ModelOptions>();
  auto data = std::make_shared<DataOptions>();
  auto chunks = std::make_shared<int64_t>(0);
  auto chunk_lengths = std::make_shared<std::string>();
  model->add(*app, "tiny", "f64");
  data->add(*app);
  app->add_option("--batch", opts->batch, "Sequences in the step")->capture_default_str();
  app->add_option("--seq-len", opts->seq_len, "Tokens per sequence")->capture_default_str();
  app->add_option("--microbatches", opts->microbatches, "Microbatches (must divide --batch)")->capture_default_str();
  app->add_option("--chunks", *chunks, "Compare only this many nearly-equal chunks (default: a built-in set)");
  app->add_option("--chunk-lengths", *chunk_lengths, "Compare only these chunk lengths a,b,c,...");
  app->add_option("--tolerance", opts->tolerance, "Max relative difference allowed (default 1e-10 f64, 1e-4 f32)");
  app->callback([=]() {
    VerifyOptions o = *opts;
    o.model = model->resolve();
    o.dtype = parse_dtype(model->dtype);
    o.data = data->data;
    if (*chunks > 0) o.chunkings.push_back(even_chunk_lengths(o.seq_len, *chunks));
    if (!chunk_lengths->empty()) o.chunkings.push_back(parse_chunk_lengths(*chunk_lengths));
    VerifyResult r = run_verify(o);
    print_verify(r, std::cout);
    if (!r.passed()) throw ExitCode(1);
  });
}

}  // namespace stateflow::cli
