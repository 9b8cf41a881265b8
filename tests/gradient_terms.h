// How well conditioned a parameter's gradient is: a gradient is a sum over tokens of per-token
// terms (for a per-head scalar such as dt_bias, one term per token of both signs), and rounding
// each term (bf16 on the GPU) shows relative to the sum of the terms' magnitudes, not relative
// to their net, which cancellation can make hundreds of times smaller.
//
// A decay parameter (GDN's A_log and dt_bias) cancels one level further down: it reaches the
// loss only through the per-head log-decay g of its layer's state, S_t = e^{g_t} S_{t-1} (...),
// so its term at token t is (dg_t/dparam) * dg_t, and dg_t is itself an inner product over the
// state: scaling the state entering a token by e^eps is adding eps to that token's g, hence
// dg_t = <dS_{t-1}, S_{t-1}> (the entering state and its gradient, head by head). The entries
// of that product cancel too, and bf16 rounding shows relative to the sum of their magnitudes.
#pragma once
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/layer.h"
#include "model/model.h"
#include "model/optimizer.h"
#include "pipeline/stage_executor.h"
#include "pipeline/units.h"
#include "train/data.h"

namespace stateflow::testing {

// A stateful layer watched from outside: every call passes through; after each unit's backward
// it holds, per head h of the layer's first boundary state (S: [batch, heads, ...]), the inner
// product of the state that entered the unit and that state's gradient, sum_ij dS_ij S_ij, and
// the sum of its terms' magnitudes, sum_ij |dS_ij S_ij| (both empty when no state entered).
class EnteringStateProducts final : public Layer {
 public:
  explicit EnteringStateProducts(Layer& inner) : inner_(inner) {}
  std::string kind() const override { return inner_.kind(); }
  std::vector<Param*> params() override { return inner_.params(); }
  bool stateful() const override { return inner_.stateful(); }
  Tensor forward(const ChunkCtx& ctx, const Tensor& x, const State& in, State& out,
                 std::unique_ptr<Stash>& stash) override {
    // a copy: a layer may hand the entering state's storage on
    entering_[{ctx.microbatch, ctx.chunk}] = in.empty() ? Tensor() : in.at(0).cast(DType::F64);
    return inner_.forward(ctx, x, in, out, stash);
  }
  Tensor backward(const ChunkCtx& ctx, const Tensor& dy, const State& dout, State& din, Stash& stash) override {
    Tensor dx = inner_.backward(ctx, dy, dout, din, stash);
    auto it = entering_.find({ctx.microbatch, ctx.chunk});
    SF_CHECK(it != entering_.end(), "EnteringStateProducts: backward of a unit it did not see forward");
    const Tensor S = it->second;
    entering_.erase(it);
    net.clear(), magnitude.clear();
    if (!S.defined()) return dx;
    const Tensor dS = din.at(0).cast(DType::F64);
    const int64_t heads = S.dim(1), per_head = S.numel() / (S.dim(0) * heads);
    net.assign(heads, 0.0), magnitude.assign(heads, 0.0);
    for (int64_t i = 0; i < S.numel(); ++i) {
      const double p = dS.data<double>()[i] * S.data<double>()[i];
      net[(i / per_head) % heads] += p, magnitude[(i / per_head) % heads] += std::abs(p);
    }
    return dx;
  }
  std::vector<double> net, magnitude;  // of the last unit's backward, per head

