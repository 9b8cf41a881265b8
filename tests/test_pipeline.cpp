// The pipeline engine: P stages x N chunks x M microbatches give the gradients of one stage
// and one chunk (float64), for every schedule kind; measured stash memory follows the model;
// a failed or stalled stage ends the step with an error naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "layer_testing.h"
#include "model/flops.h"
#include "model/model.h"
#include "pipeline/local_transport.h"
#include "pipeline/partition.h"
#include "pipeline/pipeline.h"
#include "test_util.h"
#include "pipeline/chunking.h"
#include "train/step.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

ModelConfig four_block_tiny() {
  ModelConfig c = model_preset("tiny");
  c.pattern = "GGGG";
  return c;
}

struct Reference {
  double loss;
  std::map<std::string, Tensor> grads;
};

Reference one_stage_one_chunk(const ModelConfig& cfg, const Batch& b) {
  Model m(cfg, DType::F64);
  StepLoss l = forward_backward(m, b, 1, {b.seq_len});
  Reference r{l.loss, {}};
  for (Param* p : m.params()) r.grads[p->name] = p->grad.clone();
  return r;
}

// Worst relative difference of the pipeline's loss and gradients against the reference.
double pipeline_vs_reference(const PipelineConfig& pc, const Batch& b, const Reference& ref) {
  auto pipe = make_local_pipeline(pc);
  PipelineStepResult r = pipe->forward_backward(b);
  double worst = std::abs(r.loss - ref.loss) / std::abs(ref.loss);
  size_t seen = 0;
  for (Stage* s : pipe->stages())
    for (Param* p : s->model().params()) {
      worst = std::max(worst, max_rel_diff(p->grad, ref.grads.at(p->name)));
      ++seen;
    }
  EXPECT_EQ(seen, ref.grads.size()) << "the stages together must own every parameter once";
  return worst;
}

}  // namespace

TEST(Pipeline, StagesAndChunksGiveTheGradientsOfOneStageOneChunk) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  PipelineConfig pc;
  pc.model = four_block_tiny();
  pc.dtype = DType::F64;
  const int64_t T = 29;
  Batch b = random_batch(rng, 3, T, pc.model.vocab_size);
  Reference ref = one_stage_one_chunk(pc.model, b);
  for (int P : {2, 3, 4})
    for (int N : {1, 2, 4, 8})
      for (int M : {1, 3}) {
        pc.stages = P, pc.microbatches = M, pc.chunk_lengths = even_chunk_lengths(T, N);
        EXPECT_LE(pipeline_vs_reference(pc, b, ref), 1e-10) << "P=" << P << " N=" << N << " M=" << M;
      }
  pc.stages = 3, pc.microbatches = 3, pc.chunk_lengths = {1, 9, 2, 17};
  EXPECT_LE(pipeline_vs_reference(pc, b, ref), 1e-10) << "uneven chunks";
  pc.schedule = ScheduleKind::GPipe;
  EXPECT_LE(pipeline_vs_reference(pc, b, ref), 1e-10) << "gpipe";
  pc.schedule = ScheduleKind::OneFOneB, pc.chunk_lengths = {T};
  EXPECT_LE(pipeline_vs_reference(pc, b, ref), 1e-10) << "1f1b";
}

TEST(Pipeline, StashPeakOnStageZeroFollowsTheModel) {
  Rng rng(fresh_seed());
  PipelineConfig pc;
  pc.model = four_block_tiny();
  pc.dtype = DType::F64;
  pc.stages = 4;
  const int64_t T = 256;
  Batch b1 = random_batch(rng, 1, T, pc.model.vocab_size);
  Batch b4 = random_batch(rng, 4, T, pc.model.vocab_size);
  auto peak = [&](ScheduleKind kind, int M, int N, const Batch& b) {
    pc.schedule = kind, pc.microbatches = M, pc.chunk_lengths = even_chunk_lengths(T, N);
    auto pipe = make_local_pipeline(pc);
    pipe->forward_backward(b);
    return double(pipe->stages()[0]->executor().peak_stash_bytes());
  };
  const double one_sequence = peak(ScheduleKind::OneFOneB, 1, 1, b1);
  const double one_f_one_b = peak(ScheduleKind::OneFOneB, 4, 1, b4);
  const int P = 4, N = 8;
  const double stateflow = peak(ScheduleKind::StateFlow, 4, N, b4);
  ASSERT_GT(one_sequence, 0);
  EXPECT_NEAR(one_f_one_b / one_sequence, P, 0.1 * P) << "1f1b holds P whole sequences on stage 0";
  const double expected = double(N + P - 1) / N;
  EXPECT_NEAR(stateflow / one_sequence, expected, 0.1 * expected) << "stateflow holds (N+P-1)/N of one";
}

