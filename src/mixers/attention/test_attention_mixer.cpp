// Attention through the registry and the pipeline: its config section's errors name the field,
// and in a pipelined hybrid step each stage's kv_prefix peak is what the simulator predicts
// from the formula (batch x seq_len x kv_heads x head_dim x 2 x bytes per microbatch in flight,
// as much again for the gradient of the one running backward).
#include <gtest/gtest.h>

#include "layer_testing.h"
#include "mixers/attention/attention_config.h"
#include "pipeline/pipeline.h"
#include "pipeline/simulate.h"
#include "test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

TEST(AttentionMixer, ConfigSectionErrorsNameTheField) {
  auto load = [](const nlohmann::json& section) {
    return ModelConfig::from_json({{"preset", "tiny"}, {"pattern", "GA"}, {"attention", section}});
  };
  EXPECT_EQ(attention_config(load({{"heads", 6}, {"kv_heads", 3}})).kv_heads, 3);
  expect_error([&] { load({{"kv_heads", 3}}); }, "attention.kv_heads = 3 must divide attention.heads = 4");
  expect_error([&] { load({{"heads", 0}}); }, "attention.heads = 0 is out of range");
  expect_error([&] { load({{"qk_norm", 1}}); }, "'attention.qk_norm' has the wrong type: expected true or false");
  expect_error([&] { load({{"rotary_dim", 3}}); }, "attention.rotary_dim = 3");
  expect_error([&] { load({{"head_size", 8}}); }, "attention.head_size is not a field of attention");
}

TEST(AttentionMixer, PipelinedKvPrefixPeakMatchesTheFormula) {
  PipelineConfig pc;
  pc.model = model_preset("tiny");
  pc.model.pattern = "GA|AA";  // one attention block on stage 0, two on stage 1
  pc.model.complete_sections();
  pc.dtype = DType::F32;
  pc.stages = 2, pc.microbatches = 2, pc.chunk_lengths = {5, 9, 1, 17};
  const int64_t batch = 4, T = 32;
  Rng rng(fresh_seed());
  const Batch b = random_batch(rng, batch, T, pc.model.vocab_size);
  auto pipe = make_local_pipeline(pc);
  pipe->forward_backward(b);
  const int64_t prefix = attention_config(pc.model).kv_prefix_bytes(batch / pc.microbatches, T, sizeof(float));
  CostTable costs = uniform_costs(2, 4, 1, 2);
  costs.kv_prefix_bytes = {prefix, 2 * prefix}, costs.kv_grad_bytes = costs.kv_prefix_bytes;
  const SimResult sim = simulate(make_schedule("stateflow", 2, pc.microbatches, 4), costs);
  for (Stage* s : pipe->stages()) {
    const int64_t measured = s->tracker().snapshot().peak_of(MemCategory::KvPrefix);
    const int64_t predicted = sim.peak_bytes[s->rank()][int(MemCategory::KvPrefix)];
    std::printf("stage %d: kv_prefix peak %lld bytes, formula %lld\n", s->rank(), (long long)measured,
                (long long)predicted);
    EXPECT_GE(predicted, 2 * prefix);
    EXPECT_NEAR(double(measured), double(predicted), 0.05 * double(predicted)) << "stage " << s->rank();
    EXPECT_EQ(s->tracker().snapshot().current_of(MemCategory::KvPrefix), 0) << "a K/V buffer outlived the step";
  }
}
