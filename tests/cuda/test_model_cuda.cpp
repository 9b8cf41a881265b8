// The GPU part of the mixer conformance suite (tests/test_mixer_conformance.cpp has the CPU
// part): for every mixer with a GPU path, a two-block model of it on the GPU (bf16 activations
// and GEMMs, fp32 master weights, gradients and recurrent state) against the CPU model in fp32
// on the same weights and batch: loss and every parameter gradient within the bf16 band. On
// the GPU, chunked training with boundaries at multiples of kWeightGradTokens gives the
// unchunked loss statistics and every gradient bitwise (pinned GEMM algorithms, token-ordered
// reductions); with other boundaries, its error against the fp64 CPU model is at most twice
// the unchunked run's. A mixer joins with one line in kGpuMixerCases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/device_graph_cuda.h"
#include "kernels/cuda/side_stream_cuda.h"
#include "kernels/cuda/weight_grad_cuda.h"
#include "layer_testing.h"
#include "model/device_ops.h"
#include "model/device_path.h"
#include "model/mixer.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "per_head_scalar_band.h"
#include "pipeline/stage_executor.h"
#include "pipeline/units.h"
#include "test_util.h"
#include "train/step.h"

namespace stateflow {
namespace {

using testing::fresh_seed;
using testing::has_field;
using testing::kPerHeadScalars;
using testing::PerHeadScalarBand;
using testing::random_batch;
using testing::WorstGradError;

// Shapes each mixer's CUDA kernels support, as the mixer's config section.
struct GpuMixerCase {
  char letter;
  nlohmann::json section;
  // A weight whose gradient reaches it through a suffix sum over every later token (mamba3's
  // angle projection: the cumulative angle's gradient), which cancels as the per-head scalars'
  // sums do: it gets kSuffixSumBand instead of kTensorBand.
  const char* suffix_sum_weight = "";
  // Per-head scalars that reach the loss only through the decay of the mixer's state (GDN's
  // A_log and dt_bias): their terms cancel inside each token too (per_head_scalar_band.h).
  std::vector<std::string> decay_fields = {};
};
const GpuMixerCase kGpuMixerCases[] = {
    {'G', {{"heads", 2}, {"head_dk", 128}, {"head_dv", 128}, {"conv_size", 4}, {"block_size", 64}},
     "", {"A_log", "dt_bias"}},
    // grouped values (mixers/gdn/gdn_groups_cuda.h): two value heads per q/k head
    {'G', {{"heads", 2}, {"value_heads", 4}, {"head_dk", 128}, {"head_dv", 128}, {"conv_size", 4}, {"block_size", 64}},
     "", {"A_log", "dt_bias"}},
    // the core's forward sweep kept in the stash (gdn.keep_sweep), grouped values
    {'G', {{"heads", 2}, {"value_heads", 4}, {"head_dk", 128}, {"head_dv", 128}, {"conv_size", 4}, {"block_size", 64},
           {"keep_sweep", true}},
     "", {"A_log", "dt_bias"}},
    {'M', {{"heads", 2}, {"head_dim", 64}, {"state_size", 128}, {"rank", 1}, {"block_size", 64}}, "Wang"},
    {'M', {{"heads", 2}, {"head_dim", 64}, {"state_size", 128}, {"rank", 4}, {"block_size", 16}, {"output_norm", true}},
     "Wang"},
    {'A', {{"heads", 2}, {"kv_heads", 1}, {"head_dim", 128}, {"rotary_dim", 64}}},
};

// The mixer's name, and its rank where a case has one above 1 (MIMO), or "_grouped" (GDN value heads)
// and "_kept_sweep" (GDN's gdn.keep_sweep).
std::string case_name(const ::testing::TestParamInfo<GpuMixerCase>& info) {
  const nlohmann::json& s = info.param.section;
  const bool mimo = s.contains("rank") && s["rank"].get<int64_t>() > 1;
  return mixer_for_letter(info.param.letter).name + (mimo ? "_rank" + std::to_string(s["rank"].get<int64_t>()) : "") +
         (s.contains("value_heads") ? "_grouped" : "") + (s.value("keep_sweep", false) ? "_kept_sweep" : "");
}

// Two blocks of the mixer (gpu_test_model's widths: multiples of 8).
ModelConfig model_of(const GpuMixerCase& c, uint64_t seed) {
  ModelConfig cfg = testing::gpu_test_model(seed);
  cfg.pattern = std::string(2, c.letter);
  cfg.mixers = {{mixer_for_letter(c.letter).name, c.section}};
  cfg.complete_sections();
  cfg.validate();
  return cfg;
}

// What every test of a case starts with: a skip without a GPU, a fresh seed (named in every
// failure), the case's model config of that seed and the stream the batch is drawn from.
class MixerConformanceCuda : public ::testing::TestWithParam<GpuMixerCase> {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    init_cuda_backend();
    seed_trace_.emplace(__FILE__, __LINE__, "seed " + std::to_string(seed));
  }
  void TearDown() override { seed_trace_.reset(); }
  // The case's model on the GPU: fp32 master weights, bf16 activations.
  Model gpu_model() const { return Model(cfg, DType::F32, 0, Model::num_layers_of(cfg), Device::CUDA); }

