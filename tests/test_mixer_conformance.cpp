// The conformance suite every sequence mixer passes (docs/design.md, "How to add a mixer"): a
// mixer joins it with one line in kMixerCases. In float64, for the layer built through the
// registry: chunked == unchunked (outputs, state, every gradient) for chunkings with 1- and
// 2-token chunks and lengths that don't divide the kernel's block; the hand-written backward
// against finite differences, with a negative control; zero state == no state. For a small
// model of that mixer mixed with GDN: the pipelined, chunked step == one stage and one chunk
// (`verify`), --recompute full gives bitwise the same gradients, and a checkpoint round trip
// restores every weight bitwise. Random inputs print their seed on failure and replay with
// STATEFLOW_TEST_SEED.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "gpu_test_model.h"
#include "gradient_terms.h"
#include "layer_testing.h"
#include "model/mixer.h"
#include "per_head_scalar_band.h"
#include "pipeline/stage_executor.h"
#include "pipeline/units.h"
#include "temp_dir.h"
#include "pipeline/pipeline.h"
#include "test_util.h"
#include "train/checkpoint.h"
#include "train/step.h"
#include "train/train_options.h"
#include "train/verify.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

struct MixerCase {
  char letter;
  nlohmann::json section;  // over the mixer's defaults: sizes small enough for float64 checks
  // per-head scalars that reach the loss only through the state's decay (gradient_terms.h)
  std::vector<std::string> decay_fields = {};
};

const MixerCase kMixerCases[] = {
    {'G', {{"heads", 2}, {"head_dk", 4}, {"head_dv", 3}, {"conv_size", 4}, {"block_size", 8}},
     {"A_log", "dt_bias"}},
    // grouped values: two value heads per q/k head
    {'G',
     {{"heads", 2}, {"value_heads", 4}, {"head_dk", 4}, {"head_dv", 3}, {"conv_size", 4}, {"block_size", 8}},
     {"A_log", "dt_bias"}},
    {'S', {{"heads", 2}, {"head_dk", 4}, {"head_dv", 3}}},
    {'M',
     {{"heads", 4}, {"head_dim", 3}, {"state_size", 6}, {"rank", 2}, {"groups", 2}, {"block_size", 5}, {"output_norm", true}}},
    {'A', {{"heads", 4}, {"kv_heads", 2}, {"head_dim", 6}, {"rotary_dim", 4}, {"rope_theta", 100.0}}},
};

ModelConfig config_for(const MixerCase& c, const std::string& pattern) {
  ModelConfig cfg = model_preset("tiny");
  cfg.d_model = 10;
  cfg.pattern = pattern;
  cfg.mixers[mixer_for_letter(c.letter).name] = c.section;
  cfg.complete_sections();
  cfg.validate();
  return cfg;
}

std::string case_name(const ::testing::TestParamInfo<MixerCase>& info) {
  return mixer_for_letter(info.param.letter).name + (info.param.section.contains("value_heads") ? "_grouped" : "");
}

class MixerConformance : public ::testing::TestWithParam<MixerCase> {
 protected:
  const Mixer& mixer = mixer_for_letter(GetParam().letter);
  ModelConfig cfg = config_for(GetParam(), std::string(1, GetParam().letter));
  uint64_t seed = fresh_seed();
  Rng rng{seed};
  std::unique_ptr<Layer> layer = mixer.make_layer("mixer", cfg, DType::F64, rng);
  // A length that the kernel's block does not divide (for blocks up to 12), short enough for
  // 1-token chunks.
  int64_t B = 2, T = std::clamp<int64_t>(3 * mixer.inner_block(cfg) + 5, 23, 41);
  Tensor x = random_tensor(rng, {B * T, cfg.d_model});
  Tensor dy = random_tensor(rng, {B * T, cfg.d_model});
  State state0, dstate_final;