 private:
  Layer& inner_;
  std::map<std::pair<int, int>, Tensor> entering_;  // by (microbatch, chunk)
};

// The per-token terms of the gradients of the parameters `which` (indices into model.params()),
// measured as the step the model takes with every token its own chunk (and every sequence its
// own microbatch): a unit's backward adds exactly its token's terms (their effect on every later
// token included, through the boundary state's gradient). Returns, per parameter of `which`, the
// float64 sum over tokens of each entry's |term| (the batch's sequences share a token position:
// their terms add first). A parameter also in `decay` (one entry per head of its layer's first
// boundary state, reaching the loss only through that state's log-decay) counts, per sequence
// and token, |term| * sum_ij |dS_ij S_ij| / |sum_ij dS_ij S_ij| instead: |dg/dparam| times the
// magnitudes of dg's inner terms. The ratio is as exact as the model's dg: a float32 model's
// to about 1e-7 times the ratio, relative (the GPU gdn case: the float64 figure to 5 digits);
// a token whose inner product cancels to under 1e-9 of its magnitudes adds nothing (its term is
// rounding noise there).
// Leaves the model's gradients as that chunked step's. Costs one unit per token and sequence.
inline std::vector<std::vector<double>> gradient_term_magnitudes(Model& model, const Batch& batch,
                                                                 const std::vector<size_t>& which,
                                                                 const std::vector<size_t>& decay = {}) {
  auto params = model.params();
  zero_grads(params);
  std::vector<Layer*> layers = model.layers();
  std::vector<std::unique_ptr<EnteringStateProducts>> watched;
  std::vector<const EnteringStateProducts*> decay_of(which.size(), nullptr);  // per `which`: its layer, if decay
  for (Layer*& layer : layers)
    for (Param* p : layer->params())
      for (size_t k = 0; k < which.size(); ++k) {
        if (params[which[k]] != p || std::find(decay.begin(), decay.end(), which[k]) == decay.end()) continue;
        if (watched.empty() || layer != watched.back().get())
          watched.push_back(std::make_unique<EnteringStateProducts>(*layer)), layer = watched.back().get();
        decay_of[k] = watched.back().get();
      }
  StageExecutor stage(layers, model.begin());
  const int B = int(batch.batch);
  const UnitPlan plan(batch, B, std::vector<int64_t>(batch.seq_len, 1));
  LossStats stats;
  std::vector<Unit> units;  // chunk-major: unit (m, c) at c * B + m
  for (int c = 0; c < plan.chunks(); ++c)
    for (int m = 0; m < B; ++m) {
      units.push_back(plan.make_unit(m, c, &stats));
      stage.forward(units.back().ctx, units.back().tokens);
    }
  std::vector<std::vector<double>> magnitude, before, token;
  for (size_t i : which) {
    magnitude.emplace_back(params[i]->grad.numel(), 0.0);
    before.emplace_back(params[i]->grad.numel(), 0.0);
  }
  for (int c = plan.chunks() - 1; c >= 0; --c) {
    token.assign(which.size(), {});
    for (int m = 0; m < B; ++m) {
      stage.backward(units[c * B + m].ctx, Tensor());
      for (size_t k = 0; k < which.size(); ++k) {
        const Tensor g = params[which[k]]->grad.cast(DType::F64);
        token[k].resize(g.numel(), 0.0);
        for (int64_t e = 0; e < g.numel(); ++e) {
          const double term = g.data<double>()[e] - before[k][e];
          before[k][e] = g.data<double>()[e];
          if (!decay_of[k]) {
            token[k][e] += term;
            continue;
          }
          const std::vector<double>& net = decay_of[k]->net;
          const std::vector<double>& inner = decay_of[k]->magnitude;
          SF_CHECK(net.empty() || int64_t(net.size()) == g.numel(), params[which[k]]->name, " has ", g.numel(),
                   " entries, its layer's state ", net.size(), " heads: not a decay parameter");
          if (!net.empty() && std::abs(net[e]) > 1e-9 * inner[e])
            magnitude[k][e] += std::abs(term) * inner[e] / std::abs(net[e]);
        }
      }
    }
    for (size_t k = 0; k < which.size(); ++k)
      for (size_t e = 0; e < token[k].size(); ++e) magnitude[k][e] += std::abs(token[k][e]);
  }
  return magnitude;
}

}  // namespace stateflow::testing
