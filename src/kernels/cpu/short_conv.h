// Causal depthwise short conv1d + SiLU with a carried (K-1)-row prefix (MATH.md section 5).
//   x        [batch, len, ch]     this chunk's pre-conv inputs
//   prefix   [batch, K-1, ch]     last K-1 pre-conv inputs before this chunk (nullptr: zeros)
//   w        [ch, K]              w[:, K-1] multiplies the current token; no bias
//   y        [batch, len, ch]     silu(conv)
//   prefix_out [batch, K-1, ch]   last K-1 rows of [prefix; x] (also right for len < K-1)
// Backward recomputes the pre-activation; dprefix_out == nullptr means zero (last chunk).
// dx and dprefix_in are overwritten; dw is accumulated (+=).
#pragma once
#include <cstdint>

namespace stateflow {

template <class T>
void short_conv_forward(const T* x, const T* prefix, const T* w, T* y, T* prefix_out, int64_t batch,
                        int64_t len, int64_t ch, int64_t K);
template <class T>
void short_conv_backward(const T* x, const T* prefix, const T* w, const T* dy, const T* dprefix_out, T* dx,
                         T* dprefix_in, T* dw, int64_t batch, int64_t len, int64_t ch, int64_t K);

}  // namespace stateflow
