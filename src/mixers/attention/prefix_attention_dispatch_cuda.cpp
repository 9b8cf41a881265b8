// Which prefix attention runs (prefix_attention_cuda.h): cuDNN's fused attention by default,
// our kernels where cuDNN is missing or refuses a shape (one line on stderr per shape says why),
// or what STATEFLOW_ATTENTION asks for.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <tuple>

#include "core/error.h"
#include "mixers/attention/cudnn_attention.h"
#include "mixers/attention/prefix_attention_cuda.h"

namespace stateflow {

AttentionImpl parse_attention_impl(const char* value) {
  if (!value || !*value || std::strcmp(value, "cudnn") == 0) return AttentionImpl::Cudnn;
  if (std::strcmp(value, "kernels") == 0) return AttentionImpl::Kernels;
  if (std::strcmp(value, "cudnn-atomic") == 0) return AttentionImpl::CudnnAtomic;
  throw Error(std::string("STATEFLOW_ATTENTION is '") + value +
              "'; it must be cudnn (the default), kernels (our own kernels) or cudnn-atomic (cuDNN with a "
              "nondeterministic dQ, for measurement)");
}

AttentionImpl attention_impl() {
  static const AttentionImpl impl = parse_attention_impl(std::getenv("STATEFLOW_ATTENTION"));
  return impl;
}

namespace {

CudnnBackward cudnn_mode() {
  return attention_impl() == AttentionImpl::CudnnAtomic ? CudnnBackward::AtomicDq : CudnnBackward::Deterministic;
}

// Whether cuDNN runs d; when it cannot, says so once per shape (a training run repeats shapes).
bool use_cudnn(const AttentionDims& d) {
  if (attention_impl() == AttentionImpl::Kernels) return false;
  const std::string why = cudnn_attention_refusal(d, cudnn_mode());
  if (why.empty()) return true;
  static std::mutex mu;
  static std::set<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>> told;
  std::lock_guard<std::mutex> lock(mu);
  if (told.insert({d.batch, d.len, d.offset, d.q_heads, d.kv_heads, d.head_dim}).second)
    std::fprintf(stderr,
                 "stateflow: attention of %lld queries at offset %lld (%lld x %lld heads of %lld) runs on our "
                 "kernels, not cuDNN: %s\n",
                 (long long)d.len, (long long)d.offset, (long long)d.q_heads, (long long)d.kv_heads,
                 (long long)d.head_dim, why.c_str());
  return false;
}

}  // namespace

std::string attention_impl_describe(const AttentionDims& d) {
  if (attention_impl() == AttentionImpl::Kernels) return "our kernels (STATEFLOW_ATTENTION=kernels)";
  const std::string why = cudnn_attention_refusal(d, cudnn_mode());
  return why.empty() ? cudnn_attention_describe(d, cudnn_mode()) : "our kernels (" + why + ")";
}

// cuDNN's workspace grows with the chunk's prefix (the deterministic backward materialises dP,
// len x kv_len per head), so each chunk of a sequence would ask the stage's caching allocator
// for a size of its own, and every one would stay cached: at 128K in 16 chunks, 16 blocks of
// 0.25 to 4 GiB (34 GiB) the driver held beyond the tracked peak (docs/attention.md). So every
// chunk asks for what a chunk of its length at the end of the sequence needs: one size, and one
// cached block, per chunk length.
size_t prefix_attention_workspace_bytes(const AttentionDims& d) {
  check_attention_dims_cuda(d);
  if (!use_cudnn(d)) return prefix_attention_kernels_workspace_bytes(d);
  const size_t own = cudnn_attention_workspace_bytes(d, cudnn_mode());
  AttentionDims at_end = d;
  at_end.offset = d.kv_rows - d.len;
  if (!cudnn_attention_refusal(at_end, cudnn_mode()).empty()) return own;  // e.g. over the workspace limit there
  return std::max(own, cudnn_attention_workspace_bytes(at_end, cudnn_mode()));
}

void prefix_attention_forward_cuda(const AttentionDims& d, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                   const __nv_bfloat16* v, __nv_bfloat16* o, float* lse, void* workspace,
                                   cudaStream_t stream) {
  check_attention_dims_cuda(d);
  if (use_cudnn(d)) cudnn_attention_forward(d, cudnn_mode(), q, k, v, o, lse, workspace, stream);
  else prefix_attention_forward_kernels(d, q, k, v, o, lse, stream);
}

void prefix_attention_backward_cuda(const AttentionDims& d, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                    const __nv_bfloat16* v, const __nv_bfloat16* o, const float* lse,
                                    const __nv_bfloat16* dout, __nv_bfloat16* dq, float* dk, float* dv,
                                    void* workspace, cudaStream_t stream) {
  check_attention_dims_cuda(d);
  if (use_cudnn(d)) cudnn_attention_backward(d, cudnn_mode(), q, k, v, o, lse, dout, dq, dk, dv, workspace, stream);
  else prefix_attention_backward_kernels(d, q, k, v, o, lse, dout, dq, dk, dv, workspace, stream);
}

}  // namespace stateflow
