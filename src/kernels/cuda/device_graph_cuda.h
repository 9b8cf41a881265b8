// CUDA graphs of a stage's layer calls (core/device.h's DeviceGraph). The stage executor
// records each run of consecutive blocks of a unit (a pass of every block between the
// embedding and the LM head, in the usual one-stage model) and launches it as one graph, so
// that the device starts each kernel without a launch of its own: short chunks have short
// kernels, and the gaps between them are a fixed cost per chunk.
//
// How a recording works. The thread's main stream is the legacy default stream, which CUDA
// cannot record; so while recording, cublas_for_thread() hands out a second handle of the
// thread, on a stream of its own (non-blocking: other threads' work on the default stream
// neither waits for it nor breaks the recording), and everything the layers issue through
// layer_stream(), SideWork (the side stream joins the recording through its fork event) and
// the backend's zero-fills and device-to-device copies goes into the graph. end_and_launch()
// launches the graph on the main stream, so it runs after the work queued before it and
// before the work queued after: the stream order of launching the kernels one by one.
//
// Each call records anew: the unit's tensors come from the caching allocator and differ from
// call to call. The instantiated graph is kept and updated in place from the new recording
// (cudaGraphExecUpdate: kernel arguments, memset and copy addresses); only a recording of
// another shape (another chunk length, a first or last chunk, another algorithm) is
// instantiated anew. The graph holds no memory of its own: every buffer its kernels touch is
// an allocator block, charged to its tracker as without graphs. The graph's kernels are the
// same kernels with the same arguments in the same order, so results are bitwise those of
// launching them one by one (MixerConformanceCuda.GraphsGiveBitwiseTheStepWithoutThem).
//
// Rules for layer code (recorded layers: Layer::graph_capturable()): issue device work only
// on layer_stream() or through SideWork; no host reads of device results, no waits, no
// events the host queries, no host buffers the device reads later (the embedding's and the
// LM head's pinned uploads are why those two layers are not recorded). A call that breaks a
// rule fails the recording with an error that names the layers and the switch:
// STATEFLOW_LEVERS_OFF=graphs (kernels/cuda/levers.h) launches everything one by one.
// The executor cuts a run into graphs of at most STATEFLOW_GRAPH_LAYERS layers (default 8).
#pragma once
#include <memory>

#include "core/device.h"
#include "kernels/cuda/gemm_cuda.h"

namespace stateflow {

// Whether the stage executor records graphs on this thread: the lever `graphs` (on unless
// STATEFLOW_LEVERS_OFF names it: kernels/cuda/levers.h); tests switch it per thread. A
// stage sharing its GPU with other stage threads records none (StageExecutor::allow_graphs).
bool& device_graphs_enabled_for_thread();

// The handle of the recording in progress on this thread, or nullptr (cublas_for_thread()
// returns it while there is one).
const CublasGemm* recording_gemm_for_thread();

// A graph for the calling thread (nullptr when graphs are off for it).
std::unique_ptr<DeviceGraph> make_cuda_graph();

// What the process's graphs did so far (core/device.h).
DeviceGraphCounts cuda_graph_counts();

}  // namespace stateflow
