// The GPU paths of layers, by layer kind. A layer's CUDA part (model/cuda/*.cpp, or a mixer's
// src/mixers/<name>/*_cuda.cpp) registers its forward and backward when it is built; a layer
// handed device tensors calls them through here. A CPU-only build has none registered, so it
// needs no stand-ins: asking for one is the error that says to rebuild with CUDA.
#pragma once
#include <memory>
#include <string>

#include "model/layer.h"

namespace stateflow {

struct DevicePath {
  Tensor (*forward)(Layer& layer, const ChunkCtx& ctx, const Tensor& x, const State& state_in, State& state_out,
                    std::unique_ptr<Stash>& stash);
  Tensor (*backward)(Layer& layer, const ChunkCtx& ctx, const Tensor& dy, const State& dstate_out, State& dstate_in,
                     Stash& stash);
};

struct DevicePathRegistration {
  DevicePathRegistration(const std::string& kind, DevicePath path);
};

// Throws Error when this build has no GPU path for the kind.
const DevicePath& device_path(const std::string& kind);
bool has_device_path(const std::string& kind);

// Registers layer class L's GPU path: its members forward_cuda and backward_cuda, which have
// Layer's forward and backward signatures and are defined in the CUDA file that says
//   static const DevicePathRegistration registered = device_path_of<GatedDeltaNet>("gdn");
template <class L>
DevicePathRegistration device_path_of(const std::string& kind) {
  return DevicePathRegistration(
      kind, {[](Layer& l, const ChunkCtx& ctx, const Tensor& x, const State& si, State& so,
                std::unique_ptr<Stash>& stash) { return static_cast<L&>(l).forward_cuda(ctx, x, si, so, stash); },
             [](Layer& l, const ChunkCtx& ctx, const Tensor& dy, const State& dso, State& dsi, Stash& stash) {
               return static_cast<L&>(l).backward_cuda(ctx, dy, dso, dsi, stash);
             }});
}

}  // namespace stateflow
