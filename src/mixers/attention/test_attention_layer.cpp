// The attention layer with its K/V prefix as boundary state: split == unsplit (outputs, dx,
// every parameter gradient, the filled prefix) down to 1-token chunks, hand-written backward
// == finite differences (float64) for each option, the prefix's memory against its formula,
// and clear errors for bad configs and out-of-order chunks.
#include <gtest/gtest.h>

#include "layer_testing.h"
#include "mixers/attention/attention_layer.h"
#include "pipeline/stage_executor.h"
#include "test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

AttentionConfig small_config() {
  AttentionConfig a;
  a.heads = 4, a.kv_heads = 2, a.head_dim = 6, a.rope_theta = 100.0;
  return a;
}

struct Fixture {
  uint64_t seed = fresh_seed();
  Rng rng{seed};
  int64_t D = 10, B = 2, T = 37;
  AttentionConfig cfg;
  Attention layer;
  Tensor x = random_tensor(rng, {B * T, D});
  Tensor dy = random_tensor(rng, {B * T, D});
  explicit Fixture(AttentionConfig c = small_config()) : cfg(c), layer("attn", D, 2, cfg, DType::F64, rng) {
    // Non-trivial norm weights, so their gradients are checked at a generic point.
    for (Param* p : layer.params())
      if (p->value.ndim() == 1) p->value = random_tensor(rng, p->value.shape(), DType::F64, 0.5);
  }
  SplitRun run(const std::vector<int64_t>& pieces) { return run_split(layer, x, B, T, {}, dy, {}, pieces); }
};

void expect_split_matches(Fixture& f, const std::vector<int64_t>& pieces, double tol) {
  SCOPED_TRACE("seed " + std::to_string(f.seed) + ", " + std::to_string(pieces.size()) + " pieces");
  SplitRun u = f.run({f.T}), s = f.run(pieces);
  EXPECT_LE(max_rel_diff(s.y, u.y), tol) << "output";
  EXPECT_LE(max_rel_diff(s.dx, u.dx), tol) << "dx";
  ASSERT_EQ(s.final_state.size(), size_t(Attention::kStateSize));
  for (size_t i = 0; i < s.final_state.size(); ++i)
    EXPECT_LE(max_rel_diff(s.final_state[i], u.final_state[i]), tol) << "K/V prefix " << i;
  auto params = f.layer.params();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_LE(max_rel_diff(s.param_grads[i], u.param_grads[i]), tol) << params[i]->name;
}

void expect_backward_matches_fd(Fixture& f, const std::vector<int64_t>& pieces) {
  SCOPED_TRACE("seed " + std::to_string(f.seed));
  SplitRun u = f.run(pieces);
  auto loss = [&]() { return dot(f.run(pieces).y, f.dy); };
  EXPECT_LE(fd_check_tensors(loss, {f.x}, {u.dx}, f.rng, 3), 1e-6) << "dx";
  auto params = f.layer.params();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_LE(fd_check_tensors(loss, {params[i]->value}, {u.param_grads[i]}, f.rng, 2), 1e-6) << params[i]->name;
}

}  // namespace

TEST(AttentionLayer, SplitEqualsUnsplit) {
  Fixture f;
  for (auto pieces : std::vector<std::vector<int64_t>>{{16, 21}, {11, 2, 1, 19, 4}, {1, 2, 3, 31}, {9, 9, 9, 10}})
    expect_split_matches(f, pieces, 1e-12);
}

TEST(AttentionLayer, SplitDownToOneTokenChunks) {
  Fixture f;
  expect_split_matches(f, std::vector<int64_t>(f.T, 1), 1e-12);
}

TEST(AttentionLayer, BackwardMatchesFiniteDifferences) {
  Fixture f;
  expect_backward_matches_fd(f, {15, 1, 21});
}

TEST(AttentionLayer, EveryOptionSplitsExactlyAndMatchesFiniteDifferences) {
  AttentionConfig plain = small_config();
  plain.qk_norm = false, plain.output_gate = false;
  AttentionConfig partial = small_config();
  partial.rotary_dim = 4, partial.kv_heads = 1;  // partial RoPE, one K/V head for all queries
  AttentionConfig mha = small_config();
  mha.kv_heads = mha.heads;
  for (const AttentionConfig& c : {plain, partial, mha}) {
    Fixture f(c);
    EXPECT_EQ(f.layer.params().size(), c.qk_norm ? 7u : 4u);
    expect_split_matches(f, {5, 30, 2}, 1e-12);
    expect_backward_matches_fd(f, {20, 17});
  }
}