  const uint64_t seed = fresh_seed();
  Rng rng{seed};
  const ModelConfig cfg = model_of(GetParam(), seed);

 private:
  std::optional<::testing::ScopedTrace> seed_trace_;
};

struct StepResult {
  double loss;
  double loss_sum;            // the step's LossStats sum (token order: chunk-invariant)
  std::vector<Tensor> grads;  // on the host
};

StepResult run_step(Model& m, const Batch& b, const std::vector<int64_t>& lengths, bool recompute = false) {
  auto params = m.params();
  zero_grads(params);
  const StepLoss l = forward_backward(m, b, 1, lengths, recompute);
  StepResult r{l.loss, l.stats.loss_sum, {}};
  for (Param* p : params) r.grads.push_back(p->grad.to(Device::CPU));
  return r;
}

// Normwise relative gradient error bands of the other parameters: bf16 rounding measured 2.0e-2
// to 3.8e-2 (the largest: mamba3_rank4's B_bias, a bias summed over tokens); a wrong path gives
// O(1). The suffix-summed weight: measured up to 7.0e-2, on a seed whose suffix sums cancel
// 111-fold (up to 133-fold seen; docs/design.md, "The GPU conformance bands").
constexpr double kTensorBand = 5e-2, kSuffixSumBand = 2e-1;

// The parameter (not a per-head scalar) whose normwise relative gradient error is the largest
// share of its band, its error and band.
WorstGradError worst_tensor_grad_error(Model& m, const StepResult& a, const StepResult& ref,
                                       const std::string& suffix_sum_weight) {
  WorstGradError worst;
  auto params = m.params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i]->value.numel() < kPerHeadScalars) continue;
    const double e = max_rel_diff(a.grads[i].cast(DType::F64), ref.grads[i].cast(DType::F64)),
                 band = has_field(params[i]->name, suffix_sum_weight) ? kSuffixSumBand : kTensorBand;
    if (worst.where.empty() || !(e / band <= worst.err / worst.band || std::isnan(worst.err)))
      worst = {e, band, params[i]->name};
  }
  return worst;
}