  void SetUp() override {
    // The boundary state's shapes come from the layer itself: one token through it.
    ChunkCtx ctx;
    ctx.len = 1, ctx.batch = B, ctx.seq_len = T;
    State out;
    std::unique_ptr<Stash> stash;
    layer->forward(ctx, take_rows(x, B, T, 0, 1), {}, out, stash);
    const std::vector<StateTensorSpec> specs = mixer.boundary_state(cfg);
    ASSERT_EQ(out.size(), specs.size()) << "boundary state against the registry row";
    for (size_t i = 0; i < out.size(); ++i) {
      Shape want = specs[i].shape;
      if (specs[i].grows_with_chunks) want.insert(want.begin(), T);  // one row per token of the sequence
      want.insert(want.begin(), B);
      EXPECT_EQ(out[i].shape(), want) << "boundary state " << specs[i].name;
    }
    state0 = random_state_like(rng, out);
    dstate_final = random_state_like(rng, out);
  }

  void expect_split_matches(const std::vector<int64_t>& pieces, double tol) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << ", " << pieces.size() << " pieces");
    SplitRun u = run_split(*layer, x, B, T, state0, dy, dstate_final, {T});
    SplitRun s = run_split(*layer, x, B, T, state0, dy, dstate_final, pieces);
    EXPECT_LE(max_rel_diff(s.y, u.y), tol) << "output";
    EXPECT_LE(max_rel_diff(s.dx, u.dx), tol) << "dx";
    ASSERT_EQ(s.final_state.size(), u.final_state.size());
    for (size_t i = 0; i < s.final_state.size(); ++i) {
      EXPECT_LE(max_rel_diff(s.final_state[i], u.final_state[i]), tol) << "final state " << i;
      EXPECT_LE(max_rel_diff(s.dstate_initial[i], u.dstate_initial[i]), tol) << "initial-state gradient " << i;
    }
    auto params = layer->params();
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_LE(max_rel_diff(s.param_grads[i], u.param_grads[i]), tol) << params[i]->name;
  }
};

}  // namespace

TEST_P(MixerConformance, ChunkedEqualsUnchunked) {
  const int64_t block = mixer.inner_block(cfg);
  expect_split_matches({1, 2, T - 3}, 1e-12);
  expect_split_matches({block + 1, T - block - 1}, 1e-12);
  expect_split_matches({5, 11, 2, T - 18}, 1e-12);
  expect_split_matches(std::vector<int64_t>(T, 1), 1e-12);
}

TEST_P(MixerConformance, BackwardMatchesFiniteDifferencesAndAWrongOneFails) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  SplitRun u = run_split(*layer, x, B, T, state0, dy, dstate_final, {T});
  auto loss = [&]() {
    SplitRun r = run_split(*layer, x, B, T, state0, dy, dstate_final, {T});
    double l = dot(r.y, dy);
    for (size_t i = 0; i < r.final_state.size(); ++i) l += dot(r.final_state[i], dstate_final[i]);
    return l;
  };
  std::vector<Tensor> inputs{x}, grads{u.dx};
  for (size_t i = 0; i < state0.size(); ++i) inputs.push_back(state0[i]), grads.push_back(u.dstate_initial[i]);
  EXPECT_LE(fd_check_tensors(loss, inputs, grads, rng, 3), 1e-6) << "input and initial state";
  auto params = layer->params();
  size_t biggest = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_LE(fd_check_tensors(loss, {params[i]->value}, {u.param_grads[i]}, rng, 2), 1e-6) << params[i]->name;
    if (dot(u.param_grads[i], u.param_grads[i]) > dot(u.param_grads[biggest], u.param_grads[biggest])) biggest = i;
  }
  // Negative control: a backward that got one parameter's gradient's sign wrong is caught.
  Tensor wrong = u.param_grads[biggest].clone();
  for (int64_t i = 0; i < wrong.numel(); ++i) wrong.data<double>()[i] *= -1;
  EXPECT_GT(fd_check_tensors(loss, {params[biggest]->value}, {wrong}, rng, 2), 1e-3) << params[biggest]->name;
}

