// Runs the units of one pipeline stage through its contiguous slice of the model's layers:
// forward of (m, c) takes each layer's boundary state from chunk c-1 and stores what chunk c
// emits; backward of (m, c) takes the state gradient from chunk c+1, stores the one for
// chunk c-1, and frees the unit's stash as soon as it ends. The order of the calls is the
// caller's (a schedule); this class only keeps the bookkeeping right.
//
// With recomputation (full, per layer) a unit keeps only each layer's input and entering
// boundary state; backward runs each layer's forward again to rebuild its stash just
// before that layer's backward. The results are bitwise those without recomputation.
//
// On a device with graphs (core/device.h's DeviceGraph) each run of consecutive layers that
// may be recorded (Layer::graph_capturable: the blocks, not the embedding or the LM head) is
// recorded during one unit's pass and launched as one graph, kept per (first layer, pass,
// unit shape) so that the next unit of that shape updates it instead of instantiating it.
// A run longer than graph_layers() layers is cut into graphs of that many: the device waits
// for a graph's whole recording before it runs any of it, so the first graph of a unit
// should be short.
// A graph launches the same kernels in the same order: the results are bitwise the same.
// Not while a profile times each layer (it times each layer's own launches).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "core/device.h"
#include "model/layer.h"
#include "pipeline/layer_profile.h"
#include "pipeline/state_store.h"

namespace stateflow {

// Layers per device graph at most: STATEFLOW_GRAPH_LAYERS, default 8 (two blocks of a mixer and
// an MLP each); throws Error naming the variable on a value that is no positive integer.
int graph_layers();

class StageExecutor {
 public:
  // layers: this stage's slice; first_layer: its index in the whole model (state keys).
  StageExecutor(std::vector<Layer*> layers, int first_layer, bool recompute = false);
  // x: token ids on the first stage, hidden states otherwise. Returns the hidden states for
  // the next stage, or the unit's loss (1 element) on the last stage (nothing when the loss
  // layer adds it to ctx.device_stats instead).
  Tensor forward(const ChunkCtx& ctx, const Tensor& x);
  // dy: gradient of this stage's output (ignored on the last stage, where the loss starts
  // backprop). Returns the gradient of the stage input (undefined on the first stage).
  // layer_done(j), when given, is called right after layer j (index in this stage) is done.
  Tensor backward(const ChunkCtx& ctx, const Tensor& dy, const std::function<void(int)>& layer_done = {});
  // Units forwarded whose backward has not run yet.
  size_t units_in_flight() const { return stash_.size(); }
  // Bytes the in-flight units' stashes hold (measured by the allocator: what a unit's forward
  // left allocated, less its output), now and at its peak since reset_peak_stash().
  int64_t stash_bytes() const { return stash_bytes_; }
  int64_t peak_stash_bytes() const { return peak_stash_bytes_; }
  void reset_peak_stash() { peak_stash_bytes_ = stash_bytes_; }
  // Whether this executor may record device graphs (default yes, where the device and the
  // `graphs` lever allow). A stage whose GPU other stage threads of the process share turns
  // them off: another thread's device-wide synchronisation during a recording is an error.
  void allow_graphs(bool allowed) { graphs_allowed_ = allowed; }
  // When set, every layer call is timed into it (host vs device, layer_profile.h); nullptr stops.
  void set_profile(std::unique_ptr<LayerProfile> p) { profile_ = std::move(p); }
  const LayerProfile* profile() const { return profile_.get(); }

 private:
  std::vector<Layer*> layers_;
  int first_layer_;
  bool recompute_;
  struct UnitStash {
    std::vector<std::unique_ptr<Stash>> layers;
    std::vector<Tensor> inputs;     // recomputation: each layer's input
    std::vector<State> states_in;   // recomputation: each layer's entering boundary state
    int64_t bytes = 0;
  };
  std::map<std::pair<int, int>, UnitStash> stash_;  // by (m, c)
  int64_t stash_bytes_ = 0, peak_stash_bytes_ = 0;
  StateStore states_;       // forward boundary states
  StateStore state_grads_;  // their gradients, flowing backward
  std::unique_ptr<LayerProfile> profile_;
  // Runs fn, one call of layer i, through the profile when there is one.
  void run_layer(size_t i, Pass pass, const std::function<void()>& fn);

  // Device graphs: (first layer, pass, batch, chunk length, first chunk, last chunk) -> its
  // graph (nullptr: the device records none, or graphs are off on this thread).
  using GraphKey = std::tuple<size_t, int, int64_t, int64_t, bool, bool>;
  std::map<GraphKey, std::unique_ptr<DeviceGraph>> graphs_;
  Device device_ = Device::CPU;       // where the layers' parameters live
  bool graphs_allowed_ = true;        // allow_graphs()
  DeviceGraph* recording_ = nullptr;  // the graph being recorded, if any
  size_t recording_first_ = 0;        // the layer it began at
  int recorded_layers_ = 0;           // layers in it so far
  int graph_layers_ = 0;              // graph_layers(), read when the first graph is made
  // Before layer i of a pass: ends the recording at a layer that may not be recorded, begins
  // one at a layer that may (when there is none yet).
  void record_layer(size_t i, Pass pass, const ChunkCtx& ctx);
  // Launches the recording in progress, if any, with the side work it left deferred.
  void launch_recording();
  // Drops the recording in progress after an error (nothing of it runs).
  void abandon_recording() noexcept;
  friend struct RecordingGuard;
};

}  // namespace stateflow
