// Gated DeltaNet core (MATH.md sections 2-4): the token-by-token recurrence (the test
// reference) and the chunkwise WY algorithm split into Pre / ST / Out, forward and
// hand-written backward. One call processes one StateFlow chunk of every sequence in a
// batch, starting from the boundary state S_in and emitting S_out.
//
// Layouts (row-major):
//   q, k     [batch, len, heads, dk]     (already L2-normalised by the layer)
//   v, o     [batch, len, heads, dv]
//   beta, g  [batch, len, heads]         (beta in (0,1), g = log-decay <= 0)
//   S        [batch, heads, dv, dk]      value-major: S maps a key to a value
// S_in == nullptr means a zero state (start of a sequence); dS_out == nullptr means a zero
// gradient (last chunk). Outputs are overwritten, never accumulated.
#pragma once
#include <cstdint>

namespace stateflow {

struct GdnDims {
  int64_t batch = 1, len = 0, heads = 1, dk = 0, dv = 0;
  int64_t block = 64;  // inner sub-chunk size C of the chunkwise algorithm
  double scale = 1.0;  // usually dk^-1/2
};

template <class T>
void gdn_recurrent_forward(const GdnDims& d, const T* q, const T* k, const T* v, const T* beta, const T* g,
                           const T* S_in, T* o, T* S_out);
template <class T>
void gdn_recurrent_backward(const GdnDims& d, const T* q, const T* k, const T* v, const T* beta, const T* g,
                            const T* S_in, const T* dO, const T* dS_out, T* dq, T* dk, T* dv, T* dbeta, T* dg,
                            T* dS_in);

template <class T>
void gdn_chunk_forward(const GdnDims& d, const T* q, const T* k, const T* v, const T* beta, const T* g,
                       const T* S_in, T* o, T* S_out);
template <class T>
void gdn_chunk_backward(const GdnDims& d, const T* q, const T* k, const T* v, const T* beta, const T* g,
                        const T* S_in, const T* dO, const T* dS_out, T* dq, T* dk, T* dv, T* dbeta, T* dg,
                        T* dS_in);

}  // namespace stateflow
