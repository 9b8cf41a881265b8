// Bad input gets a clear error: every validated model-config field, training option,
// pipeline shape, chunking, data setting and JSON form is set wrong once, and the message
// must name the field (or flag) and what it accepts.
#include <gtest/gtest.h>

#include <functional>
#include <nlohmann/json.hpp>

#include "pipeline/launch.h"
#include "pipeline/partition.h"
#include "temp_dir.h"
#include "test_util.h"
#include "pipeline/chunking.h"
#include "train/lr_schedule.h"
#include "train/trainer.h"
#include "train/verify.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

// Small, valid options: each case below breaks one thing.
TrainOptions valid_options() {
  TrainOptions o;
  o.model = model_preset("tiny");
  o.data.recall = RecallConfig{4, 4, 1};
  o.steps = 2, o.batch = 4, o.seq_len = 24, o.stages = 2, o.microbatches = 2, o.chunks = 3;
  return o;
}

struct Case {
  const char* what;
  std::function<void(TrainOptions&)> breaks;
  std::string message;
};

void expect_trainer_error(const Case& c) {
  SCOPED_TRACE(c.what);
  TrainOptions o = valid_options();
  c.breaks(o);
  expect_error([&] { Trainer t(o); }, c.message);
}

}  // namespace

TEST(Validation, ValidOptionsTrain) {
  Trainer t(valid_options());
  EXPECT_TRUE(std::isfinite(t.step().loss));
}

TEST(Validation, ModelConfigFieldsNameTheirAcceptedRange) {
  struct Field {
    const char* name;
    int64_t ModelConfig::*field;
    int64_t max;
  };
  const Field fields[] = {{"vocab_size", &ModelConfig::vocab_size, int64_t(1) << 30},
                          {"d_model", &ModelConfig::d_model, 1 << 16},
                          {"mlp_hidden", &ModelConfig::mlp_hidden, 1 << 20}};
  for (const Field& f : fields)
    for (int64_t bad : {int64_t(0), f.max + 1}) {
      ModelConfig c = model_preset("tiny");
      c.*f.field = bad;
      expect_error([&] { c.validate(); },
                   cat("model config: ", f.name, " = ", bad, " is out of range; accepted: 1..", f.max));
    }
  // The GDN section's fields, named with their section.
  for (auto [field, max] : {std::pair{"heads", 1024}, {"head_dk", 1024}, {"head_dv", 1024}, {"conv_size", 64},
                            {"block_size", 1024}})
    for (int64_t bad : {int64_t(0), int64_t(max) + 1}) {
      ModelConfig c = model_preset("tiny");
      c.mixers["gdn"][field] = bad;
      expect_error([&] { c.validate(); },
                   cat("model config: gdn.", field, " = ", bad, " is out of range; accepted: 1..", max));
    }
  ModelConfig long_pattern = model_preset("tiny");
  long_pattern.pattern = std::string(1025, 'G');
  expect_error([&] { long_pattern.validate(); }, "model config: pattern has 1025 blocks; at most 1024");
  for (double bad : {0.0, 1.0}) {
    ModelConfig c = model_preset("tiny");
    c.norm_eps = bad;
    expect_error([&] { c.validate(); }, cat("model config: norm_eps = ", bad, " must be in (0, 1)"));
  }
  for (double bad : {0.0, 10.0}) {
    ModelConfig c = model_preset("tiny");
    c.init_std = bad;
    expect_error([&] { c.validate(); }, cat("model config: init_std = ", bad, " must be in (0, 10)"));
  }
}

