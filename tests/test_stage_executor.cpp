// The stage executor's bookkeeping, on one stage holding the whole tiny model (float64): units
// run in any order the chunk rules allow give the one-chunk step's gradients, boundary states
// of different microbatches stay apart, stash bytes rise with each forward and fall back to
// zero, recomputation keeps less and changes nothing, and out-of-order calls are refused.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <optional>

#include "core/deferred_work.h"
#include "host_backed_device.h"
#include "layer_testing.h"
#include "model/model.h"
#include "pipeline/stage_executor.h"
#include "test_util.h"
#include "train/step.h"
#include "pipeline/units.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

struct OneChunkStep {
  ModelConfig cfg = model_preset("tiny");
  Batch batch;
  std::map<std::string, Tensor> ref_grads;  // one stage, one chunk, one microbatch
  double ref_loss = 0;
  explicit OneChunkStep(Rng& rng) {
    batch = random_batch(rng, 2, 23, cfg.vocab_size);
    Model m(cfg, DType::F64);
    ref_loss = forward_backward(m, batch, 1, {batch.seq_len}).loss;
    for (Param* p : m.params()) ref_grads[p->name] = p->grad.clone();
  }
  double worst_grad_diff(Model& m) const {
    double worst = 0;
    for (Param* p : m.params()) worst = std::max(worst, max_rel_diff(p->grad, ref_grads.at(p->name)));
    return worst;
  }
};

// A forward ('F') or backward ('B') of unit (m, c).
struct Call {
  char op;
  int m, c;
};

}  // namespace

TEST(StageExecutor, InterleavedMicrobatchesAndChunksGiveTheOneChunkGradients) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  OneChunkStep s(rng);
  Model model(s.cfg, DType::F64);
  StageExecutor ex(model.layers(), 0);
  LossStats stats;
  UnitPlan plan(s.batch, 2, {5, 1, 17});  // 2 microbatches of one sequence, a one-token chunk
  std::map<std::pair<int, int>, Unit> units;
  double loss = 0;
  // Microbatches interleaved, as a pipeline schedule runs them: each chunk forward after its
  // predecessor, backward after its successor, the two microbatches' states side by side.
  const std::vector<Call> calls = {{'F', 0, 0}, {'F', 1, 0}, {'F', 0, 1}, {'F', 0, 2}, {'F', 1, 1}, {'B', 0, 2},
                                   {'B', 0, 1}, {'F', 1, 2}, {'B', 1, 2}, {'B', 1, 1}, {'B', 1, 0}, {'B', 0, 0}};
  size_t most = 0;
  for (const Call& k : calls) {
    if (k.op == 'F') {
      Unit& u = units[{k.m, k.c}] = plan.make_unit(k.m, k.c, &stats);
      loss += ex.forward(u.ctx, u.tokens).item();
    } else {
      ex.backward(units.at({k.m, k.c}).ctx, Tensor());
      units.erase({k.m, k.c});
    }
    most = std::max(most, ex.units_in_flight());
  }
  EXPECT_EQ(most, 5u);
  EXPECT_EQ(ex.units_in_flight(), 0u);
  EXPECT_NEAR(loss, s.ref_loss, 1e-12 * std::abs(s.ref_loss));
  EXPECT_LE(s.worst_grad_diff(model), 1e-10);
}

TEST(StageExecutor, StashBytesRiseWithEachForwardAndReturnToZero) {
  Rng rng(fresh_seed());
  OneChunkStep s(rng);
  Model model(s.cfg, DType::F64);
  MemoryTracker tracker("stage");
  TrackerScope scope(tracker);
  StageExecutor ex(model.layers(), 0);
  LossStats stats;
  UnitPlan plan(s.batch, 1, {10, 13});
  Unit u0 = plan.make_unit(0, 0, &stats), u1 = plan.make_unit(0, 1, &stats);
  ex.forward(u0.ctx, u0.tokens);
  const int64_t one = ex.stash_bytes();
  EXPECT_GT(one, 0);
  ex.forward(u1.ctx, u1.tokens);
  const int64_t two = ex.stash_bytes();
  EXPECT_GT(two, one);
  EXPECT_EQ(ex.peak_stash_bytes(), two);
  ex.backward(u1.ctx, Tensor());
  EXPECT_EQ(ex.stash_bytes(), one);
  ex.backward(u0.ctx, Tensor());
  EXPECT_EQ(ex.stash_bytes(), 0);
  EXPECT_EQ(ex.peak_stash_bytes(), two);
  ex.reset_peak_stash();
  EXPECT_EQ(ex.peak_stash_bytes(), 0);
  // What the allocator saw go to activations and stay is what the executor counts.
  u0 = Unit{}, u1 = Unit{};
  EXPECT_EQ(tracker.snapshot().current_of(MemCategory::Activations), 0) << "a unit's activations outlived it";
}