TEST_P(MixerConformance, ZeroStateEqualsNoState) {
  State zeros, zero_grads;
  for (const Tensor& t : state0) zeros.push_back(Tensor::zeros(t.shape(), t.dtype()));
  for (const Tensor& t : dstate_final) zero_grads.push_back(Tensor::zeros(t.shape(), t.dtype()));
  SplitRun none = run_split(*layer, x, B, T, {}, dy, {}, {7, T - 7});
  SplitRun given = run_split(*layer, x, B, T, zeros, dy, zero_grads, {7, T - 7});
  EXPECT_EQ(max_rel_diff(given.y, none.y), 0.0);
  EXPECT_EQ(max_rel_diff(given.dx, none.dx), 0.0);
  for (size_t i = 0; i < none.final_state.size(); ++i) {
    EXPECT_EQ(max_rel_diff(given.final_state[i], none.final_state[i]), 0.0) << "final state " << i;
    EXPECT_EQ(max_rel_diff(given.dstate_initial[i], none.dstate_initial[i]), 0.0) << "initial-state gradient " << i;
  }
  for (size_t i = 0; i < none.param_grads.size(); ++i)
    EXPECT_EQ(max_rel_diff(given.param_grads[i], none.param_grads[i]), 0.0) << layer->params()[i]->name;
}

// The mixer between GDN blocks, on two stages: "G<m>|<m>G".
std::string mixed_pattern(char letter) { return cat('G', letter, '|', letter, 'G'); }

TEST_P(MixerConformance, PipelinedChunkedStepEqualsOneStageOneChunk) {
  VerifyOptions o;
  o.model = config_for(GetParam(), mixed_pattern(GetParam().letter));
  o.stages = 2, o.microbatches = 2, o.batch = 2, o.seq_len = 45;
  o.chunkings = {{1, 2, 3, 39}, {45}, {8, 8, 8, 8, 13}, {20, 25}};
  const VerifyResult r = run_verify(o);
  EXPECT_TRUE(r.passed()) << "max relative gradient difference " << r.max_rel_grad_diff << ", loss "
                          << r.max_rel_loss_diff;
  EXPECT_LE(r.max_rel_grad_diff, 1e-10);
}

TEST_P(MixerConformance, RecomputeGivesBitwiseTheSameGradients) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  PipelineConfig pc;
  pc.model = config_for(GetParam(), mixed_pattern(GetParam().letter));
  pc.dtype = DType::F64;
  pc.stages = 2, pc.microbatches = 2, pc.chunk_lengths = {7, 20, 13};
  Batch b = random_batch(rng, 2, 40, pc.model.vocab_size);
  auto run = [&](bool recompute) {
    pc.recompute = recompute;
    auto pipe = make_local_pipeline(pc);
    const double loss = pipe->forward_backward(b).loss;
    std::map<std::string, Tensor> grads;
    for (Stage* s : pipe->stages())
      for (Param* p : s->model().params()) grads[p->name] = p->grad.clone();
    return std::make_pair(loss, grads);
  };
  auto [loss_plain, plain] = run(false);
  auto [loss_again, again] = run(true);
  EXPECT_EQ(loss_plain, loss_again);
  for (auto& [name, g] : plain) EXPECT_EQ(max_rel_diff(again.at(name), g), 0.0) << name;
}

