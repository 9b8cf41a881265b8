// The forward/backward dispatch every mixer layer shares: device tensors go to the GPU path
// registered under the layer's kind (model/device_path.h), host tensors to the layer's own
// typed implementation, `forward_impl<T>` / `backward_impl<T>` for T = float or double. A mixer
// derives from MixerLayer<Itself> and declares `friend class MixerLayer<Itself>;` if those are
// private.
#pragma once
#include "model/device_path.h"
#include "model/layer.h"

namespace stateflow {

template <class Derived>
class MixerLayer : public Layer {
 public:
  bool stateful() const override { return true; }
  // Every mixer's GPU path (GDN, Mamba-3, attention) keeps the graph rules (model/layer.h); a
  // mixer whose path cannot be recorded overrides this with false.
  bool graph_capturable() const override { return true; }
  Tensor forward(const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                 std::unique_ptr<Stash>& stash) final {
    if (!x.on_host()) return device_path(kind()).forward(*this, ctx, x, state_in, state_out, stash);
    return dispatch_float(x.dtype(), [&](auto z) {
      return self().template forward_impl<decltype(z)>(ctx, x, state_in, state_out, stash);
    });
  }
  Tensor backward(const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                  Stash& stash) final {
    if (!dy.on_host()) return device_path(kind()).backward(*this, ctx, dy, dstate_out, dstate_in, stash);
    return dispatch_float(dy.dtype(), [&](auto z) {
      return self().template backward_impl<decltype(z)>(ctx, dy, dstate_out, dstate_in, stash);
    });
  }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
};

}  // namespace stateflow
