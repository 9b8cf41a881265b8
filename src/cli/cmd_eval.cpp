// `stateflow eval`: held-out loss, perplexity and accuracy of a checkpoint.
#include <iomanip>
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/safetensors.h"
#include "train/evaluate.h"
#include "train/train_options.h"

namespace stateflow::cli {

namespace {
struct EvalCommand {
  CheckpointOptions ckpt;
  DataOptions data;
  int64_t tokens = 0, batch = 1, seq_len = -1, chunk_len = 2048;
  std::string logits_out;
};

// The data to evaluate on: --data if given, else the run's held-out data, else its training
// data; tokenized for the checkpoint's model (recall: the run's task, another stream).
DataConfig eval_data_config(const CLI::App& app, const EvalCommand& c, const TrainOptions& run, std::ostream& log) {
  DataConfig d = run.data;
  if (app.count("--data")) {
    d.kind = c.data.data.kind, d.path = c.data.data.path;
  } else if (!run.eval_data.kind.empty()) {
    d.kind = run.eval_data.kind, d.path = run.eval_data.path;
  } else {
    log << "note: no --data given and the run had no --eval-data: evaluating on its training data\n";
  }
  if (app.count("--data-path")) d.path = c.data.data.path;
  if (app.count("--data-vocab")) d.vocab_size = c.data.data.vocab_size;
  if (d.kind == "recall") {
    if (!d.vocab_size) d.vocab_size = run.model.vocab_size;
    d.seed = app.count("--data-seed") ? c.data.data.seed : run.data.seed + 1;  // not the training stream
  } else if (!app.count("--data-vocab") && d.kind != run.data.kind) {
    d.vocab_size = 0;  // the new kind's own
  }
  return d;
}
}  // namespace

void add_eval_command(CLI::App& root) {
  auto* app = root.add_subcommand(
      "eval", "Evaluate a checkpoint on held-out data: loss, perplexity and next-token accuracy, each sequence "
              "chunk by chunk with the recurrent state carried (any length in the memory of one chunk)");
  auto c = std::make_shared<EvalCommand>();
  c->ckpt.add(*app, true);
  c->data.add(*app);
  app->add_option("--eval-tokens", c->tokens,
                  "Tokens to evaluate, in whole batches (0: every window of a file once; recall: 16 batches)")
      ->capture_default_str();
  app->add_option("--batch", c->batch, "Sequences evaluated side by side")->capture_default_str();
  app->add_option("--seq-len", c->seq_len,
                  "Tokens per sequence, each starting from a zero state (default: the run's; 0: the whole file as "
                  "one sequence)");
  app->add_option("--chunk-len", c->chunk_len, "Tokens per chunk (memory; the result does not depend on it; 0: "
                                               "whole sequences)")
      ->capture_default_str();
  app->add_option("--logits-out", c->logits_out,
                  "Also write the first batch's logits [batch * seq_len, vocab] to this safetensors file (tensor "
                  "'logits'), to compare with another framework");
  app->callback([=]() {
    std::ostream& log = std::cout;
    LoadedModel m = c->ckpt.load();
    const TrainOptions run = TrainOptions::from_json(m.state.options);
    const ModelConfig& mc = m.model->config();
    log << "model " << mc.name << " from " << m.step_dir << " (step " << m.state.step << "): "
        << mc.num_parameters() << " parameters, " << dtype_name(m.model->dtype()) << " on "
        << device_name(m.model->device()) << "\n";
    std::unique_ptr<DataSource> data = make_data_source(eval_data_config(*app, *c, run, log));
    SF_CHECK(data->vocab_size() <= mc.vocab_size, "the data uses ", data->vocab_size(),
             " token ids but the model's vocab_size is ", mc.vocab_size,
             ": evaluate on data tokenized like the model's training data");
    auto* file = dynamic_cast<TokenWindows*>(data.get());
    EvalConfig ec{c->tokens, c->batch, c->seq_len < 0 ? run.seq_len : c->seq_len, c->chunk_len};
    if (ec.seq_len == 0) {
      SF_CHECK(file, "--seq-len 0 (the whole file as one sequence) needs file data");
      ec.seq_len = file->num_tokens() - 1;
    }
    if (ec.tokens == 0)  // every whole window of the file once, or 16 batches of a generated task
      ec.tokens = file ? std::max<int64_t>(1, (file->num_tokens() - 1) / ec.seq_len) * ec.seq_len
                       : 16 * ec.batch * ec.seq_len;
    log << "data: " << data->describe() << "\n";
    RecurrentForward model(*m.model);
    Tensor logits;
    const EvalResult r = evaluate(model, *data, ec, c->logits_out.empty() ? nullptr : &logits);
    if (!c->logits_out.empty()) {
      write_safetensors(c->logits_out, {st_ref("logits", logits)}, {{"format", "pt"}});
      log << "logits of the first batch: " << c->logits_out << "\n";
    }
    log << "evaluated " << r.batches << " batch(es) of " << ec.batch << " x " << ec.seq_len << " tokens in chunks of "
        << (ec.chunk_len ? std::min(ec.chunk_len, ec.seq_len) : ec.seq_len) << "\n"
        << "eval: " << format_eval(r) << "\n"
        << std::setprecision(9) << "eval_loss=" << r.loss << "\n";
  });
}

}  // namespace stateflow::cli
