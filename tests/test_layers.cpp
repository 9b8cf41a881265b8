// Hand-written backward of the stateless layers (embedding, SwiGLU MLP, pre-norm residual,
// LM head with cross-entropy) against central finite differences in float64.
#include <gtest/gtest.h>

#include "layer_testing.h"
#include "model/embedding_layer.h"
#include "model/lm_head.h"
#include "model/mlp_layer.h"
#include "model/residual.h"
#include "test_util.h"

using namespace stateflow;
using namespace stateflow::testing;

namespace {

ModelConfig cfg() {
  ModelConfig c = model_preset("tiny");
  c.d_model = 12, c.mlp_hidden = 20, c.vocab_size = 17;
  return c;
}

// loss = <layer(x), dy>; checks dx and every param grad.
void check_layer(Layer& layer, Tensor x, Tensor dy, Rng& rng, bool check_dx) {
  ChunkCtx ctx;
  ctx.len = x.dim(0), ctx.batch = 1;
  auto run = [&](bool backward, Tensor* dx) {
    State none;
    std::unique_ptr<Stash> stash;
    Tensor y = layer.forward(ctx, x, none, none, stash);
    if (backward) {
      for (Param* p : layer.params()) p->grad.zero_();
      Tensor g = layer.backward(ctx, dy, none, none, *stash);
      if (dx) *dx = g;
    }
    return dot(y, dy);
  };
  Tensor dx;
  run(true, &dx);
  std::vector<Tensor> grads;
  for (Param* p : layer.params()) grads.push_back(p->grad.clone());
  auto loss = [&]() { return run(false, nullptr); };
  if (check_dx) {
    EXPECT_LE(fd_check_tensors(loss, {x}, {dx}, rng, 3), 1e-7) << "dx";
  }
  auto params = layer.params();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_LE(fd_check_tensors(loss, {params[i]->value}, {grads[i]}, rng, 2), 1e-7) << params[i]->name;
}

}  // namespace

TEST(Layers, SwiGluMlpBackward) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  SwiGluMlp mlp("mlp", cfg(), DType::F64, rng);
  check_layer(mlp, random_tensor(rng, {9, 12}), random_tensor(rng, {9, 12}), rng, true);
}

TEST(Layers, PreNormResidualBackward) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  PreNormResidual block("blk", cfg(), DType::F64, std::make_unique<SwiGluMlp>("blk", cfg(), DType::F64, rng));
  for (Param* p : block.params()) fill_normal(p->value, rng, 0.5);  // norm weight away from 1
  check_layer(block, random_tensor(rng, {9, 12}), random_tensor(rng, {9, 12}), rng, true);
}

TEST(Layers, EmbeddingBackward) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  Embedding emb(cfg(), DType::F64, rng);
  Tensor tokens = Tensor::zeros({11}, DType::I32);
  for (int i = 0; i < 11; ++i) tokens.data<int32_t>()[i] = int32_t(rng.below(17));
  tokens.data<int32_t>()[3] = tokens.data<int32_t>()[7];  // a repeated id accumulates
  check_layer(emb, tokens, random_tensor(rng, {11, 12}), rng, false);
}

TEST(Layers, LmHeadBackward) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  LmHead head(cfg(), DType::F64, rng);
  fill_normal(head.params()[0]->value, rng, 1.0);
  const int64_t rows = 10;
  ChunkCtx ctx;
  ctx.len = rows, ctx.batch = 1, ctx.loss_scale = 0.3;
  ctx.targets = Tensor::zeros({rows}, DType::I32);
  for (int i = 0; i < rows; ++i) ctx.targets.data<int32_t>()[i] = i % 3 == 0 ? -1 : int32_t(rng.below(17));
  Tensor x = random_tensor(rng, {rows, 12});
  auto loss = [&]() {
    State none;
    std::unique_ptr<Stash> stash;
    return head.forward(ctx, x, none, none, stash).item();
  };
  State none;
  std::unique_ptr<Stash> stash;
  head.forward(ctx, x, none, none, stash);
  for (Param* p : head.params()) p->grad.zero_();
  Tensor dx = head.backward(ctx, Tensor(), none, none, *stash);
  std::vector<Tensor> grads;
  for (Param* p : head.params()) grads.push_back(p->grad.clone());
  EXPECT_LE(fd_check_tensors(loss, {x}, {dx}, rng, 3), 1e-7) << "dx";
  EXPECT_LE(fd_check_tensors(loss, {head.params()[0]->value}, {grads[0]}, rng, 2), 1e-7) << "final_norm";
  EXPECT_LE(fd_check_tensors(loss, {head.params()[1]->value}, {grads[1]}, rng, 2), 1e-7) << "lm_head";
}

// A forward redone in backward (--recompute full) keeps only the stash: no loss, no statistics,
// and the backward that follows is bitwise the one after the first forward.
TEST(Layers, LmHeadRecomputedForwardKeepsTheStashOnly) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  LmHead head(cfg(), DType::F64, rng);
  const int64_t rows = 9;
  LossStats stats;
  ChunkCtx ctx;
  ctx.len = rows, ctx.batch = 1, ctx.loss_scale = 0.5, ctx.stats = &stats;
  ctx.targets = Tensor::zeros({rows}, DType::I32);
  for (int i = 0; i < rows; ++i) ctx.targets.data<int32_t>()[i] = int32_t(rng.below(17));
  const Tensor x = random_tensor(rng, {rows, 12});
  auto backward_after = [&](const ChunkCtx& forward_ctx, Tensor* loss) {
    State none;
    std::unique_ptr<Stash> stash;
    *loss = head.forward(forward_ctx, x, none, none, stash);
    for (Param* p : head.params()) p->grad.zero_();
    std::vector<Tensor> out{head.backward(ctx, Tensor(), none, none, *stash)};
    for (Param* p : head.params()) out.push_back(p->grad.clone());
    return out;
  };
  Tensor loss;
  const std::vector<Tensor> first = backward_after(ctx, &loss);
  EXPECT_TRUE(loss.defined());
  EXPECT_EQ(stats.counted, rows);
  ChunkCtx again = ctx;
  again.recomputing = true;
  const std::vector<Tensor> redone = backward_after(again, &loss);
  EXPECT_FALSE(loss.defined()) << "a recomputed forward computes no loss";
  EXPECT_EQ(stats.counted, rows) << "nor counts the statistics again";
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(max_rel_diff(redone[i], first[i]), 0.0) << i;
}