TEST_P(MixerConformanceCuda, LossAndGradientsMatchTheCpuModelInTheBf16Band) {
  Model cpu(cfg, DType::F32);
  Model gpu = gpu_model();
  const int64_t T = 200;  // not a multiple of C
  const Batch b = random_batch(rng, 2, T, cfg.vocab_size);
  const StepResult ref = run_step(cpu, b, {T});
  const StepResult got = run_step(gpu, b, {T});
  const double loss_err = std::abs(got.loss - ref.loss) / std::abs(ref.loss);
  const WorstGradError tensors = worst_tensor_grad_error(gpu, got, ref, GetParam().suffix_sum_weight),
                       scalars = PerHeadScalarBand(cpu, b, GetParam().decay_fields).worst(got.grads, ref.grads);
  std::printf("[ model on GPU vs CPU fp32 ] loss %.6f vs %.6f (rel %.2e), worst gradient rel error %.2e of band "
              "%.0e (%s), per-head scalars at %.2f of their band (%s)\n",
              got.loss, ref.loss, loss_err, tensors.err, tensors.band, tensors.where.c_str(), scalars.err,
              scalars.where.c_str());
  EXPECT_LE(loss_err, 1e-2);
  EXPECT_LE(tensors.err, tensors.band) << tensors.where;
  EXPECT_LE(scalars.err, 1.0) << scalars.where;
}

std::string lengths_name(const std::vector<int64_t>& lengths) {
  std::string s;
  for (int64_t l : lengths) {
    if (!s.empty()) s += '+';
    s += std::to_string(l);
  }
  return s;
}

// The first parameter whose gradient differs in any bit, or "" (the loss statistics first).
std::string first_difference(Model& m, const StepResult& a, const StepResult& b) {
  if (std::memcmp(&a.loss_sum, &b.loss_sum, sizeof(double)) != 0) return "loss_sum";
  auto params = m.params();
  for (size_t i = 0; i < params.size(); ++i)
    if (a.grads[i].nbytes() != b.grads[i].nbytes() ||
        std::memcmp(a.grads[i].raw(), b.grads[i].raw(), a.grads[i].nbytes()) != 0)
      return params[i]->name;
  return "";
}

// Cuts at multiples of kWeightGradTokens (which are multiples of every kernel's inner block:
// the GDN core's 64-token chunks, the 64-token blocks of the reductions): bitwise equal.
TEST_P(MixerConformanceCuda, ChunksAtMultiplesOfTheWeightGradStepAreBitwiseTheUnchunkedStep) {
  Model gpu = gpu_model();
  const int64_t S = kWeightGradTokens, T = 3 * S + 128;
  const Batch b = random_batch(rng, 2, T, cfg.vocab_size);
  const StepResult whole = run_step(gpu, b, {T});
  EXPECT_EQ(first_difference(gpu, run_step(gpu, b, {T}), whole), "") << "not repeatable run to run";
  for (const std::vector<int64_t>& lengths :
       {std::vector<int64_t>{S, T - S}, std::vector<int64_t>{S, S, T - 2 * S}, std::vector<int64_t>{2 * S, T - 2 * S},
        std::vector<int64_t>{S, S, S, T - 3 * S}}) {
    const StepResult got = run_step(gpu, b, lengths);
    const std::string diff = first_difference(gpu, got, whole);
    std::printf("[ chunks %s vs whole ] loss %.17g vs %.17g, first difference: %s\n", lengths_name(lengths).c_str(),
                got.loss, whole.loss, diff.empty() ? "none (bitwise equal)" : diff.c_str());
    EXPECT_EQ(diff, "") << "chunks " << lengths_name(lengths);
  }
}

// gdn.keep_sweep's tests: the first GPU case's model (a GDN layer), a fresh seed in every failure's trace.
class GdnKeptSweepCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_GPU();
    init_cuda_backend();
  }

  const uint64_t seed = fresh_seed();
  const ::testing::ScopedTrace seed_trace{__FILE__, __LINE__, "seed " + std::to_string(seed)};
  Rng rng{seed};
  ModelConfig cfg = model_of(kGpuMixerCases[0], seed);
};

