// Rotary position embedding, rotate-half form (as in Llama and Qwen). Within each head the
// first rotary_dim entries form pairs (x[e], x[e + rotary_dim/2]), each rotated by the angle
// pos * theta^(-2e/rotary_dim); the other entries pass through. Positions are global to the
// sequence: token i of a chunk is at offset + i, so a chunk rotates exactly as the whole
// sequence would.
//   x [batch, len, heads, head_dim], in place.
// rope_backward rotates by the opposite angle (the rotation's transpose): dy -> dx in place.
#pragma once
#include <cstdint>

namespace stateflow {

struct RopeDims {
  int64_t batch = 1, len = 0, offset = 0;
  int64_t heads = 1, head_dim = 2, rotary_dim = 2;  // rotary_dim even, <= head_dim
  double theta = 10000.0;
};

template <class T> void rope_forward(const RopeDims& d, T* x);
template <class T> void rope_backward(const RopeDims& d, T* dx);

}  // namespace stateflow
