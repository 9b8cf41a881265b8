#include "mixers/attention/rope.h"

#include <cmath>
#include <vector>

#include "core/error.h"

namespace stateflow {

namespace {

// sign +1 rotates forward, -1 backward. Angles are computed in double from the global
// position, so every chunking gives bitwise the same rotation for a token.
template <class T> void rotate(const RopeDims& d, T* x, double sign) {
  SF_CHECK(d.rotary_dim >= 2 && d.rotary_dim % 2 == 0 && d.rotary_dim <= d.head_dim, "rope: rotary_dim ",
           d.rotary_dim, " must be even, >= 2 and <= head_dim ", d.head_dim);
  const int64_t half = d.rotary_dim / 2;
  std::vector<double> inv_freq(half);
  for (int64_t e = 0; e < half; ++e) inv_freq[e] = std::pow(d.theta, -2.0 * double(e) / double(d.rotary_dim));
  std::vector<T> cos_(half), sin_(half);
  for (int64_t i = 0; i < d.len; ++i) {
    const double pos = double(d.offset + i);
    for (int64_t e = 0; e < half; ++e)
      cos_[e] = T(std::cos(pos * inv_freq[e])), sin_[e] = T(sign * std::sin(pos * inv_freq[e]));
    for (int64_t b = 0; b < d.batch; ++b)
      for (int64_t h = 0; h < d.heads; ++h) {
        T* xh = x + ((b * d.len + i) * d.heads + h) * d.head_dim;
        for (int64_t e = 0; e < half; ++e) {
          const T x1 = xh[e], x2 = xh[e + half];
          xh[e] = x1 * cos_[e] - x2 * sin_[e];
          xh[e + half] = x2 * cos_[e] + x1 * sin_[e];
        }
      }
  }
}

}  // namespace

template <class T> void rope_forward(const RopeDims& d, T* x) { rotate(d, x, 1.0); }
template <class T> void rope_backward(const RopeDims& d, T* dx) { rotate(d, dx, -1.0); }

template void rope_forward<float>(const RopeDims&, float*);
template void rope_forward<double>(const RopeDims&, double*);
template void rope_backward<float>(const RopeDims&, float*);
template void rope_backward<double>(const RopeDims&, double*);

}  // namespace stateflow