// What the GPU suite's per-head-scalar band is relative to (gradient_terms.h): its step of
// 1-token chunks gives the whole-sequence gradients, and each entry's sum of |per-token terms|
// (of the decay's inner terms for a decay parameter) is at least |the entry|, and larger where
// the terms cancel.
TEST_P(MixerConformance, GradientTermMagnitudesBoundTheGradientsTheySum) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  const ModelConfig mc = config_for(GetParam(), std::string(2, GetParam().letter));
  Model m(mc, DType::F64);
  const Batch b = random_batch(rng, 2, 23, mc.vocab_size);
  auto params = m.params();
  zero_grads(params);
  forward_backward(m, b, 1, {b.seq_len});
  std::vector<Tensor> whole;
  std::vector<size_t> all, decay;
  for (size_t i = 0; i < params.size(); ++i) {
    whole.push_back(params[i]->grad.clone()), all.push_back(i);
    for (const std::string& f : GetParam().decay_fields)
      if (has_field(params[i]->name, f)) decay.push_back(i);
  }
  const std::vector<std::vector<double>> magnitude = gradient_term_magnitudes(m, b, all, decay);
  int64_t below = 0, cancelling = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_LE(max_rel_diff(params[i]->grad, whole[i]), 1e-10) << params[i]->name;
    // Rounding is allowed at the tensor's scale, as max_rel_diff measures it: an entry that is
    // itself 1e-9 of its tensor's largest (seen: an embedding row's, seed 6252870431319571114)
    // differs between the two sums by more than 1e-9 of itself.
    const double largest = largest_abs(whole[i]);
    for (int64_t e = 0; e < whole[i].numel(); ++e) {
      const double g = std::abs(whole[i].data<double>()[e]);
      below += magnitude[i][e] < g - 1e-9 * largest;
      cancelling += magnitude[i][e] > 1.01 * g;
    }
  }
  EXPECT_EQ(below, 0) << "entries whose terms' magnitudes are below the gradient";
  EXPECT_GT(cancelling, 0) << "no entry's terms cancel";
}

// The gradient one chunk's backward adds in a step cut into `lengths`: its tokens' terms.
std::vector<Tensor> terms_of_chunk(Model& model, const Batch& batch, const std::vector<int64_t>& lengths, int chunk) {
  auto params = model.params();
  zero_grads(params);
  const UnitPlan plan(batch, 1, lengths);
  StageExecutor stage(model.layers(), model.begin());
  LossStats stats;
  std::vector<Unit> units;
  for (int c = 0; c < plan.chunks(); ++c) units.push_back(plan.make_unit(0, c, &stats));
  for (Unit& u : units) stage.forward(u.ctx, u.tokens);
  std::vector<Tensor> before, terms;  // what later chunks left; what the chunk added to it
  for (int c = plan.chunks() - 1; c >= chunk; --c) {
    if (c == chunk)
      for (Param* p : params) before.push_back(p->grad.cast(DType::F64));
    stage.backward(units[c].ctx, Tensor());
  }
  for (size_t i = 0; i < params.size(); ++i) {
    terms.push_back(params[i]->grad.cast(DType::F64));
    for (int64_t e = 0; e < terms[i].numel(); ++e) terms[i].data<double>()[e] -= before[i].data<double>()[e];
  }
  return terms;
}

// The GPU suite's band for GDN's decay parameters on the CPU side of the gdn case the H200 flagged
// (seventh session, docs/design.md "The GPU conformance bands"): its error there, 3.06e-1 of the
// largest entry of blocks.1.mixer.A_log on A_log[0] (over the net and per-token bands), is inside
// the band; the gates' reduction counting one 64-token block twice (tokens 64 to 127 of both
// sequences, every decay parameter) is outside it.
TEST(PerHeadScalarBand, HoldsTheH200sGdnDecayErrorAndCatchesABlockCountedTwice) {
  const uint64_t seed = 7316831977980715641ull;
  ModelConfig cfg = gpu_test_model(seed);
  cfg.validate();
  Rng rng(seed);
  const int64_t T = 200;
  const Batch b = random_batch(rng, 2, T, cfg.vocab_size);  // as the GPU case draws it
  Model cpu(cfg, DType::F32);
  auto params = cpu.params();
  const std::vector<Tensor> block = terms_of_chunk(cpu, b, {64, 64, T - 128}, 1);
  zero_grads(params);
  forward_backward(cpu, b, 1, {T});
  std::vector<Tensor> ref, h200, doubled;
  for (Param* p : params) {
    ref.push_back(p->grad.cast(DType::F64));
    h200.push_back(ref.back().clone()), doubled.push_back(ref.back().clone());
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!has_field(params[i]->name, "A_log") && !has_field(params[i]->name, "dt_bias")) continue;
    for (int64_t e = 0; e < ref[i].numel(); ++e) doubled[i].data<double>()[e] += block[i].data<double>()[e];
    if (params[i]->name != "blocks.1.mixer.A_log") continue;
    h200[i].data<double>()[0] += 3.06e-1 * largest_abs(ref[i]);
  }
  PerHeadScalarBand band(cpu, b, {"A_log", "dt_bias"});
  const WorstGradError held = band.worst(h200, ref), caught = band.worst(doubled, ref);
  std::printf("[ gdn decay band, seed %llu ] the H200's error at %.2f of the band (%s); a block counted twice at "
              "%.2f (%s)\n",
              (unsigned long long)seed, held.err, held.where.c_str(), caught.err, caught.where.c_str());
  EXPECT_LE(held.err, 1.0) << held.where;
  EXPECT_GT(caught.err, 1.0) << caught.where;
}

