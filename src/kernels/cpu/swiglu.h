// SwiGLU gate of the MLP: h = silu(a) * b, elementwise over n values. da, db overwritten.
#pragma once
#include <cstdint>

namespace stateflow {

template <class T>
void swiglu_forward(const T* a, const T* b, T* h, int64_t n);
template <class T>
void swiglu_backward(const T* a, const T* b, const T* dh, T* da, T* db, int64_t n);

}  // namespace stateflow
