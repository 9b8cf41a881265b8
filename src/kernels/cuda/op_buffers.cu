#include "kernels/cuda/op_buffers.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <limits>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/op_launch.h"
#include "kernels/op_inputs.h"

namespace stateflow {
namespace {

constexpr size_t kGuardBytes = 1 << 16;
constexpr unsigned char kGuardByte = 0xA5;

template <class T>
__device__ void store(T* p, int64_t i, double x) {
  if constexpr (std::is_same_v<T, int32_t>)
    p[i] = int32_t(x);
  else
    p[i] = T(float(x));
}

// One thread per row of `width` (UnitRows) or per element (width 1).
template <class T>
__global__ void draw_kernel(T* p, int64_t n, int64_t width, Fill fill, uint64_t seed) {
  const int64_t rows = n / width;
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows; r += int64_t(gridDim.x) * blockDim.x) {
    const double inv = fill.kind == Fill::Kind::UnitRows ? op_inputs::inv_row_norm(seed, uint64_t(r), width) : 1.0;
    for (int64_t j = r * width; j < (r + 1) * width; ++j) store(p, j, op_inputs::fill_value(fill, seed, j, inv));
  }
}

template <class T>
void draw_typed(void* p, int64_t n, const Fill& fill, uint64_t seed) {
  const int64_t width = fill.kind == Fill::Kind::UnitRows ? fill.width : 1;
  draw_kernel<T><<<2048, 256>>>(static_cast<T*>(p), n, width, fill, seed);
  cuda_check_launch("op input draw");
}

template <class Fn>
void dispatch_stored(DType t, Fn&& fn) {
  switch (t) {
    case DType::F32: return fn(float{});
    case DType::BF16: return fn(__nv_bfloat16{});
    case DType::I32: return fn(int32_t{});
    default: fail("op arrays are f32, bf16 or i32, not ", dtype_name(t));
  }
}

}  // namespace

OpBuffers::OpBuffers(const OpDef& op, const OpShape& shape, DType act)
    : op_(op), shape_(shape), act_(act), arrays_(op.arrays(shape)), gemm_(std::make_unique<CublasGemm>()) {
  auto alloc = [&](size_t bytes, const std::string& what) {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 16));
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw OutOfMemoryError(cat("op '", op.name, "' at {", shape.label(), "}: no device memory for ", what, " (",
                                 bytes, " bytes); try a smaller shape"));
    }
    cuda_check(e, "cudaMalloc (op arrays)");
    bytes_ += bytes;
    return p;
  };
  try {
    for (const OpArray& a : arrays_) ptrs_[a.name] = alloc(size_t(a.size) * array_bytes(a.type, act), a.name);
    workspace_bytes_ = op.workspace_bytes(shape);
    workspace_ = alloc(workspace_bytes_ + kGuardBytes, "the workspace");
    cuda_check(cudaMemset(static_cast<char*>(workspace_) + workspace_bytes_, kGuardByte, kGuardBytes),
               "op workspace guard");
  } catch (...) {
    for (auto& [name, p] : ptrs_) cudaFree(p);
    throw;
  }
}

OpBuffers::~OpBuffers() {
  for (auto& [name, p] : ptrs_) cudaFree(p);
  cudaFree(workspace_);
}

void* OpBuffers::ptr(const std::string& name) const {
  const auto it = ptrs_.find(name);
  SF_CHECK(it != ptrs_.end(), "op '", op_.name, "' has no array '", name, "'");
  return it->second;
}

void OpBuffers::upload(const OpHost& host) {
  for (const OpArray& a : arrays_) {
    const auto it = host.find(a.name);
    SF_CHECK(it != host.end() && int64_t(it->second.size()) == a.size, "op '", op_.name, "': host array '", a.name,
             "' missing or not ", a.size, " elements");
    dispatch_stored(array_dtype(a.type, act_), [&](auto tag) {
      using T = decltype(tag);
      std::vector<T> t(it->second.size());
      for (size_t i = 0; i < t.size(); ++i) {
        if constexpr (std::is_same_v<T, int32_t>)
          t[i] = int32_t(it->second[i]);
        else
          t[i] = T(float(it->second[i]));
      }
      cuda_check(cudaMemcpy(ptr(a.name), t.data(), t.size() * sizeof(T), cudaMemcpyHostToDevice), "op upload");
    });
  }
}

void OpBuffers::draw(uint64_t seed) {
  for (size_t i = 0; i < arrays_.size(); ++i) {
    const OpArray& a = arrays_[i];
    if (a.role == Role::Out) continue;
    dispatch_stored(array_dtype(a.type, act_),
                    [&](auto tag) { draw_typed<decltype(tag)>(ptr(a.name), a.size, a.fill, array_seed(seed, i)); });
  }
}

void OpBuffers::poison_outputs() {
  for (const OpArray& a : arrays_)
    if (a.role == Role::Out)
      dispatch_stored(array_dtype(a.type, act_), [&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, int32_t>) {
          const std::vector<T> nan(size_t(a.size), T(std::numeric_limits<float>::quiet_NaN()));
          cuda_check(cudaMemcpy(ptr(a.name), nan.data(), nan.size() * sizeof(T), cudaMemcpyHostToDevice), "op poison");
        }
      });
}

std::vector<unsigned char> OpBuffers::raw(const std::string& name) const {
  for (const OpArray& a : arrays_)
    if (a.name == name) {
      std::vector<unsigned char> b(size_t(a.size) * array_bytes(a.type, act_));
      cuda_check(cudaMemcpy(b.data(), ptr(name), b.size(), cudaMemcpyDeviceToHost), "op download");
      return b;
    }
  fail("op '", op_.name, "' has no array '", name, "'");
}

OpHost OpBuffers::download() const {
  OpHost host;
  for (const OpArray& a : arrays_)
    dispatch_stored(array_dtype(a.type, act_), [&](auto tag) {
      using T = decltype(tag);
      std::vector<T> t(size_t(a.size));
      cuda_check(cudaMemcpy(t.data(), ptr(a.name), t.size() * sizeof(T), cudaMemcpyDeviceToHost), "op download");
      std::vector<double>& v = host[a.name];
      for (const T& x : t) {
        if constexpr (std::is_same_v<T, int32_t>)
          v.push_back(double(x));
        else
          v.push_back(double(float(x)));
      }
    });
  return host;
}

void OpBuffers::run(const OpPass& pass) {
  SF_CHECK(pass.run, "op '", op_.name, "' pass '", pass.name, "' has no CUDA launch");
  pass.run(OpLaunch{shape_, act_, ptrs_, workspace_, *gemm_});
}

bool OpBuffers::workspace_overrun() const {
  std::vector<unsigned char> guard(kGuardBytes);
  cuda_check(cudaMemcpy(guard.data(), static_cast<char*>(workspace_) + workspace_bytes_, kGuardBytes,
                        cudaMemcpyDeviceToHost),
             "op workspace guard");
  for (unsigned char b : guard)
    if (b != kGuardByte) return true;
  return false;
}

void OpBuffers::run_all() {
  for (const OpPass& p : op_.passes) run(p);
}

}  // namespace stateflow
