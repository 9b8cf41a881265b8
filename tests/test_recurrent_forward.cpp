// Recurrent inference (train/recurrent_forward.h) and what runs on it: evaluation chunk by
// chunk equals the unchunked evaluation and the training step's loss; generation's logits,
// prompt as chunks then one token at a time, equal one forward of the whole sequence; sampling
// follows temperature and top-k.
#include <algorithm>
#include <gtest/gtest.h>

#include <cmath>

#include "test_util.h"
#include "train/evaluate.h"
#include "train/generate.h"
#include "train/step.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

ModelConfig tiny_config(Rng& rng) {
  ModelConfig c = model_preset("tiny");
  c.seed = rng.next_u64();
  return c;
}

std::vector<int32_t> random_tokens(Rng& rng, int64_t n, int64_t vocab) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng.below(vocab));
  return t;
}

// A data source that hands out one fixed batch.
struct FixedBatch : DataSource {
  Batch b;
  Batch next(int64_t, int64_t) override { return b; }
  int64_t vocab_size() const override { return 48; }
  std::string describe() const override { return "fixed"; }
  uint64_t position() const override { return 0; }
  void set_position(uint64_t) override {}
};

std::vector<double> row_values(const Tensor& t, int64_t row) {
  std::vector<double> out(t.dim(1));
  for (int64_t i = 0; i < t.dim(1); ++i) out[i] = t.data<double>()[row * t.dim(1) + i];
  return out;
}

}  // namespace

TEST(Evaluate, ChunkedEqualsUnchunkedAndTheTrainingStepsLossF64) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  Rng rng(seed);
  Model model(tiny_config(rng), DType::F64);
  FixedBatch data;
  const int64_t B = 2, T = 37;  // 37: not a multiple of the GDN kernel's block (8)
  data.b = {B, T, random_tokens(rng, B * T, 48), random_tokens(rng, B * T, 48)};
  for (int i = 0; i < B * T; i += 5) data.b.targets[i] = -1;  // positions without a target are not counted
  const double step_loss = forward_backward(model, data.b, 1, {T}).loss;

  RecurrentForward rf(model);
  const EvalResult whole = evaluate(rf, data, {B * T, B, T, 0});
  EXPECT_NEAR(whole.loss, step_loss, 1e-12 * std::abs(step_loss));
  int64_t counted = 0;
  for (int32_t t : data.b.targets) counted += t >= 0;
  EXPECT_EQ(whole.tokens, counted);
  EXPECT_NEAR(whole.perplexity, std::exp(whole.loss), 1e-9 * whole.perplexity);
  Tensor whole_logits;
  evaluate(rf, data, {B * T, B, T, 0}, &whole_logits);
  ASSERT_EQ(whole_logits.shape(), (Shape{B * T, 48}));
  for (int64_t chunk : {1, 3, 8, 13, 36}) {
    SCOPED_TRACE(chunk);
    Tensor logits;
    const EvalResult r = evaluate(rf, data, {B * T, B, T, chunk}, &logits);
    for (int64_t row : {int64_t(0), T - 1, T, B * T - 1})  // each sequence's rows in place, both sequences
      EXPECT_LT(rel_err(row_values(logits, row), row_values(whole_logits, row)), 1e-12) << "row " << row;
    EXPECT_NEAR(r.loss, whole.loss, 1e-12 * whole.loss);
    EXPECT_EQ(r.accuracy, whole.accuracy);
    EXPECT_EQ(r.tokens, whole.tokens);
  }
}

TEST(Evaluate, DrawsWholeBatchesUntilTheTokensAreCoveredAndChecksItsOptions) {
  Rng rng(fresh_seed());
  Model model(tiny_config(rng), DType::F64);
  RecurrentForward rf(model);
  AssociativeRecall recall(48, RecallConfig{4, 4, 1}, 7);
  const EvalResult r = evaluate(rf, recall, {100, 2, 24, 5});  // 100 tokens: 3 batches of 2 x 24
  EXPECT_EQ(r.batches, 3);
  EXPECT_EQ(recall.position(), 3u);
  EXPECT_EQ(r.tokens, 3 * 2 * 4);  // recall counts the answers only
  expect_error([&] { evaluate(rf, recall, {0, 1, 24, 0}); }, "--eval-tokens must be at least 1");
  expect_error([&] { evaluate(rf, recall, {10, 1, 24, -1}); }, "--chunk-len must be >= 0");
}

