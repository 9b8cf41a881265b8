#include "pipeline/stage_executor.h"

#include "core/error.h"

namespace stateflow {

StageExecutor::StageExecutor(std::vector<Layer*> layers, int first_layer)
    : layers_(std::move(layers)), first_layer_(first_layer) {}

Tensor StageExecutor::forward(const ChunkCtx& ctx, const Tensor& x) {
  auto key = std::make_pair(ctx.microbatch, ctx.chunk);
  SF_CHECK(!stash_.count(key), "unit (", ctx.microbatch, ", ", ctx.chunk, ") forwarded twice");
  std::vector<std::unique_ptr<Stash>> stashes(layers_.size());
  CategoryScope activations(MemCategory::Activations);
  const bool last_chunk = ctx.chunk == ctx.num_chunks - 1;
  Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const int id = first_layer_ + static_cast<int>(i);
    State in = ctx.chunk > 0 ? states_.take(id, ctx.microbatch, ctx.chunk - 1) : State{};
    SF_CHECK(ctx.chunk == 0 || !layers_[i]->stateful() || !in.empty(), "forward of unit (", ctx.microbatch, ", ",
             ctx.chunk, ") before chunk ", ctx.chunk - 1, " on layer ", id, ": chunks must go forward in order");
    State out;
    h = layers_[i]->forward(ctx, h, in, out, stashes[i]);
    if (!last_chunk && !out.empty()) states_.put(id, ctx.microbatch, ctx.chunk, std::move(out));
  }
  stash_[key] = std::move(stashes);
  return h;
}

Tensor StageExecutor::backward(const ChunkCtx& ctx, const Tensor& dy) {
  auto it = stash_.find({ctx.microbatch, ctx.chunk});
  SF_CHECK(it != stash_.end(), "backward of unit (", ctx.microbatch, ", ", ctx.chunk, ") without its forward");
  CategoryScope activations(MemCategory::Activations);
  auto& stashes = it->second;
  Tensor g = dy;
  for (size_t j = layers_.size(); j-- > 0;) {
    const int id = first_layer_ + static_cast<int>(j);
    State dout = state_grads_.take(id, ctx.microbatch, ctx.chunk);
    SF_CHECK(ctx.chunk == ctx.num_chunks - 1 || !layers_[j]->stateful() || !dout.empty(), "backward of unit (",
             ctx.microbatch, ", ", ctx.chunk, ") before chunk ", ctx.chunk + 1,
             ": chunks must go backward in reverse order");
    State din;
    g = layers_[j]->backward(ctx, g, dout, din, *stashes[j]);
    stashes[j].reset();  // this layer's activations are done
    if (ctx.chunk > 0 && !din.empty()) state_grads_.put(id, ctx.microbatch, ctx.chunk - 1, std::move(din));
  }
  stash_.erase(it);
  return g;
}

}  // namespace stateflow
