// Element types and a dispatcher from a runtime DType to a template parameter.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"

namespace stateflow {

// BF16 is a storage type: the host only holds its bits (bf16_from_float / float_from_bf16
// convert); arithmetic on it happens in the CUDA kernels.
enum class DType { F32, F64, I32, BF16 };

struct BF16 {
  uint16_t bits;
};

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::BF16: return 2;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::I32: return "i32";
    case DType::BF16: return "bf16";
  }
  return "?";
}

inline DType parse_dtype(const std::string& s) {
  if (s == "f32" || s == "float32") return DType::F32;
  if (s == "f64" || s == "float64") return DType::F64;
  fail("unknown dtype '", s, "': use f32 or f64");
}

template <class T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<BF16>() { return DType::BF16; }

// Round to nearest even, as the GPU's cast does; NaN stays a (quiet) NaN.
inline BF16 bf16_from_float(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BF16{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return BF16{static_cast<uint16_t>(u >> 16)};
}
inline float float_from_bf16(BF16 b) {
  uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// Calls fn(T{}) with T = float or double according to t.
template <class Fn>
decltype(auto) dispatch_float(DType t, Fn&& fn) {
  switch (t) {
    case DType::F32: return fn(float{});
    case DType::F64: return fn(double{});
    default: fail("expected a floating-point tensor, got ", dtype_name(t));
  }
}

}  // namespace stateflow