TEST_P(MixerConformance, CheckpointRoundTripRestoresEveryWeight) {
  PipelineConfig pc;
  pc.model = config_for(GetParam(), mixed_pattern(GetParam().letter));
  pc.dtype = DType::F32;
  pc.stages = 2, pc.chunk_lengths = {8};
  auto src = make_local_pipeline(pc);
  for (Stage* s : src->stages())
    for (Param* p : s->model().params())
      for (int64_t i = 0; i < p->value.numel(); ++i) p->value.data<float>()[i] = float(rng.normal());
  TempDir dir;
  TrainOptions run;  // what the manifest records of the run
  run.model = pc.model, run.dtype = pc.dtype, run.stages = pc.stages;
  const std::string step_dir = save_checkpoint(*src, dir.path.string(), CheckpointState{1, 0, 0, run.to_json()}, 0);
  pc.stages = 1, pc.model.pattern = pc.model.blocks();  // and another stage split
  auto dst = make_local_pipeline(pc);
  load_checkpoint(*dst, step_dir);
  std::map<std::string, Tensor> saved;
  for (Stage* s : src->stages())
    for (Param* p : s->model().params()) saved[p->name] = p->value;
  size_t restored = 0;
  for (Stage* s : dst->stages())
    for (Param* p : s->model().params()) {
      ASSERT_TRUE(saved.count(p->name)) << p->name;
      EXPECT_EQ(std::memcmp(p->value.raw(), saved.at(p->name).raw(), p->value.nbytes()), 0) << p->name;
      ++restored;
    }
  EXPECT_EQ(restored, saved.size());
}

INSTANTIATE_TEST_SUITE_P(Mixers, MixerConformance, ::testing::ValuesIn(kMixerCases), case_name);

TEST(MixerRegistry, EveryRegisteredMixerIsInTheConformanceSuite) {
  for (const Mixer* m : all_mixers()) {
    bool listed = false;
    for (const MixerCase& c : kMixerCases) listed = listed || c.letter == m->letter;
    EXPECT_TRUE(listed) << "mixer " << m->name << " (" << m->letter << "): add it to kMixerCases";
  }
}

// A row's settings (fields that change how a device runs the mixer, not its results) are fields of
// its section.
TEST(MixerRegistry, SettingsAreFieldsOfTheSection) {
  for (const Mixer* m : all_mixers())
    for (const std::string& f : m->settings) EXPECT_TRUE(m->defaults.contains(f)) << m->name << "." << f;
}

// gdn.keep_sweep adds G, W, V_new and the entering states to a GDN block's stash, 1028 bytes per
// token and value head at 128 / 64: the width the depth predictions scale a measured stash by grows
// by that many bf16-sized values.
TEST(MixerRegistry, GdnKeptSweepWidensTheActivations) {
  ModelConfig m = model_preset("gdn-1.3b");
  const Mixer& gdn = mixer_for_letter('G');
  const double plain = gdn.activation_width(m);
  m.mixers["gdn"]["keep_sweep"] = true;
  EXPECT_DOUBLE_EQ(gdn.activation_width(m) - plain, 16 * 1028 / 2.0);
}