// Negative control: dx with its sign flipped. The check projects on random unit directions,
// so it sees 2 |<dx, u>| / |dx| (about 2 / sqrt(numel) = 0.07 here), far above 1e-4.
TEST(AttentionLayer, FiniteDifferencesFlagAWrongGradient) {
  Fixture f;
  SCOPED_TRACE("seed " + std::to_string(f.seed));
  SplitRun u = f.run({f.T});
  Tensor wrong = u.dx.clone();
  for (int64_t i = 0; i < wrong.numel(); ++i) wrong.data<double>()[i] *= -1;
  EXPECT_GT(fd_check_tensors([&] { return dot(f.run({f.T}).y, f.dy); }, {f.x}, {wrong}, f.rng, 2), 1e-4);
}

// The K/V prefix is B x seq_len x kv_heads x head_dim x 2 (K and V) elements from chunk 0's
// forward to chunk 0's backward, and its gradient as much again from the last chunk's backward.
TEST(AttentionLayer, KvPrefixMemoryMatchesItsFormulaAndIsFreedAfterChunkZero) {
  Fixture f;
  MemoryTracker tracker("test");
  TrackerScope scope(tracker);
  auto kv_now = [&] { return tracker.snapshot().current_of(MemCategory::KvPrefix); };
  const int64_t prefix = f.cfg.kv_prefix_bytes(f.B, f.T, sizeof(double));
  EXPECT_EQ(prefix, f.B * f.T * 2 * 6 * 2 * 8);
  const std::vector<int64_t> pieces{10, 20, 7};
  std::vector<ChunkCtx> ctxs;
  std::vector<std::unique_ptr<Stash>> stashes;
  State st;
  int64_t off = 0;
  for (size_t c = 0; c < pieces.size(); ++c) {
    ChunkCtx ctx;
    ctx.chunk = int(c), ctx.offset = off, ctx.len = pieces[c], ctx.batch = f.B, ctx.seq_len = f.T, ctx.num_chunks = 3;
    State out;
    stashes.emplace_back();
    f.layer.forward(ctx, take_rows(f.x, f.B, f.T, off, pieces[c]), st, out, stashes.back());
    st = out;
    EXPECT_EQ(kv_now(), prefix) << "after the forward of chunk " << c;  // one buffer, filled row by row
    ctxs.push_back(ctx), off += pieces[c];
  }
  st.clear();
  State dst;
  for (size_t c = pieces.size(); c-- > 0;) {
    State din;
    f.layer.backward(ctxs[c], take_rows(f.dy, f.B, f.T, ctxs[c].offset, ctxs[c].len), dst, din, *stashes[c]);
    stashes[c].reset();
    dst = din;
    // K/V kept by the earlier chunks' stashes, and the gradient; after chunk 0 only the
    // gradient it handed back, which the caller drops (the stage executor does).
    EXPECT_EQ(kv_now(), c > 0 ? 2 * prefix : prefix) << "after the backward of chunk " << c;
  }
  dst.clear();
  EXPECT_EQ(kv_now(), 0);
  EXPECT_EQ(tracker.snapshot().peak_of(MemCategory::KvPrefix), 2 * prefix);
}

TEST(AttentionLayer, BadConfigsAndOutOfOrderChunksAreErrors) {
  AttentionConfig c = small_config();
  c.kv_heads = 3;
  expect_error([&] { c.validate(); }, "attention.kv_heads = 3 must divide attention.heads = 4");
  c = small_config(), c.rotary_dim = 5;
  expect_error([&] { c.validate(); }, "attention.rotary_dim = 5");
  c = small_config(), c.head_dim = 0;
  expect_error([&] { c.validate(); }, "head_dim = 0 must all be >= 1");
  Fixture f;
  ChunkCtx ctx;
  ctx.chunk = 1, ctx.offset = 5, ctx.len = 3, ctx.batch = f.B, ctx.seq_len = f.T;
  State out;
  std::unique_ptr<Stash> stash;
  expect_error([&] { f.layer.forward(ctx, take_rows(f.x, f.B, f.T, 5, 3), {}, out, stash); },
               "has no K/V prefix: chunks must go forward in order");
  ctx.chunk = 0, ctx.offset = 0, ctx.seq_len = 0;
  expect_error([&] { f.layer.forward(ctx, take_rows(f.x, f.B, f.T, 0, 3), {}, out, stash); }, "ChunkCtx::seq_len");
}