// What the planner prices a kept sweep with: a unit's stash as the stage executor (and the cost
// profile, layer by layer) counts it, the tracker's activations. gdn.keep_sweep adds exactly G, W,
// V_new and the entering states, 1028 bytes per token and value head and GDN layer (a chunk of
// 64-token multiples: no padded sub-chunk).
TEST_F(GdnKeptSweepCuda, StashGrowsByTheKeptBytes) {
  const int64_t B = 2, T = 512, heads = cfg.mixers["gdn"]["heads"].get<int64_t>();
  const Batch b = random_batch(rng, B, T, cfg.vocab_size);
  auto stash_bytes = [&](bool keep_sweep) {
    cfg.mixers["gdn"]["keep_sweep"] = keep_sweep;
    const int n = Model::num_layers_of(cfg);
    Model model(cfg, DType::F32, 0, n, Device::CUDA);
    StageExecutor stage(model.layers(0, n), 0);
    LossStats stats;
    const UnitPlan plan(b, 1, {T});
    const Unit unit = plan.make_unit(0, 0, &stats);
    stage.forward(unit.ctx, unit.tokens);
    return stage.stash_bytes();
  };
  const int64_t plain = stash_bytes(false), kept = stash_bytes(true);
  std::printf("[ stash of a unit, 2 GDN blocks, %lld x %lld tokens ] %lld bytes, %lld with the sweep kept\n",
              (long long)B, (long long)T, (long long)plain, (long long)kept);
  EXPECT_EQ(kept - plain, 1028 * heads * B * T * 2);
}

// The layers' work on the side stream (kernels/cuda/side_stream_cuda.h) gives bitwise the step
// with everything on the main stream, chunked and unchunked: with each layer waiting for its
// weight gradients, and with them left running into the next layer's backward (side_defer);
// each also with the norms' and convs' dw reductions on the side stream (dw_beside).
TEST_P(MixerConformanceCuda, SideStreamWorkGivesBitwiseTheSerialStep) {
  Model gpu = gpu_model();
  const int64_t S = kWeightGradTokens, T = S + 200;
  const Batch b = random_batch(rng, 2, T, cfg.vocab_size);
  bool& overlap = side_work_enabled_for_thread();
  bool& defer = side_work_deferral_for_thread();
  bool& dw_beside = dw_beside_for_thread();
  const bool was_overlap = overlap, was_defer = defer, was_dw_beside = dw_beside;
  for (const std::vector<int64_t>& lengths : {std::vector<int64_t>{T}, std::vector<int64_t>{S, 77, T - S - 77}}) {
    overlap = false;
    const StepResult serial = run_step(gpu, b, lengths);
    overlap = true;
    for (const bool deferred : {false, true})
      for (const bool reductions : {false, true}) {
        defer = deferred, dw_beside = reductions;
        const StepResult beside = run_step(gpu, b, lengths);
        const std::string diff = first_difference(gpu, beside, serial);
        std::printf("[ chunks %s, side stream%s%s vs serial ] first difference: %s\n", lengths_name(lengths).c_str(),
                    deferred ? " deferred" : "", reductions ? ", dw reductions beside" : "",
                    diff.empty() ? "none (bitwise equal)" : diff.c_str());
        EXPECT_EQ(diff, "") << "chunks " << lengths_name(lengths) << (deferred ? ", deferred" : "")
                            << (reductions ? ", dw reductions beside" : "");
      }
    overlap = was_overlap, defer = was_defer, dw_beside = was_dw_beside;
  }
}

