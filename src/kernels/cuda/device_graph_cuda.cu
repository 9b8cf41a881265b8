#include "kernels/cuda/device_graph_cuda.h"

#include <cuda_runtime.h>

#include <atomic>
#include <memory>

#include "core/error.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/levers.h"
#include "kernels/cuda/per_gpu_cuda.h"
#include "kernels/cuda/side_stream_cuda.h"

namespace stateflow {
namespace {

constexpr const char* kSwitchOff = "set STATEFLOW_LEVERS_OFF=graphs to launch the kernels one by one";

// The stream a thread records on, with a cuBLASLt handle of its own (its own workspace and
// pinned algorithms, chosen as the main handle's are), per GPU.
struct RecordingStream {
  cudaStream_t stream = nullptr;
  std::unique_ptr<CublasGemm> gemm;
  RecordingStream() {
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags (graph recording)");
    gemm = std::make_unique<CublasGemm>(stream);
  }
  ~RecordingStream() {  // at thread exit; destructors must not throw
    gemm.reset();
    cudaStreamDestroy(stream);
  }
};

std::atomic<int64_t> g_launched{0}, g_updated{0}, g_instantiated{0}, g_nodes{0};

const CublasGemm*& recording_for_thread() {
  thread_local const CublasGemm* recording = nullptr;
  return recording;
}

class CudaGraph final : public DeviceGraph {
 public:
  ~CudaGraph() override {
    abandon();
    if (exec_) cudaGraphExecDestroy(exec_);
  }

  void begin() override {
    SF_CHECK(recording_for_thread() == nullptr, "CUDA graph: a recording began inside another one on this thread");
    main_ = cublas_for_thread().stream();  // where the graph will run: the thread's main stream
    RecordingStream& r = per_gpu_for_thread<RecordingStream>();
    prepare_side_work_for_thread();  // streams and handles are made outside the recording
    // Relaxed: a block the caching allocator must get from the driver (cudaMalloc) may be
    // allocated while recording; it is an allocation on the host's side, outside the graph.
    const cudaError_t e = cudaStreamBeginCapture(r.stream, cudaStreamCaptureModeRelaxed);
    SF_CHECK(e == cudaSuccess, "CUDA graph: cudaStreamBeginCapture failed (", cudaGetErrorString(e), "); ", kSwitchOff);
    stream_ = r.stream;
    recording_for_thread() = r.gemm.get();
  }

  void end_and_launch() override {
    SF_CHECK(stream_ != nullptr, "CUDA graph: end_and_launch() without begin()");
    recording_for_thread() = nullptr;
    cudaGraph_t graph = nullptr;
    const cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    stream_ = nullptr;
    if (e != cudaSuccess) {
      cudaGetLastError();
      if (graph) cudaGraphDestroy(graph);
      throw Error(cat("CUDA graph: recording the layers' work failed (", cudaGetErrorString(e),
                      "): some call in it waited for the device or used another stream; ", kSwitchOff));
    }
    size_t nodes = 0;
    cudaGraphGetNodes(graph, nullptr, &nodes);
    g_nodes += int64_t(nodes);
    if (exec_) {
      cudaGraphExecUpdateResultInfo info{};
      if (cudaGraphExecUpdate(exec_, graph, &info) != cudaSuccess) {  // another shape: instantiate anew
        cudaGetLastError();
        cudaGraphExecDestroy(exec_);
        exec_ = nullptr;
      } else {
        ++g_updated;
      }
    }
    if (!exec_) {
      const cudaError_t ie = cudaGraphInstantiate(&exec_, graph, 0);
      if (ie != cudaSuccess) {
        cudaGetLastError();
        exec_ = nullptr;
        cudaGraphDestroy(graph);
        throw Error(cat("CUDA graph: cudaGraphInstantiate failed (", cudaGetErrorString(ie), "); ", kSwitchOff));
      }
      ++g_instantiated;
    }
    cudaGraphDestroy(graph);
    cuda_check(cudaGraphLaunch(exec_, main_), "cudaGraphLaunch");
    ++g_launched;
  }

  void abandon() noexcept override {
    if (!stream_) return;
    recording_for_thread() = nullptr;
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);  // may fail: the recording was invalidated
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    stream_ = nullptr;
  }

 private:
  cudaStream_t main_ = nullptr;
  cudaStream_t stream_ = nullptr;  // the recording stream while recording
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace

bool& device_graphs_enabled_for_thread() {
  thread_local bool enabled = !lever_off("graphs");
  return enabled;
}

const CublasGemm* recording_gemm_for_thread() { return recording_for_thread(); }

DeviceGraphCounts cuda_graph_counts() {
  return {g_launched.load(), g_updated.load(), g_instantiated.load(), g_nodes.load()};
}

std::unique_ptr<DeviceGraph> make_cuda_graph() {
  if (!device_graphs_enabled_for_thread()) return nullptr;
  return std::make_unique<CudaGraph>();
}

}  // namespace stateflow
