// Shared by the layers' GPU paths: typed device pointers of tensors and device tensor makers.
// Activations are bf16, per-row statistics, gates and boundary-state gradients fp32; every
// kernel runs on the calling thread's cuBLAS stream (the default stream for now).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/tensor.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/pinned_upload_cuda.h"

namespace stateflow {

using bf16 = __nv_bfloat16;

inline bf16* bf16_ptr(const Tensor& t) { return reinterpret_cast<bf16*>(const_cast<Tensor&>(t).data<BF16>()); }
inline float* f32_ptr(const Tensor& t) { return const_cast<Tensor&>(t).data<float>(); }
// nullptr for an absent tensor (a zero state or state gradient).
inline const bf16* bf16_or_null(const Tensor& t) { return t.defined() ? bf16_ptr(t) : nullptr; }
inline const float* f32_or_null(const Tensor& t) { return t.defined() ? f32_ptr(t) : nullptr; }
inline const Tensor& state_at(const std::vector<Tensor>& s, size_t i) {
  static const Tensor none;
  return s.empty() ? none : s[i];
}

inline Tensor bf16_zeros(const Shape& s) { return Tensor::zeros(s, DType::BF16, current_category(), Device::CUDA); }
inline Tensor f32_zeros(const Shape& s) { return Tensor::zeros(s, DType::F32, current_category(), Device::CUDA); }
// Outputs a kernel or a GEMM with beta = 0 overwrites entirely: no zero-fill issued per chunk.
inline Tensor bf16_out(const Shape& s) {
  return Tensor::uninitialized(s, DType::BF16, current_category(), Device::CUDA);
}
inline Tensor f32_out(const Shape& s) { return Tensor::uninitialized(s, DType::F32, current_category(), Device::CUDA); }

inline cudaStream_t layer_stream() { return cublas_for_thread().stream(); }

// A kernel's workspace of `bytes` as a tensor (charged to Other), for work that outlives the call
// that made it (side work holds its operands until it is joined).
inline Tensor scratch_f32(size_t bytes) {
  return Tensor::uninitialized({int64_t((bytes + 3) / 4)}, DType::F32, MemCategory::Other, Device::CUDA);
}

// A device copy of host tensor t (token ids, targets) for the work queued after it on
// layer_stream(); unlike t.to(Device::CUDA), the host does not wait for the GPU.
inline Tensor to_device_async(const Tensor& t) {
  Tensor d = Tensor::uninitialized(t.shape(), t.dtype(), current_category(), Device::CUDA);  // the copy fills it
  upload_async(d.raw(), t.raw(), t.nbytes(), layer_stream());
  return d;
}

}  // namespace stateflow