// The blocks' work recorded as CUDA graphs (kernels/cuda/device_graph_cuda.h) gives bitwise the
// step launched kernel by kernel, unchunked and chunked (the side stream and its deferred weight
// gradients on, as by default), with each pass's four block layers in one graph and in a graph
// each (STATEFLOW_GRAPH_LAYERS=1: side work deferred at every cut); middle chunks of one length
// update one graph instead of instantiating their own. With recomputation (a layer's forward
// recorded again inside its backward) graphs give bitwise the recomputed step without them.
TEST_P(MixerConformanceCuda, GraphsGiveBitwiseTheStepWithoutThem) {
  Model gpu = gpu_model();
  const int64_t S = kWeightGradTokens, T = S + 200, blocks = 4;
  const Batch b = random_batch(rng, 2, T, cfg.vocab_size);
  bool& graphs = device_graphs_enabled_for_thread();
  const bool was = graphs;
  const char* env = std::getenv("STATEFLOW_GRAPH_LAYERS");
  const std::string was_layers = env ? env : "";
  for (const std::vector<int64_t>& lengths : {std::vector<int64_t>{T}, std::vector<int64_t>{S, 77, T - S - 77},
                                              std::vector<int64_t>{512, 512, 512, 512, T - S}}) {
    graphs = false;
    const StepResult plain = run_step(gpu, b, lengths);
    for (const int64_t per_graph : {blocks, int64_t(1)}) {
      setenv("STATEFLOW_GRAPH_LAYERS", std::to_string(per_graph).c_str(), 1);
      graphs = true;
      const DeviceGraphCounts before = cuda_graph_counts();
      const StepResult recorded = run_step(gpu, b, lengths);
      const DeviceGraphCounts after = cuda_graph_counts();
      graphs = was;
      const std::string diff = first_difference(gpu, recorded, plain);
      const int64_t launched = after.launched - before.launched;
      std::printf("[ chunks %s, %lld layers per graph vs no graphs ] %lld graphs launched (%.0f nodes each, %lld "
                  "updated, %lld instantiated); first difference: %s\n",
                  lengths_name(lengths).c_str(), (long long)per_graph, (long long)launched,
                  double(after.nodes - before.nodes) / double(std::max<int64_t>(launched, 1)),
                  (long long)(after.updated - before.updated), (long long)(after.instantiated - before.instantiated),
                  diff.empty() ? "none (bitwise equal)" : diff.c_str());
      EXPECT_EQ(diff, "") << "chunks " << lengths_name(lengths) << ", " << per_graph << " layers per graph";
      // a forward and a backward per chunk, each of blocks / per_graph graphs
      EXPECT_EQ(launched, 2 * int64_t(lengths.size()) * (blocks / per_graph)) << lengths_name(lengths);
      if (lengths.size() == 5)  // chunks 1 to 3: one shape, so chunks 2 and 3 update its graphs
        EXPECT_GE(after.updated - before.updated, 4 * (blocks / per_graph)) << lengths_name(lengths);
    }
    if (lengths.size() == 3) {  // recomputation records each layer's forward again inside its backward
      setenv("STATEFLOW_GRAPH_LAYERS", std::to_string(blocks).c_str(), 1);
      graphs = false;
      const StepResult launched_one_by_one = run_step(gpu, b, lengths, /*recompute=*/true);
      graphs = true;
      const StepResult recorded = run_step(gpu, b, lengths, /*recompute=*/true);
      graphs = was;
      const std::string diff = first_difference(gpu, recorded, launched_one_by_one);
      std::printf("[ chunks %s, recomputed, graphs vs no graphs ] first difference: %s\n",
                  lengths_name(lengths).c_str(), diff.empty() ? "none (bitwise equal)" : diff.c_str());
      EXPECT_EQ(diff, "") << "chunks " << lengths_name(lengths) << ", recomputed with graphs";
    }
  }
  if (was_layers.empty())
    unsetenv("STATEFLOW_GRAPH_LAYERS");
  else
    setenv("STATEFLOW_GRAPH_LAYERS", was_layers.c_str(), 1);
}

// Mean over the parameters but the per-head scalars of the normwise relative gradient errors:
// stabler than the worst one, yet a lost boundary state, which puts O(1) errors in several
// parameters, moves it by far more than 2x. A per-head scalar's normwise error is its
// cancellation times a bf16 rounding and is drawn anew by every change of rounding (a cut, a
// fused GEMM): one at 0.8 of its net (mamba3's dt_bias was) adds 0.02 to a mean of ~0.012 over
// 40 parameters; the per-head scalars are held to their band instead (PerHeadScalarBand).
double mean_grad_error(Model& m, const StepResult& a, const StepResult& ref) {
  auto params = m.params();
  double sum = 0;
  int64_t n = 0;
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i]->value.numel() >= kPerHeadScalars)
      sum += max_rel_diff(a.grads[i].cast(DType::F64), ref.grads[i].cast(DType::F64)), ++n;
  return sum / double(n);
}