TEST(Validation, ModelConfigJsonAndFiles) {
  using nlohmann::json;
  expect_error([] { ModelConfig::from_json(json::array()); }, "model config must be a JSON object");
  expect_error([] { ModelConfig::from_json({{"preset", "tiny"}, {"d_modle", 3}}); },
               "model config: unknown field 'd_modle'");
  expect_error([] { ModelConfig::from_json({{"d_model", "wide"}}); },
               "model config: field 'd_model' has the wrong type: expected an integer, got string");
  expect_error([] { ModelConfig::from_json({{"gdn", {{"heads", -1}}}}); },
               "gdn.heads = -1 is out of range; accepted: 1..1024");
  expect_error([] { ModelConfig::from_json({{"gdn", {{"head", 4}}}}); },
               "model config: gdn.head is not a field of gdn; fields: block_size, conv_size, head_dk, head_dv, heads");
  expect_error([] { ModelConfig::from_json({{"gdn", {{"keep_sweep", 1}}}}); },
               "model config: field 'gdn.keep_sweep' has the wrong type: expected true or false, got number");
  expect_error([] { ModelConfig::from_json({{"n_layers", 4}}); }, "field 'n_layers' was replaced by 'pattern'");
  expect_error([] { ModelConfig::from_json({{"n_heads", 4}}); },
               "field 'n_heads' moved into the Gated DeltaNet section: {\"gdn\": {\"heads\": ...}}");
  expect_error([] { ModelConfig::from_json({{"pattern", "GQ"}}); }, "layer pattern: unknown block letter 'Q'; known: ");
  expect_error([] { model_preset("huge"); }, "unknown model preset 'huge'; available: tiny, small, small-grouped, gdn-1.3b");
  TempDir dir;
  expect_error([&] { load_model_config(dir / "none.json"); }, "cannot open model config");
  write_bytes(dir / "bad.json", {'{', '"', 'a'});
  expect_error([&] { load_model_config(dir / "bad.json"); }, "is not valid JSON");
}

TEST(Validation, TrainingOptionsNameTheFlagAndRange) {
  const Case cases[] = {
      {"steps", [](TrainOptions& o) { o.steps = 0; }, "--steps must be at least 1, got 0"},
      {"batch", [](TrainOptions& o) { o.batch = 0; }, "--batch must be at least 1, got 0"},
      {"seq_len", [](TrainOptions& o) { o.seq_len = 0; }, "--seq-len must be at least 1, got 0"},
      {"tokens per step", [](TrainOptions& o) { o.batch = int64_t(1) << 40; },
       "--batch 1099511627776 x --seq-len 24 tokens per step is more than the 2147483648 accepted"},
      {"microbatches", [](TrainOptions& o) { o.microbatches = 3; },
       "--microbatches 3 must be at least 1 and divide --batch 4"},
      {"microbatches 0", [](TrainOptions& o) { o.microbatches = 0; }, "--microbatches 0 must be at least 1"},
      {"lr", [](TrainOptions& o) { o.lr = 1.5; }, "--lr must be in (0, 1), got 1.5"},
      {"lr 0", [](TrainOptions& o) { o.lr = 0; }, "--lr must be in (0, 1), got 0"},
      {"min_lr", [](TrainOptions& o) { o.min_lr = 2 * o.lr; }, "--min-lr must be in [0, lr]"},
      {"warmup", [](TrainOptions& o) { o.warmup = -1; }, "--warmup must be >= 0, got -1"},
      {"log_every", [](TrainOptions& o) { o.log_every = 0; }, "--log-every must be at least 1, got 0"},
      {"clip", [](TrainOptions& o) { o.clip = -1; }, "--clip must be >= 0 (0 turns clipping off), got -1"},
      {"timeout", [](TrainOptions& o) { o.timeout_s = 0; }, "--timeout must be positive, got 0"},
      {"save_every", [](TrainOptions& o) { o.save_every = -2; }, "--save-every must be >= 0"},
      {"save_every without dir", [](TrainOptions& o) { o.save_every = 5; }, "--save-every 5 needs --save-dir DIR"},
      {"keep", [](TrainOptions& o) { o.keep = -1; }, "--keep must be >= 0 (0 keeps every checkpoint), got -1"},
      {"beta1", [](TrainOptions& o) { o.adamw.beta1 = 1; }, "AdamW beta1 = 1 must be in [0, 1)"},
      {"beta2", [](TrainOptions& o) { o.adamw.beta2 = -0.1; }, "AdamW beta2 = -0.1 must be in [0, 1)"},
      {"eps", [](TrainOptions& o) { o.adamw.eps = 0; }, "AdamW eps = 0 must be positive"},
      {"weight decay", [](TrainOptions& o) { o.adamw.weight_decay = -1; }, "AdamW weight_decay = -1 must be >= 0"},
      {"model field", [](TrainOptions& o) { o.model.mixers["gdn"]["heads"] = 0; },
       "model config: gdn.heads = 0 is out of range"},
      {"resume", [](TrainOptions& o) { o.resume = "/nonexistent/run"; },
       "--resume /nonexistent/run: no such directory"},
  };
  for (const Case& c : cases) expect_trainer_error(c);
}