TEST(StageExecutor, RecomputationKeepsLessAndGivesBitwiseTheSameGradients) {
  Rng rng(fresh_seed());
  OneChunkStep s(rng);
  std::map<std::string, Tensor> grads[2];
  int64_t peak[2] = {0, 0};
  for (int recompute : {0, 1}) {
    Model model(s.cfg, DType::F64);
    StageExecutor ex(model.layers(), 0, recompute);
    LossStats stats;
    UnitPlan plan(s.batch, 1, {8, 15});
    Unit u0 = plan.make_unit(0, 0, &stats), u1 = plan.make_unit(0, 1, &stats);
    ex.forward(u0.ctx, u0.tokens);
    ex.forward(u1.ctx, u1.tokens);
    peak[recompute] = ex.peak_stash_bytes();
    ex.backward(u1.ctx, Tensor());
    ex.backward(u0.ctx, Tensor());
    EXPECT_LE(s.worst_grad_diff(model), 1e-10);
    for (Param* p : model.params()) grads[recompute][p->name] = p->grad.clone();
  }
  for (auto& [name, g] : grads[0]) EXPECT_EQ(max_rel_diff(grads[1].at(name), g), 0.0) << name;
  EXPECT_LT(peak[1], peak[0] / 2) << "layer inputs only, instead of every activation";
}

TEST(StageExecutor, OutOfOrderCallsAreRefusedNamingTheUnit) {
  Rng rng(fresh_seed());
  OneChunkStep s(rng);
  Model model(s.cfg, DType::F64);
  StageExecutor ex(model.layers(), 0);
  LossStats stats;
  UnitPlan plan(s.batch, 1, {10, 6, 7});
  Unit u0 = plan.make_unit(0, 0, &stats), u1 = plan.make_unit(0, 1, &stats), u2 = plan.make_unit(0, 2, &stats);
  expect_error([&] { ex.forward(u1.ctx, u1.tokens); }, "chunks must go forward in order");
  expect_error([&] { ex.backward(u0.ctx, Tensor()); }, "backward of unit (0, 0) without its forward");
  ex.forward(u0.ctx, u0.tokens);
  expect_error([&] { ex.forward(u0.ctx, u0.tokens); }, "unit (0, 0) forwarded twice");
  ex.forward(u1.ctx, u1.tokens);
  expect_error([&] { ex.backward(u0.ctx, Tensor()); }, "chunks must go backward in reverse order");
}

namespace {

// A layer that passes x through and, in backward, defers a finish function (as a GPU layer
// does for its side-stream weight gradients) that appends its name to a log.
struct DeferringLayer : Layer {
  std::string name;
  std::vector<std::string>* log;
  DeferringLayer(std::string n, std::vector<std::string>* l) : name(std::move(n)), log(l) {}
  std::string kind() const override { return "deferring"; }
  std::vector<Param*> params() override { return {}; }
  Tensor forward(const ChunkCtx&, const Tensor& x, const State&, State&, std::unique_ptr<Stash>& stash) override {
    stash = std::make_unique<Stash>();
    return x;
  }
  Tensor backward(const ChunkCtx&, const Tensor& dy, const State&, State&, Stash&) override {
    log->push_back("backward " + name);
    if (work_may_be_deferred()) defer_work([this] { log->push_back("finish " + name); });
    else log->push_back("finish " + name + " (not deferred)");
    return dy;
  }
};

}  // namespace

