// `stateflow generate`: sample a continuation of a prompt from a checkpoint.
#include <fstream>
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "train/generate.h"
#include "train/train_options.h"

namespace stateflow::cli {

namespace {
struct GenerateCommand {
  CheckpointOptions ckpt;
  std::string prompt, prompt_tokens;
  GenerateConfig gen;
};

// Whitespace-separated token ids (what `tools/prepare_data.py encode` prints).
std::vector<int32_t> read_token_ids(const std::string& path) {
  std::ifstream in(path);
  SF_CHECK(in.good(), "cannot open --prompt-tokens file ", path);
  std::vector<int32_t> ids;
  std::string word;
  while (in >> word) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SF_CHECK(used == word.size() && v >= 0 && v <= INT32_MAX, "--prompt-tokens file ", path, ": '", word,
             "' is not a token id (the file holds whitespace-separated non-negative integers)");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}
}  // namespace

void add_generate_command(CLI::App& root) {
  auto* app = root.add_subcommand(
      "generate", "Sample a continuation of a prompt from a checkpoint: the prompt runs as chunks, then one token "
                  "at a time through the same recurrent state (constant memory per token)");
  auto c = std::make_shared<GenerateCommand>();
  c->ckpt.add(*app, true);
  auto* text = app->add_option("--prompt", c->prompt,
                               "Prompt text (models trained on --data text: bytes; for tokenized data use "
                               "--prompt-tokens)");
  auto* ids = app->add_option("--prompt-tokens", c->prompt_tokens,
                              "File of whitespace-separated prompt token ids (tools/prepare_data.py encode)");
  text->excludes(ids);
  app->add_option("--max-new-tokens", c->gen.max_new_tokens, "Tokens to generate")->capture_default_str();
  app->add_option("--temperature", c->gen.temperature, "Sampling temperature (0: greedy)")->capture_default_str();
  app->add_option("--top-k", c->gen.top_k, "Sample among the k most likely tokens (0: all)")->capture_default_str();
  app->add_option("--seed", c->gen.seed, "Seed of the sampler")->capture_default_str();
  app->add_option("--prompt-chunk", c->gen.prompt_chunk, "Tokens per chunk of the prompt (0: all at once)")
      ->capture_default_str();
  app->add_option("--stop-token", c->gen.stop_token, "Stop after generating this token id (-1: never)")
      ->capture_default_str();
  app->callback([=]() {
    SF_CHECK(!c->prompt.empty() || !c->prompt_tokens.empty(), "give a prompt: --prompt TEXT or --prompt-tokens FILE");
    c->gen.validate();
    LoadedModel m = c->ckpt.load();
    const TrainOptions run = TrainOptions::from_json(m.state.options);
    // Text-trained models read and write bytes; others token ids.
    const bool bytes = run.data.kind == "text";
    std::vector<int32_t> prompt;
    if (!c->prompt.empty()) {
      SF_CHECK(bytes, "this model was trained on --data ", run.data.kind, ", not text: --prompt takes text for ",
               "byte-level models only; encode the prompt with tools/prepare_data.py encode and pass "
               "--prompt-tokens FILE");
      for (unsigned char ch : c->prompt) prompt.push_back(ch);
    } else {
      prompt = read_token_ids(c->prompt_tokens);
    }
    std::cerr << "model " << m.model->config().name << " from " << m.step_dir << " (step " << m.state.step << "), "
              << device_name(m.model->device()) << "; prompt " << prompt.size() << " tokens\n";
    RecurrentForward model(*m.model);
    if (bytes) std::cout << c->prompt << std::flush;
    generate(model, prompt, c->gen, [&](int32_t t) {
      if (bytes) std::cout << static_cast<char>(t) << std::flush;
      else std::cout << t << ' ' << std::flush;
    });
    std::cout << "\n";
  });
}

}  // namespace stateflow::cli
