// The chunk interface every layer implements (ARCHITECTURE.md "Layers").
//
//   forward (ctx, x[batch*len, ...], state_in  -> y, state_out, stash)
//   backward(ctx, dy, dstate_out, stash        -> dx, dstate_in, += param grads)
//
// A layer object holds parameters only. Boundary states (and their gradients) are passed
// in and out and live in the caller's store, keyed by (layer, microbatch, chunk). An
// empty State means "all zeros": the state entering chunk 0, and the gradient leaving the
// last chunk. Stateful layers always return a full state / state gradient.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/cross_entropy.h"
#include "model/param.h"

namespace stateflow {

// Loss statistics as GPU loss layers add them up on the device, in the layout of
// LossStatsCuda (kernels/cuda/cross_entropy_cuda.h); read on the host after a step.
struct DeviceLossStats {
  double loss_sum;
  uint64_t correct, counted;
  uint64_t bad_targets;  // targets outside [-1, vocab): an error
};

// Where a unit sits: which microbatch and chunk, and the chunk's span of the sequence.
struct ChunkCtx {
  int microbatch = 0;
  int chunk = 0;
  int64_t offset = 0;  // first token of the chunk within the sequence
  int64_t len = 0;     // tokens in the chunk
  int64_t seq_len = 0; // tokens in the whole sequence (sizes the attention's K/V prefix buffers)
  int64_t batch = 1;   // sequences in the microbatch
  int num_chunks = 1;  // chunks per sequence (the last one emits no state to anyone)
  // Loss layers only: targets[batch*len] (int32, -1 = no loss at this position), the factor
  // that turns a sum of token losses into this step's mean loss, and where to add stats.
  Tensor targets;
  double loss_scale = 1.0;
  LossStats* stats = nullptr;
  // GPU loss layers: when set (device memory), they add the unit's statistics there and return
  // no loss tensor, instead of filling `stats` and returning the loss, which would make the
  // host wait for the GPU at every chunk. The caller reads the sums once, after the step.
  DeviceLossStats* device_stats = nullptr;
  // A forward run again in backward only to rebuild the stash (--recompute full): its output is
  // not used, so loss layers keep what their backward needs and skip the loss (no logits).
  bool recomputing = false;
  // Inference (evaluation, generation): when set, loss layers also store the chunk's logits
  // [batch*len, vocab] here, on the host, in the layer's precision (f32 on the GPU).
  Tensor* logits = nullptr;
  // GPU forward: a pre-norm residual block's input x, which a layer whose
  // adds_residual_on_device() is true adds to its output in its last GEMM's epilogue
  // (y = x + f(h), one rounding), so the block issues no add of its own (lever residual_epilogue).
  const Tensor* residual = nullptr;
};

// Layer-defined boundary state: e.g. GDN = {S, conv prefix q, k, v}; empty when stateless.
// A state handed to forward, and a state gradient handed to backward, passes to the layer: it
// may fill it in place and hand the same storage on (attention's K/V prefix grows so, row
// block by row block). A caller that keeps using one passes a copy.
using State = std::vector<Tensor>;

// Typed data of t, or nullptr for an absent tensor (a zero state or gradient).
template <class T> const T* ptr_or_null(const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; }
// Typed data of tensor i of a boundary state, or nullptr when the state is empty (all zeros).
template <class T> const T* state_ptr(const State& s, size_t i) { return s.empty() ? nullptr : ptr_or_null<T>(s[i]); }

// What a unit's forward saved for its backward. Layers derive their own; it is freed when
// the backward ends, which is what releases a chunk's activations.
struct Stash {
  virtual ~Stash() = default;
};

class Layer {
 public:
  virtual ~Layer() = default;
  virtual std::string kind() const = 0;
  virtual std::vector<Param*> params() = 0;
  virtual bool stateful() const { return false; }
  // Whether the stage executor may record this layer's device work into a graph
  // (core/device.h's DeviceGraph): true only for layers whose GPU path issues all of its work
  // on layer_stream() or through SideWork and never waits for the device or reads results on
  // the host (kernels/cuda/device_graph_cuda.h gives the rules).
  virtual bool graph_capturable() const { return false; }
  // Whether the layer's device forward adds ChunkCtx::residual to its output when given one (in its
  // last GEMM's epilogue). The CPU path never gets one.
  virtual bool adds_residual_on_device() const { return false; }

  virtual Tensor forward(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                         std::unique_ptr<Stash>& stash) = 0;
  virtual Tensor backward(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                          Stash& stash) = 0;
};

}  // namespace stateflow