// Work a layer defers in backward is finished, in order, before each layer_done and before the
// unit's backward returns; outside the executor nothing may be deferred.
TEST(StageExecutor, DeferredLayerWorkIsFinishedBeforeLayerDoneAndAtTheEnd) {
  std::vector<std::string> log;
  DeferringLayer a("a", &log), b("b", &log), c("c", &log);
  StageExecutor ex({&a, &b, &c}, 0);
  ChunkCtx ctx;
  ctx.len = 1;
  const Tensor x = Tensor::zeros({1, 1}, DType::F64);
  ex.forward(ctx, x);
  ex.backward(ctx, x);
  EXPECT_EQ(log, (std::vector<std::string>{"backward c", "backward b", "backward a", "finish c", "finish b",
                                           "finish a"}));
  log.clear();
  ex.forward(ctx, x);
  ex.backward(ctx, x, [&](int j) { log.push_back("done " + std::to_string(j)); });
  EXPECT_EQ(log, (std::vector<std::string>{"backward c", "finish c", "done 2", "backward b", "finish b", "done 1",
                                           "backward a", "finish a", "done 0"}));
  log.clear();
  State none;
  a.backward(ctx, x, none, none, *std::make_unique<Stash>());
  EXPECT_EQ(log, (std::vector<std::string>{"backward a", "finish a (not deferred)"}));
  EXPECT_FALSE(work_may_be_deferred());
  expect_error([] { defer_work([] {}); }, "no DeferredWorkScope is open");
}

namespace {

// Sets an environment variable for a scope and restores what was there.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(const char* n, const char* value) : name(n) {
    if (const char* v = std::getenv(n)) old = v;
    setenv(n, value, 1);
  }
  ~ScopedEnv() { old ? setenv(name.c_str(), old->c_str(), 1) : unsetenv(name.c_str()); }
};

// The stand-in GPU of host_backed_device.h with graphs that log what the executor asks of them.
struct GraphLoggingDevice : HostBackedDevice {
  struct Graph : DeviceGraph {
    std::vector<std::string>* log;
    explicit Graph(std::vector<std::string>* l) : log(l) {}
    void begin() override { log->push_back("begin"); }
    void end_and_launch() override { log->push_back("launch"); }
    void abandon() noexcept override { log->push_back("abandon"); }
  };
  std::vector<std::string>* log;
  int graphs_made = 0;
  explicit GraphLoggingDevice(std::vector<std::string>* l) : log(l) {}
  std::unique_ptr<DeviceGraph> make_graph() override {
    ++graphs_made;
    return std::make_unique<Graph>(log);
  }
};

// A DeferringLayer with a parameter on the stand-in device, which logs its forward too, may be
// recorded into a graph or not, and can be told to fail.
struct PlacedLayer : DeferringLayer {
  Param w{"w", Tensor::zeros({1}, DType::F32, MemCategory::Weights, Device::CUDA), Tensor()};
  bool capturable, fail = false;
  PlacedLayer(std::string n, std::vector<std::string>* l, bool c) : DeferringLayer(std::move(n), l), capturable(c) {}
  std::vector<Param*> params() override { return {&w}; }
  bool graph_capturable() const override { return capturable; }
  Tensor forward(const ChunkCtx& ctx, const Tensor& x, const State& in, State& out,
                 std::unique_ptr<Stash>& stash) override {
    log->push_back("forward " + name);
    if (fail) throw Error("a call that cannot be recorded");
    return DeferringLayer::forward(ctx, x, in, out, stash);
  }
};

}  // namespace

// On a device with graphs, each run of consecutive layers that may be recorded is one graph per
// pass: begun before its first layer (after the side work deferred outside it is finished),
// launched before the next layer that may not be recorded, with its own deferred work finished
// inside it; with layer_done, each layer is a graph of its own (finished before layer_done).
// Units of one shape reuse their graph. An error while recording abandons the recording and
// names the switch.
TEST(StageExecutor, RunsOfRecordableLayersAreOneGraphPerPass) {
  std::vector<std::string> log;
  GraphLoggingDevice device(&log);
  PlacedLayer e("e", &log, false), b("b", &log, true), c("c", &log, true), h("h", &log, false);
  StageExecutor ex({&e, &b, &c, &h}, 0);
  ChunkCtx ctx;
  ctx.len = 1;
  const Tensor x = Tensor::zeros({1, 1}, DType::F64);
  for (int unit = 0; unit < 2; ++unit) {
    log.clear();
    ex.forward(ctx, x);
    EXPECT_EQ(log, (std::vector<std::string>{"forward e", "begin", "forward b", "forward c", "launch", "forward h"}));
    log.clear();
    ex.backward(ctx, x);
    EXPECT_EQ(log, (std::vector<std::string>{"backward h", "finish h", "begin", "backward c", "backward b", "finish c",
                                             "finish b", "launch", "backward e", "finish e"}));
  }
  EXPECT_EQ(device.graphs_made, 2) << "one graph per pass, reused by the second unit of the same shape";
  ctx.len = 2;  // another shape: graphs of its own
  ex.forward(ctx, x);
  log.clear();
  ex.backward(ctx, x, [&](int j) { log.push_back("done " + std::to_string(j)); });
  EXPECT_EQ(log, (std::vector<std::string>{"backward h", "finish h", "done 3", "begin", "backward c", "finish c",
                                           "launch", "done 2", "begin", "backward b", "finish b", "launch", "done 1",
                                           "backward e", "finish e", "done 0"}));
  EXPECT_EQ(device.graphs_made, 5);
  log.clear();
  c.fail = true;
  expect_error([&] { ex.forward(ctx, x); }, "while recording layers 1 to 2 into a device graph: set "
                                            "STATEFLOW_LEVERS_OFF=graphs");
  EXPECT_EQ(log, (std::vector<std::string>{"forward e", "begin", "forward b", "forward c", "abandon"}));
}

