// What an op's pass is handed to launch its kernel (kernels/op_def.h): the shape, the
// activation type, the device arrays by name, the workspace and a cuBLAS handle. CUDA builds
// only; an op file sets its passes' `run` inside `#ifdef STATEFLOW_HAVE_CUDA`.
#pragma once
#include <cuda_bf16.h>

#include <map>
#include <string>

#include "core/error.h"
#include "kernels/cuda/gemm_cuda.h"
#include "kernels/op_def.h"

namespace stateflow {

struct OpLaunch {
  const OpShape& shape;
  DType act;
  const std::map<std::string, void*>& arrays;
  void* workspace;
  CublasGemm& gemm;

  int64_t operator[](const std::string& size) const { return shape[size]; }
  template <class T>
  T* at(const std::string& name) const {
    const auto it = arrays.find(name);
    SF_CHECK(it != arrays.end(), "op launch: no array '", name, "'");
    return static_cast<T*>(it->second);
  }
};

// Calls fn(A{}) with A = float or __nv_bfloat16, the type of Storage::Act arrays.
template <class Fn>
void dispatch_act(DType act, Fn&& fn) {
  if (act == DType::BF16)
    fn(__nv_bfloat16{});
  else if (act == DType::F32)
    fn(float{});
  else
    fail("op launch: activations must be f32 or bf16, got ", dtype_name(act));
}

}  // namespace stateflow