TEST(Pipeline, RecomputationGivesBitwiseTheSameGradientsInLessMemory) {
  Rng rng(fresh_seed());
  PipelineConfig pc;
  pc.model = four_block_tiny();
  pc.dtype = DType::F64;
  pc.stages = 2, pc.microbatches = 2, pc.chunk_lengths = {7, 20, 13};
  Batch b = random_batch(rng, 2, 40, pc.model.vocab_size);
  auto run = [&](bool recompute, std::map<std::string, Tensor>& grads) {
    pc.recompute = recompute;
    auto pipe = make_local_pipeline(pc);
    PipelineStepResult r = pipe->forward_backward(b);
    for (Stage* s : pipe->stages())
      for (Param* p : s->model().params()) grads[p->name] = p->grad.clone();
    int64_t targets = 0;
    for (int32_t t : b.targets) targets += t >= 0;
    EXPECT_EQ(r.stats.counted, targets) << "every answer counted once, also when forwards are redone";
    return std::make_pair(r.loss, pipe->stages()[0]->executor().peak_stash_bytes());
  };
  std::map<std::string, Tensor> plain, again;
  auto [loss_plain, stash_plain] = run(false, plain);
  auto [loss_again, stash_again] = run(true, again);
  EXPECT_EQ(loss_plain, loss_again);
  for (auto& [name, g] : plain) EXPECT_EQ(max_rel_diff(again.at(name), g), 0.0) << name;
  EXPECT_LT(stash_again, stash_plain / 3) << "layer inputs only, instead of every activation";
}

namespace {
// Wraps a transport so that its stage stalls: what it sends is never delivered, and a receive
// hangs (for three timeouts, then gives up) instead of timing out like a live stage would.
class StalledTransport : public Transport {
 public:
  StalledTransport(std::unique_ptr<Transport> inner, double timeout_s) : inner_(std::move(inner)), timeout_s_(timeout_s) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string name() const override { return "stalled"; }
  void send(int, const MessageTag&, const Tensor&) override {}
  Tensor recv(int, const MessageTag&, const MessageSpec&) override {
    std::this_thread::sleep_for(std::chrono::duration<double>(3 * timeout_s_));
    fail("the stalled stage woke up");
  }
  double all_reduce_sum(double v) override { return inner_->all_reduce_sum(v); }
  double all_reduce_max(double v) override { return inner_->all_reduce_max(v); }
  void flush() override {}
  void abort(const std::string& reason) override { inner_->abort(reason); }

 private:
  std::unique_ptr<Transport> inner_;
  double timeout_s_;
};
}  // namespace

