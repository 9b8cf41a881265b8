// Mamba-3 core (docs/mamba3.md; MATH.md sections 6.2-6.5): the exponential-trapezoidal
// recurrence on rotated B/C, SISO (rank 1) or MIMO of rank R, as the token-by-token
// definition (the test reference) and as the chunked SSD-style form, forward and
// hand-written backward. One call processes one StateFlow chunk of every sequence in a batch.
//
// Per head, with x_t[r], b_t[r], c_t[r] the rank-r input, rotated B and rotated C of token t:
//   S_t = alpha_t S_{t-1} + beta_t sum_r x_{t-1}[r] b_{t-1}[r]^T + gamma_t sum_r x_t[r] b_t[r]^T
//   alpha_t = exp(adt_t),  beta_t = (1 - lam_t) dt_t alpha_t,  gamma_t = lam_t dt_t
//   y_t[r]  = S_t c_t[r] + D x_t[r]
//
// Layouts (row-major):
//   x, y     [batch, len, heads, rank, P]
//   b, c     [batch, len, heads, rank, N]     (already rotated by the cumulative angle)
//   adt, dt, lam [batch, len, heads]         (adt = A dt < 0, dt > 0, lam in (0, 1))
//   D        [heads]
// Boundary state (the edge tuple minus the angle, which the layer carries):
//   S        [batch, heads, P, N]            canonical: without the next token's beta term
//   x_prev   [batch, heads, rank, P]         x of the chunk's last token
//   b_prev   [batch, heads, rank, N]         rotated b of the chunk's last token
// A null edge pointer means zeros (start of a sequence, or no gradient from the next chunk).
// Outputs are overwritten, never accumulated.
#pragma once
#include <cstdint>

namespace stateflow {

struct Mamba3Dims {
  int64_t batch = 1, len = 0, heads = 1, rank = 1, P = 0, N = 0;
  int64_t block = 64;  // inner sub-chunk size C of the chunked form
};

template <class T>
struct Mamba3CoreInputs {
  const T *x, *b, *c, *adt, *dt, *lam, *D;
};

template <class T>
struct Mamba3CoreGrads {
  T *x, *b, *c, *adt, *dt, *lam, *D;  // D: [heads], summed over batch and tokens
};

template <class T>
struct Mamba3Edge {  // read side: nullptr members are zeros
  const T *S = nullptr, *x_prev = nullptr, *b_prev = nullptr;
};

template <class T>
struct Mamba3EdgeOut {  // write side: all three required
  T *S, *x_prev, *b_prev;
};

template <class T>
void mamba3_recurrent_forward(const Mamba3Dims& d, const Mamba3CoreInputs<T>& in, const Mamba3Edge<T>& edge_in,
                              T* y, const Mamba3EdgeOut<T>& edge_out);
template <class T>
void mamba3_recurrent_backward(const Mamba3Dims& d, const Mamba3CoreInputs<T>& in, const Mamba3Edge<T>& edge_in,
                               const T* dy, const Mamba3Edge<T>& dedge_out, const Mamba3CoreGrads<T>& grads,
                               const Mamba3EdgeOut<T>& dedge_in);

template <class T>
void mamba3_chunk_forward(const Mamba3Dims& d, const Mamba3CoreInputs<T>& in, const Mamba3Edge<T>& edge_in, T* y,
                          const Mamba3EdgeOut<T>& edge_out);
template <class T>
void mamba3_chunk_backward(const Mamba3Dims& d, const Mamba3CoreInputs<T>& in, const Mamba3Edge<T>& edge_in,
                           const T* dy, const Mamba3Edge<T>& dedge_out, const Mamba3CoreGrads<T>& grads,
                           const Mamba3EdgeOut<T>& dedge_in);

}  // namespace stateflow
