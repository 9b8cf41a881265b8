// Prefix attention through cuDNN's fused flash attention (the cuDNN 9 backend graph API,
// cudnn_graph.h): the semantics and layouts of prefix_attention_cuda.h, one chunk's queries
// against K/V rows [0, offset + len), causal mask aligned bottom-right, grouped K/V heads,
// bf16 operands with fp32 softmax statistics. Plans are built once per shape and thread (a
// build costs milliseconds; chunk shapes repeat) and cached.
//
// The backward comes in two forms (docs/attention.md, "cuDNN"):
//   Deterministic  dQ straight from a materialised dP (cuDNN's workspace path): no atomics,
//                  runs repeat bitwise; workspace ~ batch x heads x len x kv_len x 2 bytes.
//   AtomicDq       dQ accumulated in fp32 with atomics (cuDNN's default, faster, small
//                  workspace): dQ's last bits vary run to run. For measurement only.
// cuDNN writes dK/dV (not +=): they land in a workspace copy and are then added to the fp32
// prefix gradient.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <optional>
#include <string>

#include "mixers/attention/prefix_attention.h"

namespace stateflow {

enum class CudnnBackward { Deterministic, AtomicDq };

// Deterministic mode runs a chunk's queries in pieces cut at absolute positions that are
// multiples of this (the trainer's 2048-token cut grid): a chunk cut on the grid runs the very
// calls the whole sequence runs, so chunked == unchunked bitwise there, and the materialised
// dP of one call is at most batch x heads x 2048 x kv_len x 2 bytes.
constexpr int64_t kCudnnAttentionPiece = 2048;

// Workspace bytes the cuDNN forward and backward of d need (the larger); 0 when cuDNN is not
// available or refuses d (then cudnn_attention_refusal says why).
size_t cudnn_attention_workspace_bytes(const AttentionDims& d, CudnnBackward mode);

// Why cuDNN cannot run d (empty when it can): library missing, or the shape refused.
std::string cudnn_attention_refusal(const AttentionDims& d, CudnnBackward mode);

// Run only when cudnn_attention_refusal(d, mode) is empty; workspace of
// cudnn_attention_workspace_bytes(d, mode) bytes. The forward takes the mode for its pieces.
void cudnn_attention_forward(const AttentionDims& d, CudnnBackward mode, const __nv_bfloat16* q, const __nv_bfloat16* k,
                             const __nv_bfloat16* v, __nv_bfloat16* o, float* lse, void* workspace,
                             cudaStream_t stream);
void cudnn_attention_backward(const AttentionDims& d, CudnnBackward mode, const __nv_bfloat16* q,
                              const __nv_bfloat16* k, const __nv_bfloat16* v, const __nv_bfloat16* o,
                              const float* lse, const __nv_bfloat16* dout, __nv_bfloat16* dq, float* dk, float* dv,
                              void* workspace, cudaStream_t stream);

// For the log and the benchmark: "cuDNN 91900, forward engine 5, backward engine 6 (dK/dV fp32)".
std::string cudnn_attention_describe(const AttentionDims& d, CudnnBackward mode);

// Test seam: while it lives, cuDNN may take at most `bytes` of workspace per call on this thread
// (in place of STATEFLOW_ATTENTION_WORKSPACE_GB), so that a test can make cuDNN refuse shapes it
// runs and check the fallback to our kernels.
class CudnnWorkspaceLimitForTest {
 public:
  explicit CudnnWorkspaceLimitForTest(size_t bytes);
  ~CudnnWorkspaceLimitForTest();
  CudnnWorkspaceLimitForTest(const CudnnWorkspaceLimitForTest&) = delete;
  CudnnWorkspaceLimitForTest& operator=(const CudnnWorkspaceLimitForTest&) = delete;

 private:
  std::optional<size_t> previous_;
};

}  // namespace stateflow
