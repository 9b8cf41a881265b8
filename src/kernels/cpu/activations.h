// Scalar activation functions shared by the kernels.
#pragma once
#include <cmath>

namespace stateflow {

template <class T> inline T sigmoid(T x) { return T(1) / (T(1) + std::exp(-x)); }
template <class T> inline T silu(T x) { return x * sigmoid(x); }
// d silu / dx = s (1 + x (1 - s)),  s = sigmoid(x)
template <class T> inline T silu_grad(T x) {
  T s = sigmoid(x);
  return s * (T(1) + x * (T(1) - s));
}
// softplus(x) = log(1 + e^x), computed without overflow.
template <class T> inline T softplus(T x) { return x > T(20) ? x : std::log1p(std::exp(x)); }

}  // namespace stateflow