TEST(Validation, ChunkingNamesTheFix) {
  const Case cases[] = {
      {"more chunks than tokens", [](TrainOptions& o) { o.chunks = 25; },
       "cannot cut a sequence of 24 tokens into 25 chunks: use --chunks at most 24"},
      {"no chunks", [](TrainOptions& o) { o.chunks = 0; }, "--chunks must be at least 1, got 0"},
      {"lengths that do not sum", [](TrainOptions& o) { o.chunk_lengths = {10, 10}; },
       "chunk lengths 10,10 sum to 20 but the sequence length is 24: make them sum to 24"},
      {"an empty chunk", [](TrainOptions& o) { o.chunk_lengths = {24, 0}; },
       "chunk 1 has length 0: every chunk needs at least one token"},
  };
  for (const Case& c : cases) expect_trainer_error(c);
  expect_error([] { validate_chunk_lengths({}, 4); }, "chunk lengths are empty");
  expect_error([] { parse_chunk_lengths("8,x,8"); }, "chunk lengths '8,x,8': item 'x' is not an integer");
  expect_error([] { parse_chunk_lengths("8,,8"); }, "item '' is not an integer");
}

TEST(Validation, PipelineShapeNamesTheFix) {
  const Case cases[] = {
      {"more stages than blocks", [](TrainOptions& o) { o.stages = 3; },
       "--stages 3 is more than the model's 2 blocks (pattern 'GG'); use at most 2 stages"},
      {"no stages", [](TrainOptions& o) { o.stages = 0; }, "--stages must be at least 1, got 0"},
      {"unknown schedule", [](TrainOptions& o) { o.schedule = "zigzag"; },
       "unknown schedule kind 'zigzag': expected one of gpipe, 1f1b, stateflow"},
      {"1f1b with chunks", [](TrainOptions& o) { o.schedule = "1f1b"; },
       "schedule kind 1f1b runs whole sequences, so N must be 1 (got N=3)"},
      {"unknown transport", [](TrainOptions& o) { o.transport = "pigeon"; },
       "unknown transport 'pigeon'; use auto, local (threads, one process), mpi"},
      {"pattern stage count", [](TrainOptions& o) { o.model.pattern = "G|G|G"; },
       "layer pattern 'G|G|G' cuts the model into 3 stages but --stages is 2"},
      {"pattern empty stage", [](TrainOptions& o) { o.model.pattern = "GG|"; },
       "pattern 'GG|' has an empty stage; every stage between '|' needs a block"},
      {"pattern unknown block", [](TrainOptions& o) { o.model.pattern = "G|X"; },
       "layer pattern: unknown block letter 'X'; known: "},
  };
  for (const Case& c : cases) expect_trainer_error(c);
  expect_error([] { parse_dtype("bf16"); }, "unknown dtype 'bf16': use f32 or f64");
}

