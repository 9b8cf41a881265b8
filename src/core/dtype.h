// Element types and a dispatcher from a runtime DType to a template parameter.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"

namespace stateflow {

enum class DType { F32, F64, I32 };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::I32: return 4;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::I32: return "i32";
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
