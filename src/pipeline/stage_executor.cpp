#include "pipeline/stage_executor.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "core/deferred_work.h"
#include "core/error.h"

namespace stateflow {

int graph_layers() {
  const char* v = std::getenv("STATEFLOW_GRAPH_LAYERS");
  if (!v || !*v) return 8;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  SF_CHECK(*end == '\0' && n >= 1 && n <= 1'000'000, "STATEFLOW_GRAPH_LAYERS = '", v,
           "' is no number of layers; give a positive integer (layers per device graph; default 8)");
  return int(n);
}

// Ends a unit's pass with the recording in progress dropped, when an error left one open.
struct RecordingGuard {
  StageExecutor& executor;
  ~RecordingGuard() { executor.abandon_recording(); }
};

StageExecutor::StageExecutor(std::vector<Layer*> layers, int first_layer, bool recompute)
    : layers_(std::move(layers)), first_layer_(first_layer), recompute_(recompute) {
  for (Layer* l : layers_)
    for (Param* p : l->params())
      if (p->value.device() != Device::CPU) device_ = p->value.device();
}

void StageExecutor::run_layer(size_t i, Pass pass, const std::function<void()>& fn) {
  if (profile_) return profile_->time(first_layer_ + static_cast<int>(i), layers_[i]->kind(), pass, fn);
  if (!recording_) return fn();
  try {
    fn();
  } catch (const OutOfMemoryError&) {
    throw;  // the benchmark goes on after a run out of memory
  } catch (const Error& e) {
    throw Error(cat(e.what(), " (while recording layers ", first_layer_ + int(recording_first_), " to ",
                    first_layer_ + int(i), " into a device graph: set STATEFLOW_LEVERS_OFF=graphs to launch their "
                    "work without graphs)"));
  }
}

void StageExecutor::record_layer(size_t i, Pass pass, const ChunkCtx& ctx) {
  if (device_ == Device::CPU || profile_ || !graphs_allowed_) return;
  if (!layers_[i]->graph_capturable()) return launch_recording();
  if (recording_ && recorded_layers_ < graph_layers_) {
    ++recorded_layers_;
    return;
  }
  launch_recording();  // a full one
  if (graph_layers_ == 0) graph_layers_ = graph_layers();
  auto& graph = graphs_[GraphKey{i, int(pass), ctx.batch, ctx.len, ctx.chunk == 0, ctx.chunk == ctx.num_chunks - 1}];
  if (!graph) {
    graph = device_backend(device_).make_graph();
    if (!graph) return;  // graphs are off
  }
  // The side work left deferred so far was issued outside the graph: the main stream waits for
  // it here, since a recording cannot wait for work issued before it began.
  finish_deferred_work();
  graph->begin();
  recording_ = graph.get(), recording_first_ = i, recorded_layers_ = 1;
}

void StageExecutor::launch_recording() {
  if (!recording_) return;
  finish_deferred_work();  // inside the graph: its side work joins it
  DeviceGraph* g = recording_;
  recording_ = nullptr;
  g->end_and_launch();
}

void StageExecutor::abandon_recording() noexcept {
  if (recording_) recording_->abandon();
  recording_ = nullptr;
}

Tensor StageExecutor::forward(const ChunkCtx& ctx, const Tensor& x) {
  auto key = std::make_pair(ctx.microbatch, ctx.chunk);
  SF_CHECK(!stash_.count(key), "unit (", ctx.microbatch, ", ", ctx.chunk, ") forwarded twice");
  UnitStash unit;
  unit.layers.resize(layers_.size());
  CategoryScope activations(MemCategory::Activations);
  const int64_t before = current_tracker().snapshot().current_of(MemCategory::Activations);
  const bool last_chunk = ctx.chunk == ctx.num_chunks - 1;
  Tensor h = x;
  RecordingGuard guard{*this};
  for (size_t i = 0; i < layers_.size(); ++i) {
    const int id = first_layer_ + static_cast<int>(i);
    State in = ctx.chunk > 0 ? states_.take(id, ctx.microbatch, ctx.chunk - 1) : State{};
    SF_CHECK(ctx.chunk == 0 || !layers_[i]->stateful() || !in.empty(), "forward of unit (", ctx.microbatch, ", ",
             ctx.chunk, ") before chunk ", ctx.chunk - 1, " on layer ", id, ": chunks must go forward in order");
    State out;
    if (recompute_) unit.inputs.push_back(h), unit.states_in.push_back(in);
    record_layer(i, Pass::Forward, ctx);
    run_layer(i, Pass::Forward, [&] { h = layers_[i]->forward(ctx, h, in, out, unit.layers[i]); });
    if (recompute_) unit.layers[i].reset();
    if (!last_chunk && !out.empty()) states_.put(id, ctx.microbatch, ctx.chunk, std::move(out));
  }
  launch_recording();
  const int64_t bytes = current_tracker().snapshot().current_of(MemCategory::Activations) - before -
                        (h.defined() && h.category() == MemCategory::Activations ? int64_t(h.nbytes()) : 0);
  unit.bytes = bytes;
  stash_[key] = std::move(unit);
  stash_bytes_ += bytes;
  peak_stash_bytes_ = std::max(peak_stash_bytes_, stash_bytes_);
  return h;
}

Tensor StageExecutor::backward(const ChunkCtx& ctx, const Tensor& dy, const std::function<void(int)>& layer_done) {
  auto it = stash_.find({ctx.microbatch, ctx.chunk});
  SF_CHECK(it != stash_.end(), "backward of unit (", ctx.microbatch, ", ", ctx.chunk, ") without its forward");
  CategoryScope activations(MemCategory::Activations);
  UnitStash& unit = it->second;
  ChunkCtx again = ctx;
  again.recomputing = true;  // the loss was counted in the first forward
  Tensor g = dy;
  // A layer's weight gradients may run on beside the next layer's backward; all are done
  // (on the device's order) when this returns, and before each layer_done.
  DeferredWorkScope deferred;
  RecordingGuard guard{*this};
  for (size_t j = layers_.size(); j-- > 0;) {
    const int id = first_layer_ + static_cast<int>(j);
    State dout = state_grads_.take(id, ctx.microbatch, ctx.chunk);
    SF_CHECK(ctx.chunk == ctx.num_chunks - 1 || !layers_[j]->stateful() || !dout.empty(), "backward of unit (",
             ctx.microbatch, ", ", ctx.chunk, ") before chunk ", ctx.chunk + 1,
             ": chunks must go backward in reverse order");
    record_layer(j, Pass::Backward, ctx);
    if (recompute_) {
      State discarded;
      run_layer(j, Pass::Recompute,
                [&] { layers_[j]->forward(again, unit.inputs[j], unit.states_in[j], discarded, unit.layers[j]); });
      unit.inputs[j] = Tensor(), unit.states_in[j].clear();
    }
    State din;
    run_layer(j, Pass::Backward, [&] { g = layers_[j]->backward(ctx, g, dout, din, *unit.layers[j]); });
    unit.layers[j].reset();  // this layer's activations are done
    if (ctx.chunk > 0 && !din.empty()) state_grads_.put(id, ctx.microbatch, ctx.chunk - 1, std::move(din));
    if (layer_done) launch_recording(), finish_deferred_work(), layer_done(int(j));
  }
  launch_recording();
  stash_bytes_ -= unit.bytes;
  stash_.erase(it);
  return g;
}

}  // namespace stateflow
