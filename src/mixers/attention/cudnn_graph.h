// A small C++ layer over cuDNN's backend (graph) API: the library is loaded at run time
// (dlopen of libcudnn.so.9), so a build that found cuDNN's headers still runs where the library
// is missing (the caller falls back to its own kernels and says why). Only what the attention
// graphs need: tensors, matmul / pointwise / reduction / reshape nodes, engine heuristics, an
// execution plan, and running it with a variant pack.
//
// Usage: a CudnnGraph collects tensors (each a unique id) and nodes; build() finalizes the
// operation graph, asks the heuristics for engine configurations and keeps the first one that
// finalizes; run() binds device pointers to ids. Every failure throws stateflow::Error with cuDNN's own message.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#ifdef STATEFLOW_HAVE_CUDNN
#include <cudnn_graph.h>
#endif

namespace stateflow {

// cuDNN's version (e.g. 91900) once loaded, else 0 with the reason in cudnn_unavailable_reason().
int64_t cudnn_version();
std::string cudnn_unavailable_reason();

#ifdef STATEFLOW_HAVE_CUDNN

// The calling thread's cuDNN handle on its current GPU (created on first use).
cudnnHandle_t cudnn_handle_for_thread();

// One backend descriptor, destroyed with its owner.
class CudnnDesc {
 public:
  explicit CudnnDesc(cudnnBackendDescriptorType_t type);
  ~CudnnDesc();
  CudnnDesc(const CudnnDesc&) = delete;
  CudnnDesc& operator=(const CudnnDesc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }

  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count, const void* values);
  void finalize(const char* what);

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

// A finalized execution plan with what running it needs.
struct CudnnPlan {
  std::shared_ptr<CudnnDesc> plan;
  std::vector<std::shared_ptr<CudnnDesc>> keep;         // descriptors the plan refers to
  std::vector<std::pair<int64_t, const void*>> scalars;  // by-value tensors: id -> host value
  std::shared_ptr<std::deque<double>> scalar_storage;    // where those host values live
  int64_t workspace_bytes = 0;
  std::string engine;  // "engine 6" (cuDNN's global index), for the log line

  // Runs on `stream` with (id, device pointer) for every non-virtual, non-scalar tensor.
  void run(cudaStream_t stream, const std::vector<std::pair<int64_t, void*>>& tensors, void* workspace) const;
};

class CudnnGraph {
 public:
  CudnnGraph();

  // A tensor of `dims` with `strides` (elements); virtual tensors live only inside the fused kernel.
  int64_t tensor(cudnnDataType_t type, std::vector<int64_t> dims, std::vector<int64_t> strides, bool is_virtual);
  // A scalar passed by value (fp32 or int32).
  int64_t scalar_f32(float v);
  int64_t scalar_i32(int32_t v);

  // c = a b (batched over the leading dims; the batch dims of b may divide a's: grouped heads).
  void matmul(int64_t a, int64_t b, int64_t c);
  // y = op(x[, b][, t]) with `math` the compute type; `axis` for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, int64_t x, int64_t y, int64_t b = -1, int64_t t = -1,
                 cudnnDataType_t math = CUDNN_DATA_FLOAT, int64_t axis = -1);
  // y = reduce(x) over the dims where y has extent 1 (or a divisor: grouped heads).
  void reduction(cudnnReduceTensorOp_t op, int64_t x, int64_t y);
  // y = x with other dims/strides (a transposed view).
  void reshape(int64_t x, int64_t y);

  // The plan of the first engine the heuristics (mode A, then fallback) offer that finalizes.
  // Throws naming every refusal. (cuDNN 9.19 notes no engine of these graphs NONDETERMINISTIC,
  // not even the atomic-dQ backward's, so determinism comes from the graph, not the notes.)
  CudnnPlan build(const char* what);

 private:
  template <class T>
  int64_t scalar(cudnnDataType_t type, T v);
  std::shared_ptr<CudnnDesc> desc(int64_t id) const;
  void add_op(std::shared_ptr<CudnnDesc> op) { ops_.push_back(std::move(op)); }

  std::vector<std::pair<int64_t, std::shared_ptr<CudnnDesc>>> tensors_;
  std::vector<std::shared_ptr<CudnnDesc>> ops_, keep_;
  std::vector<std::pair<int64_t, const void*>> scalars_;
  std::shared_ptr<std::deque<double>> scalar_storage_;
  int64_t next_id_ = 1;
};

#endif  // STATEFLOW_HAVE_CUDNN

}  // namespace stateflow