// Through the stage executor (the boundary-state store, stashes, --recompute full), with two
// microbatches in flight: the same loss gradients as one unchunked unit, one prefix per
// microbatch in flight, and nothing left after the step.
TEST(AttentionLayer, StageExecutorChunksAndRecomputesExactlyWithOnePrefixPerMicrobatch) {
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recompute" : "stash");
    Fixture f;
    const int64_t Bm = f.B / 2;  // two microbatches of one sequence each
    const int64_t prefix = f.cfg.kv_prefix_bytes(Bm, f.T, sizeof(double));
    int64_t kv_after_forwards = 0, kv_peak = 0;
    auto run = [&](const std::vector<int64_t>& pieces) {
      for (Param* p : f.layer.params()) p->grad.zero_();
      MemoryTracker tracker("test");
      TrackerScope scope(tracker);
      StageExecutor ex({&f.layer}, 0, recompute);
      std::vector<ChunkCtx> ctxs;
      Tensor dx = Tensor::zeros(f.x.shape(), DType::F64);
      for (int m = 0; m < 2; ++m) {
        int64_t off = 0;
        for (size_t c = 0; c < pieces.size(); ++c) {
          ChunkCtx ctx;
          ctx.microbatch = m, ctx.chunk = int(c), ctx.offset = off, ctx.len = pieces[c], ctx.batch = Bm;
          ctx.seq_len = f.T, ctx.num_chunks = int(pieces.size());
          ex.forward(ctx, take_rows(f.x, 1, f.B * f.T, m * f.T + off, pieces[c]));  // sequence m's rows
          ctxs.push_back(ctx), off += pieces[c];
        }
      }
      kv_after_forwards = tracker.snapshot().current_of(MemCategory::KvPrefix);
      for (size_t u = ctxs.size(); u-- > 0;) {
        const ChunkCtx& ctx = ctxs[u];
        Tensor dxc = ex.backward(ctx, take_rows(f.dy, 1, f.B * f.T, ctx.microbatch * f.T + ctx.offset, ctx.len));
        put_rows(dx, dxc, 1, f.B * f.T, ctx.microbatch * f.T + ctx.offset, ctx.len);
      }
      EXPECT_EQ(tracker.snapshot().current_of(MemCategory::KvPrefix), 0) << "a K/V buffer outlived the step";
      kv_peak = tracker.snapshot().peak_of(MemCategory::KvPrefix);
      std::vector<Tensor> grads{dx};
      for (Param* p : f.layer.params()) grads.push_back(p->grad.clone());
      return grads;
    };
    const std::vector<Tensor> whole = run({f.T}), chunked = run({4, 1, 20, 12});
    EXPECT_EQ(kv_after_forwards, 2 * prefix) << "one prefix per microbatch in flight";
    EXPECT_EQ(kv_peak, 3 * prefix) << "two prefixes and the gradient of the one in backward";
    for (size_t i = 0; i < whole.size(); ++i) EXPECT_LE(max_rel_diff(chunked[i], whole[i]), 1e-12) << "gradient " << i;
  }
}

// A caller may hand in a prefix for chunk 0 (its rows are overwritten, never read: gradient
// zero) and a gradient for the final prefix (it flows into every token's k and v).
TEST(AttentionLayer, GivenPrefixAndFinalPrefixGradientAreExact) {
  Fixture f;
  SCOPED_TRACE("seed " + std::to_string(f.seed));
  const Shape shape{f.B, f.T, f.cfg.kv_heads, f.cfg.head_dim};
  const State state0{random_tensor(f.rng, shape), random_tensor(f.rng, shape)};
  const State dfinal{random_tensor(f.rng, shape), random_tensor(f.rng, shape)};
  auto run = [&](const std::vector<int64_t>& pieces) { return run_split(f.layer, f.x, f.B, f.T, state0, f.dy, dfinal, pieces); };
  const SplitRun u = run({f.T}), s = run({3, 1, 30, 3});
  EXPECT_LE(max_rel_diff(s.dx, u.dx), 1e-12);
  for (int i = 0; i < 2; ++i) {
    EXPECT_LE(max_rel_diff(s.final_state[i], u.final_state[i]), 1e-12);
    EXPECT_EQ(max_rel_diff(s.dstate_initial[i], Tensor::zeros(shape, DType::F64)), 0.0) << "prefix gradient " << i;
  }
  auto loss = [&] {
    SplitRun r = run({3, 1, 30, 3});
    return dot(r.y, f.dy) + dot(r.final_state[0], dfinal[0]) + dot(r.final_state[1], dfinal[1]);
  };
  EXPECT_LE(fd_check_tensors(loss, {f.x, state0[0], state0[1]}, {s.dx, s.dstate_initial[0], s.dstate_initial[1]},
                             f.rng, 3), 1e-6);
  auto params = f.layer.params();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_LE(fd_check_tensors(loss, {params[i]->value}, {s.param_grads[i]}, f.rng, 1), 1e-6) << params[i]->name;
}
