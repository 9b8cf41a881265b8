// Scalar-decay linear attention (the recurrence of RetNet and of Mamba-2's SSD), per head:
//   S_t = exp(g_t) S_{t-1} + v_t k_t^T,     o_t = scale * S_t q_t
// with a data-dependent log-decay g_t <= 0. One call runs one chunk of every sequence of a
// batch from the boundary state S_in and emits S_out; the backward returns the gradients of
// q, k, v, g and of S_in. Written as the token recurrence: this mixer is the registry's small
// worked example (docs/design.md), so it has no chunkwise kernel.
//
// Layouts (row-major): q, k [batch, len, heads, dk]; v, o [batch, len, heads, dv];
// g [batch, len, heads]; S [batch, heads, dv, dk]. S_in == nullptr is a zero state, dS_out ==
// nullptr a zero gradient. Outputs are overwritten.
#pragma once
#include <cstdint>

namespace stateflow {

struct SdecayDims {
  int64_t batch, len, heads, dk, dv;
  double scale;  // on q, usually 1/sqrt(dk)
};

template <class T>
void sdecay_forward(const SdecayDims& d, const T* q, const T* k, const T* v, const T* g, const T* S_in, T* o,
                    T* S_out);

// Recomputes the states from S_in (one sequence-head at a time), then sweeps backward.
template <class T>
void sdecay_backward(const SdecayDims& d, const T* q, const T* k, const T* v, const T* g, const T* S_in,
                     const T* d_o, const T* dS_out, T* dq, T* dk, T* dv, T* dg, T* dS_in);

}  // namespace stateflow
