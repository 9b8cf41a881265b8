// Helpers for layer-level tests: random tensors, running a layer over a sequence cut into
// pieces (chaining boundary states forward and their gradients backward), and directional
// finite differences over tensors.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "core/rng.h"
#include "model/layer.h"
#include "train/data.h"
#include "test_util.h"

namespace stateflow::testing {

inline Tensor random_tensor(Rng& rng, const Shape& s, DType dt = DType::F64, double scale = 1.0) {
  Tensor t = Tensor::zeros(s, dt);
  dispatch_float(dt, [&](auto z) {
    using T = decltype(z);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<T>()[i] = T(scale * rng.normal());
  });
  return t;
}

inline double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a.data<double>()[i] * b.data<double>()[i];
  return s;
}

inline State random_state_like(Rng& rng, const State& s, double scale = 0.3) {
  State out;
  for (auto& t : s) out.push_back(random_tensor(rng, t.shape(), t.dtype(), scale));
  return out;
}

// Rows [off, off+len) of every sequence of x [batch*T, ...] -> [batch*len, ...].
inline Tensor take_rows(const Tensor& x, int64_t batch, int64_t T, int64_t off, int64_t len) {
  const int64_t w = x.numel() / (batch * T);
  Shape s = x.shape();
  s[0] = batch * len;
  Tensor out = Tensor::zeros(s, x.dtype());
  const size_t es = dtype_size(x.dtype());
  for (int64_t b = 0; b < batch; ++b)
    std::memcpy(static_cast<char*>(out.raw()) + (b * len) * w * es,
                static_cast<char*>(x.raw()) + (b * T + off) * w * es, len * w * es);
  return out;
}

inline void put_rows(Tensor& x, const Tensor& piece, int64_t batch, int64_t T, int64_t off, int64_t len) {
  const int64_t w = x.numel() / (batch * T);
  const size_t es = dtype_size(x.dtype());
  for (int64_t b = 0; b < batch; ++b)
    std::memcpy(static_cast<char*>(x.raw()) + (b * T + off) * w * es,
                static_cast<char*>(piece.raw()) + (b * len) * w * es, len * w * es);
}

// Random tokens, with a target at about 70% of the positions.
inline Batch random_batch(Rng& rng, int64_t batch, int64_t T, int64_t vocab) {
  Batch b;
  b.batch = batch, b.seq_len = T;
  for (int64_t i = 0; i < batch * T; ++i) {
    b.tokens.push_back(int32_t(rng.below(vocab)));
    b.targets.push_back(rng.uniform() < 0.3 ? -1 : int32_t(rng.below(vocab)));
  }
  return b;
}

struct SplitRun {
  Tensor y, dx;
  State final_state, dstate_initial;
  std::vector<Tensor> param_grads;
};

inline State clone_state(const State& s) {
  State out;
  for (const Tensor& t : s) out.push_back(t.clone());
  return out;
}

// Forward all pieces in order from state0, then backward in reverse from dy and
// dstate_final, as the StateFlow contract prescribes. Param grads are zeroed first. A layer
// may fill the state it is given in place (attention's K/V prefix), so it gets copies.
inline SplitRun run_split(Layer& layer, const Tensor& x, int64_t batch, int64_t T, const State& state0,
                          const Tensor& dy, const State& dstate_final, const std::vector<int64_t>& pieces) {
  for (Param* p : layer.params()) p->grad.zero_();
  SplitRun r;
  std::vector<ChunkCtx> ctxs;
  std::vector<std::unique_ptr<Stash>> stashes;
  State st = clone_state(state0);
  int64_t off = 0;
  for (size_t c = 0; c < pieces.size(); ++c) {
    ChunkCtx ctx;
    ctx.chunk = int(c), ctx.offset = off, ctx.len = pieces[c], ctx.batch = batch, ctx.num_chunks = int(pieces.size());
    ctx.seq_len = T;
    State out;
    std::unique_ptr<Stash> stash;
    Tensor y = layer.forward(ctx, take_rows(x, batch, T, off, pieces[c]), st, out, stash);
    if (!r.y.defined()) {
      Shape s = y.shape();
      s[0] = batch * T;
      r.y = Tensor::zeros(s, y.dtype());
    }
    put_rows(r.y, y, batch, T, off, pieces[c]);
    st = out;
    ctxs.push_back(ctx);
    stashes.push_back(std::move(stash));
    off += pieces[c];
  }
  r.final_state = st;
  r.dx = Tensor::zeros(x.shape(), x.dtype());
  State dst = clone_state(dstate_final);
  for (size_t c = pieces.size(); c-- > 0;) {
    State din;
    Tensor dxc = layer.backward(ctxs[c], take_rows(dy, batch, T, ctxs[c].offset, ctxs[c].len), dst, din, *stashes[c]);
    put_rows(r.dx, dxc, batch, T, ctxs[c].offset, ctxs[c].len);
    dst = din;
  }
  r.dstate_initial = dst;
  for (Param* p : layer.params()) r.param_grads.push_back(p->grad.clone());
  return r;
}

// The largest |entry| of a float64 tensor: the scale max_rel_diff measures a tensor's error at.
inline double largest_abs(const Tensor& t) {
  double largest = 0;
  for (int64_t e = 0; e < t.numel(); ++e) largest = std::max(largest, std::abs(t.data<double>()[e]));
  return largest;
}

// Directional central differences (central_difference) of loss() along random directions in
// the given tensors (float64). Directions have unit length, and the error is measured against
// the gradient's norm (a random direction can be nearly orthogonal to the gradient, which would
// make a ratio to the directional derivative itself meaningless). Returns the worst
// |fd - analytic| / max(|grad|, 1e-12).
inline double fd_check_tensors(const std::function<double()>& loss, std::vector<Tensor> inputs,
                               std::vector<Tensor> grads, Rng& rng, int n_dirs = 2, double h = 1e-5) {
  double worst = 0;
  for (int d = 0; d < n_dirs; ++d) {
    std::vector<Tensor> dirs;
    double analytic = 0, norm2 = 0, grad2 = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      dirs.push_back(random_tensor(rng, inputs[i].shape()));
      norm2 += dot(dirs[i], dirs[i]);
    }
    // A unit-length direction keeps the truncation error O(h^2) whatever the tensor sizes.
    for (size_t i = 0; i < inputs.size(); ++i) {
      for (int64_t j = 0; j < dirs[i].numel(); ++j) dirs[i].data<double>()[j] /= std::sqrt(norm2);
      analytic += dot(grads[i], dirs[i]);
      grad2 += dot(grads[i], grads[i]);
    }
    auto shift = [&](double s) {
      for (size_t i = 0; i < inputs.size(); ++i)
        for (int64_t j = 0; j < inputs[i].numel(); ++j) inputs[i].data<double>()[j] += s * dirs[i].data<double>()[j];
    };
    const double fd = central_difference(loss, shift, h);
    worst = std::max(worst, std::abs(fd - analytic) / std::max(std::sqrt(grad2), 1e-12));
  }
  return worst;
}

}  // namespace stateflow::testing