TEST(Validation, DataSettingsNameTheFix) {
  const Case cases[] = {
      {"unknown kind", [](TrainOptions& o) { o.data.kind = "csv"; },
       "unknown data kind 'csv': use recall, text, tokens (a tools/prepare_data.py manifest), tokens-u16 or tokens-u32"},
      {"recall with a path", [](TrainOptions& o) { o.data.path = "x.txt"; },
       "recall data is generated, but a data path was given (x.txt)"},
      {"text without a path", [](TrainOptions& o) { o.data.kind = "text"; },
       "text data needs a file: pass --data-path"},
      {"tokens without vocab", [](TrainOptions& o) { o.data.kind = "tokens-u16", o.data.path = "t.bin"; },
       "tokens-u16 data needs the tokenizer's vocab size: pass --data-vocab"},
      {"negative vocab", [](TrainOptions& o) { o.data.vocab_size = -1; }, "vocab size -1 must be >= 0"},
      {"missing file", [](TrainOptions& o) { o.data.kind = "text", o.data.path = "/nonexistent.txt"; },
       "data file /nonexistent.txt does not exist: check --data-path"},
      {"recall pairs", [](TrainOptions& o) { o.data.recall.num_pairs = 0; }, "recall task: num_pairs = 0 must be >= 1"},
      {"recall queries", [](TrainOptions& o) { o.data.recall.num_queries = 0; },
       "recall task: num_queries = 0 must be >= 1"},
      {"recall vocab", [](TrainOptions& o) { o.data.vocab_size = 8; },
       "use a vocab_size of at least 10, or fewer pairs or noise tokens"},
      {"data vocab above the model's", [](TrainOptions& o) { o.data.vocab_size = 60; },
       "the data uses 60 token ids but the model's vocab_size is 48: raise vocab_size in the model config"},
  };
  for (const Case& c : cases) expect_trainer_error(c);
  TempDir dir;
  write_bytes(dir / "odd.bin", {1, 2, 3});
  TrainOptions o = valid_options();
  o.data.kind = "tokens-u16", o.data.path = dir / "odd.bin", o.data.vocab_size = 40;
  expect_error([&] { Trainer t(o); }, "has 3 bytes, not a multiple of the 2-byte token width of tokens-u16");
  o = valid_options();
  o.seq_len = 12, o.chunks = 2;  // the recall task needs 16
  Trainer t(o);
  expect_error([&] { t.step(); }, "recall task: seq_len 12 cannot hold 4 pairs and 4 queries");
}

TEST(Validation, LearningRateSchedule) {
  expect_error([] { LrSchedule{0, 0, 0, 10}.validate(); }, "learning-rate schedule: peak = 0 must be > 0");
  expect_error([] { LrSchedule{1e-3, 2e-3, 0, 10}.validate(); }, "min = 0.002 must be in [0, peak = 0.001]");
  expect_error([] { LrSchedule{1e-3, 0, -1, 10}.validate(); }, "warmup = -1 steps must be >= 0");
  expect_error([] { LrSchedule{1e-3, 0, 20, 10}.validate(); }, "total = 10 steps must be >= warmup = 20");
  expect_error([] { LrSchedule{1e-3, 0, 0, 10}.at(-1); }, "step -1 must be >= 0");
}

TEST(Validation, TrainOptionsJson) {
  nlohmann::json j = valid_options().to_json();
  j["stpes"] = 3;
  expect_error([&] { TrainOptions::from_json(j); }, "train options: unknown field 'stpes'");
  j = valid_options().to_json();
  j["batch"] = "four";
  expect_error([&] { TrainOptions::from_json(j); }, "train options: field 'batch' has the wrong type");
  j = valid_options().to_json();
  j["dtype"] = "f16";
  expect_error([&] { TrainOptions::from_json(j); }, "unknown dtype 'f16'");
  j = valid_options().to_json();
  j["keep"] = -3;
  expect_error([&] { TrainOptions::from_json(j); }, "--keep must be >= 0");
}

TEST(Validation, VerifyOptions) {
  VerifyOptions o;
  o.batch = 0;
  expect_error([&] { run_verify(o); }, "verify: --batch and --seq-len must be at least 1");
  o = VerifyOptions{};
  o.data.vocab_size = 100;
  expect_error([&] { run_verify(o); }, "verify: the data uses 100");
}
