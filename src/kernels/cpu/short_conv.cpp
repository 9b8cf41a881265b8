#include "kernels/cpu/short_conv.h"

#include <vector>

#include "kernels/cpu/activations.h"

namespace stateflow {

// One sequence's view of xe = [prefix; x] (K-1 + len rows of ch channels), the extended
// input every formula of MATH.md section 5 is written in. Addressing rows of xe, rather
// than of x, is what makes chunks shorter than K-1 come out right without special cases.
template <class T>
struct ExtendedInput {
  const T* prefix;  // [K-1, ch], nullptr = zeros
  const T* x;       // [len, ch]
  int64_t ch, prefix_rows;
  T at(int64_t row, int64_t c) const {
    if (row >= prefix_rows) return x[(row - prefix_rows) * ch + c];
    return prefix ? prefix[row * ch + c] : T(0);
  }
};

// Pre-activation of output row t: the K-term sum in a fixed order, so a row's value does
// not depend on where the sequence was split (MATH.md section 8: conv outputs are bitwise).
template <class T>
static T conv_pre(const ExtendedInput<T>& xe, const T* w, int64_t t, int64_t c, int64_t K) {
  T pre = 0;
  for (int64_t j = 0; j < K; ++j) pre += w[c * K + j] * xe.at(t + j, c);
  return pre;
}

template <class T>
void short_conv_forward(const T* x, const T* prefix, const T* w, T* y, T* prefix_out, int64_t batch,
                        int64_t len, int64_t ch, int64_t K) {
  const int64_t P = K - 1;
  for (int64_t b = 0; b < batch; ++b) {
    const ExtendedInput<T> xe{prefix ? prefix + b * P * ch : nullptr, x + b * len * ch, ch, P};
    T* yb = y + b * len * ch;
    for (int64_t t = 0; t < len; ++t)
      for (int64_t c = 0; c < ch; ++c) yb[t * ch + c] = silu(conv_pre(xe, w, t, c, K));
    // The last K-1 rows of xe; ascending rows read only rows not yet written, so this
    // stays right even when prefix_out is the prefix buffer itself.
    T* pb = prefix_out + b * P * ch;
    for (int64_t r = 0; r < P; ++r)
      for (int64_t c = 0; c < ch; ++c) pb[r * ch + c] = xe.at(len + r, c);
  }
}

template <class T>
void short_conv_backward(const T* x, const T* prefix, const T* w, const T* dy, const T* dprefix_out, T* dx,
                         T* dprefix_in, T* dw, int64_t batch, int64_t len, int64_t ch, int64_t K) {
  const int64_t P = K - 1;
  std::vector<T> dpre(len * ch);
  std::vector<double> dw_sum(ch * K, 0.0);  // summed over every row of the batch
  for (int64_t b = 0; b < batch; ++b) {
    const ExtendedInput<T> xe{prefix ? prefix + b * P * ch : nullptr, x + b * len * ch, ch, P};
    const T* dyb = dy + b * len * ch;
    for (int64_t t = 0; t < len; ++t)
      for (int64_t c = 0; c < ch; ++c) {
        const T g = dyb[t * ch + c] * silu_grad(conv_pre(xe, w, t, c, K));
        dpre[t * ch + c] = g;
        for (int64_t j = 0; j < K; ++j) dw_sum[c * K + j] += double(g) * double(xe.at(t + j, c));
      }
    // dxe[i] = sum_j w[:, j] dpre[i - j], plus dprefix_out on the K-1 rows this chunk emitted
    // (rows len .. len+K-2 of xe); rows below K-1 go back as dprefix_in, the rest are dx.
    const T* dpo = dprefix_out ? dprefix_out + b * P * ch : nullptr;
    T* dpi = dprefix_in + b * P * ch;
    T* dxb = dx + b * len * ch;
    for (int64_t i = 0; i < len + P; ++i)
      for (int64_t c = 0; c < ch; ++c) {
        T acc = 0;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t t = i - j;
          if (t >= 0 && t < len) acc += w[c * K + j] * dpre[t * ch + c];
        }
        if (dpo && i >= len) acc += dpo[(i - len) * ch + c];
        (i < P ? dpi[i * ch + c] : dxb[(i - P) * ch + c]) = acc;
      }
  }
  for (int64_t k = 0; k < ch * K; ++k) dw[k] += T(dw_sum[k]);
}

#define SF_INSTANTIATE(T)                                                                                     \
  template void short_conv_forward<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t, int64_t,     \
                                      int64_t);                                                            \
  template void short_conv_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*, T*, int64_t, \
                                       int64_t, int64_t, int64_t);
SF_INSTANTIATE(float)
SF_INSTANTIATE(double)
#undef SF_INSTANTIATE

}  // namespace stateflow