// STATEFLOW_GRAPH_LAYERS cuts a run into graphs of that many layers (read by each executor when
// it makes its first graph); a value that is no positive integer is refused, naming it.
TEST(StageExecutor, GraphLayersCutsARunIntoGraphsOfThatManyLayers) {
  std::vector<std::string> log;
  GraphLoggingDevice device(&log);
  PlacedLayer e("e", &log, false), b("b", &log, true), c("c", &log, true), h("h", &log, false);
  ChunkCtx ctx;
  ctx.len = 1;
  const Tensor x = Tensor::zeros({1, 1}, DType::F64);
  ScopedEnv one("STATEFLOW_GRAPH_LAYERS", "1");
  StageExecutor ex({&e, &b, &c, &h}, 0);
  ex.forward(ctx, x);
  EXPECT_EQ(log, (std::vector<std::string>{"forward e", "begin", "forward b", "launch", "begin", "forward c", "launch",
                                           "forward h"}));
  log.clear();
  ex.backward(ctx, x);
  EXPECT_EQ(log, (std::vector<std::string>{"backward h", "finish h", "begin", "backward c", "finish c", "launch",
                                           "begin", "backward b", "finish b", "launch", "backward e", "finish e"}));
  for (const char* bad : {"0", "-2", "eight", "8x"}) {
    ScopedEnv env("STATEFLOW_GRAPH_LAYERS", bad);
    StageExecutor fresh({&e, &b, &c, &h}, 0);
    expect_error([&] { fresh.forward(ctx, x); }, "STATEFLOW_GRAPH_LAYERS = '" + std::string(bad) +
                                                     "' is no number of layers; give a positive integer");
  }
}

// An executor told not to record (its stage shares the GPU with other stage threads) launches
// every layer's work as it comes: no graph begins.
TEST(StageExecutor, AnExecutorNotAllowedGraphsRecordsNone) {
  std::vector<std::string> log;
  GraphLoggingDevice device(&log);
  PlacedLayer e("e", &log, false), b("b", &log, true), c("c", &log, true), h("h", &log, false);
  ChunkCtx ctx;
  ctx.len = 1;
  const Tensor x = Tensor::zeros({1, 1}, DType::F64);
  StageExecutor ex({&e, &b, &c, &h}, 0);
  ex.allow_graphs(false);
  ex.forward(ctx, x);
  EXPECT_EQ(log, (std::vector<std::string>{"forward e", "forward b", "forward c", "forward h"}));
  log.clear();
  ex.backward(ctx, x);
  // (the side work stays deferred to the end of the unit, as without graphs)
  EXPECT_EQ(log, (std::vector<std::string>{"backward h", "backward c", "backward b", "backward e", "finish h", "finish c",
                                           "finish b", "finish e"}));
}

// Which layers of a model the executor may record into device graphs: every block (each mixer
// and the MLP, behind its pre-norm residual), not the embedding (it uploads the token ids from
// the host) nor the LM head (it uploads the targets and may read the loss back).
TEST(StageExecutor, BlocksMayBeRecordedIntoGraphsButNotTheEmbeddingOrTheHead) {
  ModelConfig cfg = model_preset("tiny");
  cfg.pattern = "GMAS";
  cfg.complete_sections();
  Model m(cfg, DType::F32);
  const std::vector<Layer*> layers = m.layers();
  ASSERT_GE(layers.size(), 3u);
  for (size_t i = 0; i < layers.size(); ++i)
    EXPECT_EQ(layers[i]->graph_capturable(), i != 0 && i + 1 != layers.size()) << i << ": " << layers[i]->kind();
}