// Boundaries off the multiples of kWeightGradTokens: the split run's error against the fp64 CPU model is at
// most twice the unsplit run's (loss; mean gradient error), and its per-head scalars stay in
// their band. The loss is one number whose bf16 error can be near zero by chance, so its bound
// has a floor of 1e-4 relative.
TEST_P(MixerConformanceCuda, ChunksElsewhereStayWithinTwiceTheUnchunkedError) {
  Model cpu(cfg, DType::F64);
  Model gpu = gpu_model();
  const int64_t T = 200;
  const Batch b = random_batch(rng, 2, T, cfg.vocab_size);
  const StepResult ref = run_step(cpu, b, {T});
  const StepResult whole = run_step(gpu, b, {T});
  const double whole_loss_err = std::abs(whole.loss_sum - ref.loss_sum) / std::abs(ref.loss_sum);
  const double whole_grad_err = mean_grad_error(gpu, whole, ref);
  PerHeadScalarBand band(cpu, b, GetParam().decay_fields);
  for (const std::vector<int64_t>& lengths : {std::vector<int64_t>{77, 50, 73}, std::vector<int64_t>{100, 100},
                                              std::vector<int64_t>{64, 1, 135}}) {
    const StepResult got = run_step(gpu, b, lengths);
    const double loss_err = std::abs(got.loss_sum - ref.loss_sum) / std::abs(ref.loss_sum);
    const double grad_err = mean_grad_error(gpu, got, ref);
    const WorstGradError worst = worst_tensor_grad_error(gpu, got, ref, GetParam().suffix_sum_weight),
                         scalars = band.worst(got.grads, ref.grads);
    std::printf("[ chunks %s vs fp64 CPU ] loss rel error %.2e (unsplit %.2e), mean gradient error %.2e (unsplit "
                "%.2e), worst tensor %.2e (%s), per-head scalars at %.2f of their band (%s)\n",
                lengths_name(lengths).c_str(), loss_err, whole_loss_err, grad_err, whole_grad_err, worst.err,
                worst.where.c_str(), scalars.err, scalars.where.c_str());
    EXPECT_LE(loss_err, 2 * std::max(whole_loss_err, 1e-4)) << lengths_name(lengths);
    EXPECT_LE(grad_err, 2 * whole_grad_err) << lengths_name(lengths);
    EXPECT_LE(scalars.err, 1.0) << lengths_name(lengths) << ": " << scalars.where;
  }
}

