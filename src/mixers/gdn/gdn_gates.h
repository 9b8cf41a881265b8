// GDN gates (MATH.md section 2), per row and value head h:
//   beta = sigmoid(b)                       g = -exp(A_log[h]) * softplus(a + dt_bias[h])
// a, b, g, beta are [rows, heads]. da, db overwritten; dA_log, ddt_bias accumulated (+=).
#pragma once
#include <cstdint>

namespace stateflow {

template <class T>
void gdn_gates_forward(const T* a, const T* b, const T* A_log, const T* dt_bias, T* g, T* beta, int64_t rows,
                       int64_t heads);
template <class T>
void gdn_gates_backward(const T* a, const T* b, const T* A_log, const T* dt_bias, const T* dg, const T* dbeta,
                        T* da, T* db, T* dA_log, T* ddt_bias, int64_t rows, int64_t heads);

}  // namespace stateflow