TEST(Pipeline, StalledStageEndsTheStepWithAnErrorNamingIt) {
  Rng rng(fresh_seed());
  PipelineConfig pc;
  pc.model = four_block_tiny();
  pc.stages = 2, pc.chunk_lengths = {8, 8};
  pc.timeout_s = 0.5;
  auto endpoints = make_local_transports(2, pc.timeout_s);
  endpoints[0] = std::make_unique<StalledTransport>(std::move(endpoints[0]), pc.timeout_s);
  Pipeline pipe(pc, std::move(endpoints));
  Batch b = random_batch(rng, 1, 16, pc.model.vocab_size);
  auto t0 = std::chrono::steady_clock::now();
  try {
    pipe.forward_backward(b);
    FAIL() << "a stalled stage went unnoticed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("from stage 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("stalled or died"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

// reshape() changes what a step runs (schedule, microbatches, chunks, recomputation), never
// what the stages were built with: that needs another pipeline, and the error says so.
TEST(Pipeline, ReshapeRefusesWhatOnlyAnotherPipelineCanChange) {
  PipelineConfig pc;
  pc.model = four_block_tiny();
  pc.stages = 2, pc.chunk_lengths = {8, 8};
  auto pipe = make_local_pipeline(pc);
  PipelineConfig other = pc;
  other.model.seed += 1;
  expect_error([&] { pipe->reshape(other); }, "reshape cannot change the model of a pipeline (build another one)");
  other = pc, other.dtype = DType::F64;
  expect_error([&] { pipe->reshape(other); }, "cannot change the dtype");
  other = pc, other.adamw.beta1 = 0.5;
  expect_error([&] { pipe->reshape(other); }, "cannot change the optimizer");
  other = pc, other.split_sms = true;
  expect_error([&] { pipe->reshape(other); }, "cannot change the SM split");
  other = pc, other.schedule = ScheduleKind::OneFOneB, other.microbatches = 2, other.chunk_lengths = {16};
  other.recompute = true;
  pipe->reshape(other);
  EXPECT_EQ(pipe->config().schedule, ScheduleKind::OneFOneB);
  EXPECT_EQ(pipe->stages()[0]->schedule().kind, ScheduleKind::OneFOneB);
  EXPECT_EQ(pipe->stages()[0]->schedule().M, 2);
  // A step of the reshaped pipeline is a step of one built that way.
  Rng rng(fresh_seed());
  const Batch b = random_batch(rng, 2, 16, pc.model.vocab_size);
  EXPECT_EQ(pipe->forward_backward(b).loss, make_local_pipeline(other)->forward_backward(b).loss);
}

TEST(Pipeline, BadShapesAreRejectedWithTheFix) {
  PipelineConfig pc;
  pc.model = model_preset("tiny");  // 2 blocks
  pc.stages = 3, pc.chunk_lengths = {4};
  expect_error([&] { make_local_pipeline(pc); }, "at most 2 stages");
  pc.stages = 2, pc.schedule = ScheduleKind::OneFOneB, pc.chunk_lengths = {2, 2};
  EXPECT_THROW(make_local_pipeline(pc), Error);
  pc.model.pattern = "G|G|G";
  pc.schedule = ScheduleKind::StateFlow;
  expect_error([&] { make_local_pipeline(pc); }, "cuts the model into 3 stages");
  pc.model.pattern = "GG", pc.split_sms = true;  // on the CPU: no GPU to split
  expect_error([&] { make_local_pipeline(pc); }, "--sm-split splits one GPU's multiprocessors");
  expect_error([&] { make_local_pipeline(pc); }, "it needs --device cuda, --transport local and --stages 2 or more");
}

TEST(Partition, EvenByDefaultOrAsThePatternSays) {
  ModelConfig c = model_preset("tiny");
  c.pattern = "GGGGG";  // layers: 0 emb, 1..10 blocks, 11 head
  auto r = stage_layer_ranges(c, 2);
  EXPECT_EQ(r, (std::vector<std::pair<int, int>>{{0, 7}, {7, 12}}));
  c.pattern = "G|GGGG";
  r = stage_layer_ranges(c, 2);
  EXPECT_EQ(r, (std::vector<std::pair<int, int>>{{0, 3}, {3, 12}}));
  c.pattern = "G|SGS";
  c.complete_sections();
  EXPECT_EQ(stage_blocks(c, 2), (std::vector<std::string>{"G", "SGS"}));
  c.pattern = "G|GXG";
  EXPECT_THROW(stage_layer_ranges(c, 2), Error);
}

TEST(Pipeline, LocatesTheFirstNonfiniteGradientOfTheBackwardPass) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  PipelineConfig pc;
  pc.model = four_block_tiny();
  pc.stages = 3, pc.chunk_lengths = {4, 4};
  auto pipe = make_local_pipeline(pc);
  pipe->forward_backward(random_batch(rng, 1, 8, pc.model.vocab_size));
  EXPECT_TRUE(std::isfinite(pipe->grad_norm()));
  EXPECT_EQ(pipe->locate_nonfinite_grad().stage, -1);
  std::vector<std::pair<int, Param*>> all;  // (stage, param) in model order
  for (Stage* s : pipe->stages())
    for (Param* p : s->model().params()) all.push_back({s->rank(), p});
  size_t a = rng.below(all.size()), b = rng.below(all.size());
  for (size_t i : {a, b}) all[i].second->grad.data<float>()[0] = i == a ? INFINITY : NAN;
  EXPECT_FALSE(std::isfinite(pipe->grad_norm()));
  Pipeline::NonfiniteGrad where = pipe->locate_nonfinite_grad();
  EXPECT_EQ(where.stage, all[std::max(a, b)].first);
  EXPECT_EQ(where.param, all[std::max(a, b)].second->name);
}

TEST(Pipeline, OutOfMemoryOnAStageThreadSaysWhichSettingToChange) {
  PipelineConfig pc;
  pc.model = model_preset("tiny");
  pc.model.vocab_size = int64_t(1) << 30, pc.model.d_model = 1 << 16;  // a 256 TiB embedding
  pc.model.mixers["gdn"] = {{"heads", 1}, {"head_dk", 1}, {"head_dv", 1}};  // and little else
  pc.model.mlp_hidden = 1;
  pc.model.complete_sections();
  pc.stages = 2, pc.chunk_lengths = {8};
  expect_error([&] { make_local_pipeline(pc); }, "out of host memory allocating 256.00 TiB for weights on stage ");
  expect_error([&] { make_local_pipeline(pc); }, "use a smaller model (d_model, number of blocks, vocab_size, mlp_hidden)");
}

TEST(Pipeline, BadAllocOnAStageThreadBecomesAnErrorNamingTheStage) {
  // A transport whose receives fail as a container's allocation would.
  struct OutOfMemoryTransport : LocalTransport {
    using LocalTransport::LocalTransport;
    Tensor recv(int, const MessageTag&, const MessageSpec&) override { throw std::bad_alloc(); }
  };
  PipelineConfig pc;
  pc.model = model_preset("tiny");
  pc.stages = 2, pc.chunk_lengths = {4};
  std::vector<std::unique_ptr<Transport>> endpoints;
  auto hub = std::make_shared<LocalHub>(2, 5.0);  // owned by the endpoints alone, as in a real run
  endpoints.push_back(std::make_unique<LocalTransport>(hub, 0));
  endpoints.push_back(std::make_unique<OutOfMemoryTransport>(std::move(hub), 1));
  Pipeline pipe(pc, std::move(endpoints));
  Rng rng(fresh_seed());
  expect_error([&] { pipe.forward_backward(random_batch(rng, 1, 4, pc.model.vocab_size)); },
               "stage 1 ran out of host memory: use more chunks (--chunks)");
}

TEST(Partition, WithoutCutsTheLargestStageCostIsTheSmallestPossible) {
  // Blocks of two costs (G and the cheaper S): the cut by cost against every contiguous cut.
  ModelConfig c = model_preset("tiny");
  c.pattern = "GSSSGGSSG";
  c.complete_sections();
  std::vector<double> cost;
  for (char letter : c.blocks()) {
    const BlockFlops f = block_flops_per_token(c, letter, 1);  // the cut weighs attention at one key
    cost.push_back(f.forward() + f.backward());
  }
  ASSERT_NE(cost[0], cost[1]) << "the test needs blocks of different costs";
  auto stage_costs = [&](const std::vector<int>& first_blocks) {  // first block of each stage
    std::vector<double> out;
    for (size_t r = 0; r < first_blocks.size(); ++r) {
      const int end = r + 1 < first_blocks.size() ? first_blocks[r + 1] : int(cost.size());
      double sum = 0;
      for (int b = first_blocks[r]; b < end; ++b) sum += cost[b];
      out.push_back(sum);
    }
    return *std::max_element(out.begin(), out.end());
  };
  for (int P : {2, 3}) {
    std::vector<int> chosen;
    for (auto [begin, end] : stage_layer_ranges(c, P)) chosen.push_back(begin == 0 ? 0 : (begin - 1) / 2);
    double best = 1e300;
    const int n = int(cost.size());
    for (int a = 1; a < n; ++a) {
      if (P == 2) best = std::min(best, stage_costs({0, a}));
      else
        for (int b = a + 1; b < n; ++b) best = std::min(best, stage_costs({0, a, b}));
    }
    EXPECT_DOUBLE_EQ(stage_costs(chosen), best) << "P = " << P;
  }
}
