#include "mixers/sdecay/sdecay_core.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace stateflow {

namespace {
// Offsets of token t of sequence b, head h, in the [batch, len, heads, width] layouts.
struct Index {
  const SdecayDims& d;
  int64_t row(int64_t b, int64_t t, int64_t h) const { return (b * d.len + t) * d.heads + h; }
  int64_t state(int64_t b, int64_t h) const { return (b * d.heads + h) * d.dv * d.dk; }
};
}  // namespace

template <class T>
void sdecay_forward(const SdecayDims& d, const T* q, const T* k, const T* v, const T* g, const T* S_in, T* o,
                    T* S_out) {
  const Index ix{d};
  const int64_t n = d.dv * d.dk;
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      T* S = S_out + ix.state(b, h);
      if (S_in) std::memcpy(S, S_in + ix.state(b, h), n * sizeof(T));
      else std::fill(S, S + n, T(0));
      for (int64_t t = 0; t < d.len; ++t) {
        const int64_t r = ix.row(b, t, h);
        const T a = std::exp(g[r]);
        const T *qt = q + r * d.dk, *kt = k + r * d.dk, *vt = v + r * d.dv;
        for (int64_t i = 0; i < d.dv; ++i) {
          T acc = 0;
          for (int64_t j = 0; j < d.dk; ++j) {
            T& s = S[i * d.dk + j];
            s = a * s + vt[i] * kt[j];
            acc += s * qt[j];
          }
          o[r * d.dv + i] = T(d.scale) * acc;
        }
      }
    }
}

template <class T>
void sdecay_backward(const SdecayDims& d, const T* q, const T* k, const T* v, const T* g, const T* S_in,
                     const T* d_o, const T* dS_out, T* dq, T* dk, T* dv, T* dg, T* dS_in) {
  const Index ix{d};
  const int64_t n = d.dv * d.dk;
  std::vector<T> states((d.len + 1) * n);  // S_{-1} (the incoming state) .. S_{len-1}
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      if (S_in) std::memcpy(states.data(), S_in + ix.state(b, h), n * sizeof(T));
      else std::fill(states.begin(), states.begin() + n, T(0));
      for (int64_t t = 0; t < d.len; ++t) {
        const int64_t r = ix.row(b, t, h);
        const T a = std::exp(g[r]);
        const T *prev = &states[t * n], *kt = k + r * d.dk, *vt = v + r * d.dv;
        T* cur = &states[(t + 1) * n];
        for (int64_t i = 0; i < d.dv; ++i)
          for (int64_t j = 0; j < d.dk; ++j) cur[i * d.dk + j] = a * prev[i * d.dk + j] + vt[i] * kt[j];
      }
      // dS: the gradient of the state after token t, walked from the last token back.
      T* dS = dS_in + ix.state(b, h);
      if (dS_out) std::memcpy(dS, dS_out + ix.state(b, h), n * sizeof(T));
      else std::fill(dS, dS + n, T(0));
      for (int64_t t = d.len; t-- > 0;) {
        const int64_t r = ix.row(b, t, h);
        const T a = std::exp(g[r]);
        const T *prev = &states[t * n], *cur = &states[(t + 1) * n];
        const T *qt = q + r * d.dk, *kt = k + r * d.dk, *vt = v + r * d.dv, *dot = d_o + r * d.dv;
        T *dqt = dq + r * d.dk, *dkt = dk + r * d.dk, *dvt = dv + r * d.dv;
        // o_t = scale * S_t q_t
        for (int64_t j = 0; j < d.dk; ++j) {
          T acc = 0;
          for (int64_t i = 0; i < d.dv; ++i) acc += cur[i * d.dk + j] * dot[i];
          dqt[j] = T(d.scale) * acc;
        }
        for (int64_t i = 0; i < d.dv; ++i)
          for (int64_t j = 0; j < d.dk; ++j) dS[i * d.dk + j] += T(d.scale) * dot[i] * qt[j];
        // S_t = a S_{t-1} + v_t k_t^T
        T da = 0;
        for (int64_t j = 0; j < d.dk; ++j) dkt[j] = 0;
        for (int64_t i = 0; i < d.dv; ++i) {
          T acc = 0;
          for (int64_t j = 0; j < d.dk; ++j) {
            const T ds = dS[i * d.dk + j];
            acc += ds * kt[j];
            dkt[j] += ds * vt[i];
            da += ds * prev[i * d.dk + j];
          }
          dvt[i] = acc;
        }
        dg[r] = da * a;  // d a / d g = a
        for (int64_t e = 0; e < n; ++e) dS[e] *= a;
      }
    }
}

#define SDECAY_INSTANTIATE(T)                                                                                  \
  template void sdecay_forward<T>(const SdecayDims&, const T*, const T*, const T*, const T*, const T*, T*, T*); \
  template void sdecay_backward<T>(const SdecayDims&, const T*, const T*, const T*, const T*, const T*, const T*, \
                                   const T*, T*, T*, T*, T*, T*);
SDECAY_INSTANTIATE(float)
SDECAY_INSTANTIATE(double)

}  // namespace stateflow