TEST(Generate, StepByStepLogitsEqualTheFullForwardsF64) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(seed);
  Rng rng(seed);
  Model model(tiny_config(rng), DType::F64);
  RecurrentForward rf(model);
  const std::vector<int32_t> prompt = random_tokens(rng, 11, 48);
  const int64_t new_tokens = 9;
  for (int64_t prompt_chunk : {0, 1, 4}) {
    SCOPED_TRACE(prompt_chunk);
    // Sampled (not greedy) so that the continuation is not the argmax path only.
    GenerateConfig g{new_tokens, 1.0, 0, rng.next_u64(), prompt_chunk, -1};
    const std::vector<int32_t> out = generate(rf, prompt, g);
    ASSERT_EQ(int64_t(out.size()), new_tokens);
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), out.begin(), out.end());

    // The same sequence through one chunk, and again through the prompt's chunks then single tokens.
    Tensor full;
    rf.reset();
    rf.forward(all, std::vector<int32_t>(all.size(), -1), 1, nullptr, &full);
    rf.reset();
    Tensor logits;
    const int64_t n = int64_t(prompt.size()), chunk = prompt_chunk ? prompt_chunk : n;
    for (int64_t off = 0; off < int64_t(all.size());) {
      const int64_t len = off < n ? std::min(chunk, n - off) : 1;
      std::vector<int32_t> part(all.begin() + off, all.begin() + off + len);
      rf.forward(part, std::vector<int32_t>(len, -1), 1, nullptr, &logits);
      ASSERT_EQ(logits.dim(0), len);
      for (int64_t t = 0; t < len; ++t)
        EXPECT_LT(rel_err(row_values(logits, t), row_values(full, off + t)), 1e-12) << "position " << off + t;
      off += len;
    }
  }
}

TEST(Generate, GreedyFollowsTheArgmaxAndSamplingIsSeededAndRespectsTopK) {
  Rng rng(fresh_seed());
  Model model(tiny_config(rng), DType::F64);
  RecurrentForward rf(model);
  const std::vector<int32_t> prompt = random_tokens(rng, 6, 48);
  const std::vector<int32_t> greedy = generate(rf, prompt, {5, 0.0, 0, 1, 0, -1});
  std::vector<int32_t> all = prompt;
  for (int32_t t : greedy) {  // each greedy token is the argmax of the whole sequence so far
    Tensor logits;
    rf.reset();
    rf.forward(all, std::vector<int32_t>(all.size(), -1), 1, nullptr, &logits);
    const std::vector<double> last = row_values(logits, logits.dim(0) - 1);
    EXPECT_EQ(t, std::max_element(last.begin(), last.end()) - last.begin());
    all.push_back(t);
  }
  const uint64_t s = rng.next_u64();
  EXPECT_EQ(generate(rf, prompt, {8, 1.0, 0, s, 0, -1}), generate(rf, prompt, {8, 1.0, 0, s, 3, -1}));
  // top_k 1 is greedy at any temperature; a stop token ends the output after it.
  EXPECT_EQ(generate(rf, prompt, {5, 2.0, 1, s, 0, -1}), greedy);
  // The stop token is the last greedy token: the output ends at its first appearance (a small
  // random model often repeats a token).
  const auto first_stop = std::find(greedy.begin(), greedy.end(), greedy.back());
  EXPECT_EQ(generate(rf, prompt, {5, 0.0, 0, s, 0, greedy.back()}), std::vector<int32_t>(greedy.begin(), first_stop + 1));

  // Sampling frequencies follow softmax(logits / temperature) over the top k.
  Tensor logits = Tensor::zeros({1, 4}, DType::F64);
  const double l[4] = {1.0, 0.0, 2.0, -1.0};
  std::copy(l, l + 4, logits.data<double>());
  Rng draw(rng.next_u64());
  for (double temperature : {0.5, 1.0, 2.0}) {
    int counts[4] = {0, 0, 0, 0};
    const int n = 20000;
    for (int i = 0; i < n; ++i) ++counts[sample_token(logits, 0, temperature, 2, draw)];
    EXPECT_EQ(counts[1] + counts[3], 0) << "outside the top 2";
    const double p2 = 1.0 / (1.0 + std::exp((l[0] - l[2]) / temperature));
    EXPECT_NEAR(double(counts[2]) / n, p2, 0.015) << "temperature " << temperature;
  }
  expect_error([&] { generate(rf, {}, {}); }, "at least one token");
  expect_error([&] { generate(rf, prompt, {5, -1.0, 0, 0, 0, -1}); }, "--temperature must be >= 0");
  expect_error([&] { rf.forward({48}, {-1}, 1, nullptr); }, "outside the model's vocabulary");
}