// Fused projections (levers fused_proj and fused_mlp: the GDN's q, k, v and output-gate
// projections, and the MLP's x W1 and x W3, as one GEMM over weights side by side, and each group's dx as one GEMM over
// their gradients side by side; model/param.h's shared bf16 copies) against the separate GEMMs,
// both against the fp64 CPU model: the fused step's error is at most twice the separate one's
// (loss; mean gradient error), its per-head scalars stay in their band, and its chunks at
// multiples of kWeightGradTokens stay bitwise.
TEST_P(MixerConformanceCuda, FusedProjectionsStayWithinTwiceTheSeparateError) {
  auto model_with = [&](bool fused) {
    testing::FlagScope gdn(bf16_group_shared_for_thread(kGdnInProj), fused),
        mlp(bf16_group_shared_for_thread(kMlpUpProj), fused);
    return gpu_model();
  };
  Model separate = model_with(false), fused = model_with(true);
  auto shared_copies = [](Model& m) {
    int64_t n = 0;
    for (Param* p : m.params()) n += p->bf16_ld > 0;
    return n;
  };
  EXPECT_EQ(shared_copies(separate), 0);
  // two blocks: W1 and W3 of each MLP, and for a GDN Wq, Wk, Wv and Wg
  EXPECT_EQ(shared_copies(fused), 2 * (2 + (GetParam().letter == 'G' ? 4 : 0)));
  Model cpu(cfg, DType::F64);
  const int64_t T = 200;
  const Batch b = random_batch(rng, 2, T, cfg.vocab_size);
  const StepResult ref = run_step(cpu, b, {T});
  double loss_err[2], grad_err[2];
  WorstGradError scalars;
  for (const bool fuse : {false, true}) {
    const StepResult got = run_step(fuse ? fused : separate, b, {T});
    loss_err[fuse] = std::abs(got.loss_sum - ref.loss_sum) / std::abs(ref.loss_sum);
    grad_err[fuse] = mean_grad_error(fused, got, ref);
    if (fuse) scalars = PerHeadScalarBand(cpu, b, GetParam().decay_fields).worst(got.grads, ref.grads);
  }
  std::printf("[ fused vs separate projections, against fp64 CPU ] loss rel error %.2e vs %.2e, mean gradient error "
              "%.2e vs %.2e, fused per-head scalars at %.2f of their band (%s)\n",
              loss_err[1], loss_err[0], grad_err[1], grad_err[0], scalars.err, scalars.where.c_str());
  EXPECT_LE(loss_err[1], 2 * std::max(loss_err[0], 1e-4));
  EXPECT_LE(grad_err[1], 2 * grad_err[0]);
  EXPECT_LE(scalars.err, 1.0) << scalars.where;

  const int64_t S = kWeightGradTokens, TL = S + 128;
  const Batch long_batch = random_batch(rng, 1, TL, cfg.vocab_size);
  const std::string diff = first_difference(fused, run_step(fused, long_batch, {S, TL - S}),
                                            run_step(fused, long_batch, {TL}));
  EXPECT_EQ(diff, "") << "fused, chunks " << S << "+" << TL - S;
}

INSTANTIATE_TEST_SUITE_P(Mixers, MixerConformanceCuda, ::testing::ValuesIn(kGpuMixerCases), case_name);

// gdn.keep_sweep keeps the core's forward sweep results from each layer's forward to its
// backward instead of sweeping again: the loss statistics and every gradient bitwise those of
// the step without it, unchunked and chunked (at the weight-gradient step and elsewhere).
TEST_F(GdnKeptSweepCuda, GivesBitwiseTheStepWithoutIt) {
  Model plain(cfg, DType::F32, 0, Model::num_layers_of(cfg), Device::CUDA);
  cfg.mixers["gdn"]["keep_sweep"] = true;
  cfg.validate();
  Model kept(cfg, DType::F32, 0, Model::num_layers_of(cfg), Device::CUDA);  // the same seed: the same weights
  const int64_t S = kWeightGradTokens, T = S + 200;
  const Batch b = random_batch(rng, 2, T, cfg.vocab_size);
  for (const std::vector<int64_t>& lengths : {std::vector<int64_t>{T}, std::vector<int64_t>{S, 77, T - S - 77}}) {
    const std::string diff = first_difference(plain, run_step(kept, b, lengths), run_step(plain, b, lengths));
    std::printf("[ chunks %s, sweep kept vs swept again ] first difference: %s\n", lengths_name(lengths).c_str(),
                diff.empty() ? "none (bitwise equal)" : diff.c_str());
    EXPECT_EQ(diff, "") << "chunks " << lengths_name(lengths);
  }
}

TEST(MixerRegistryCuda, EveryMixerWithAGpuPathIsInTheGpuConformanceSuite) {
  for (const Mixer* m : all_mixers()) {
    if (!has_device_path(m->name)) continue;
    bool listed = false;
    for (const GpuMixerCase& c : kGpuMixerCases) listed = listed || c.letter == m->letter;
    EXPECT_TRUE(listed) << "mixer " << m->name << " has a GPU path: add it to kGpuMixerCases";
  }
}

}  // namespace
}  // namespace stateflow
