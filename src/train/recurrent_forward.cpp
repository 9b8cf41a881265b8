#include "train/recurrent_forward.h"

#include <limits>

namespace stateflow {

static std::vector<Layer*> all_layers(Model& model) {
  SF_CHECK(model.begin() == 0 && model.end() == Model::num_layers_of(model.config()),
           "recurrent inference needs the whole model; this part holds layers [", model.begin(), ", ", model.end(),
           ")");
  return model.layers();
}

RecurrentForward::RecurrentForward(Model& model) : RecurrentForward(all_layers(model), model.config().vocab_size) {}

RecurrentForward::RecurrentForward(std::vector<Layer*> layers, int64_t vocab_size)
    : layers_(std::move(layers)), vocab_(vocab_size), states_(layers_.size()) {}

void RecurrentForward::reset() {
  for (State& s : states_) s.clear();
  batch_ = position_ = 0;
  chunk_ = 0;
}

void RecurrentForward::forward(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                               int64_t batch, LossStats* stats, Tensor* logits) {
  const int64_t rows = static_cast<int64_t>(tokens.size());
  SF_CHECK(batch >= 1 && rows >= batch && rows % batch == 0 && targets.size() == tokens.size(),
           "recurrent forward: ", rows, " tokens and ", targets.size(), " targets are not ", batch,
           " sequences of one length");
  SF_CHECK(chunk_ == 0 || batch == batch_, "recurrent forward: a chunk of ", batch, " sequences after chunks of ",
           batch_, "; call reset() to start new sequences");
  for (int32_t t : tokens)
    SF_CHECK(t >= 0 && t < vocab_, "token id ", t, " is outside the model's vocabulary [0, ", vocab_, ")");
  ChunkCtx ctx;
  ctx.chunk = chunk_;
  ctx.offset = position_;
  ctx.len = rows / batch;
  ctx.batch = batch;
  ctx.num_chunks = std::numeric_limits<int>::max();  // an open-ended sequence: every chunk passes its state on
  ctx.stats = stats;
  ctx.logits = logits;
  ctx.targets = Tensor::zeros({rows}, DType::I32, MemCategory::Activations);
  std::copy(targets.begin(), targets.end(), ctx.targets.data<int32_t>());
  Tensor x = Tensor::zeros({rows}, DType::I32, MemCategory::Activations);
  std::copy(tokens.begin(), tokens.end(), x.data<int32_t>());
  for (size_t i = 0; i < layers_.size(); ++i) {
    State out;
    std::unique_ptr<Stash> stash;
    x = layers_[i]->forward(ctx, x, states_[i], out, stash);
    if (layers_[i]->stateful()) states_[i] = std::move(out);
  }
  batch_ = batch;
  position_ += ctx.len;
  ++chunk_;
}

}  // namespace stateflow
