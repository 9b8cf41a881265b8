#include "mixers/attention/prefix_attention.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"

namespace stateflow {

void check_attention_dims(const AttentionDims& d) {
  SF_CHECK(d.batch >= 1 && d.len >= 1, "attention: batch ", d.batch, " and chunk length ", d.len, " must be >= 1");
  SF_CHECK(d.offset >= 0 && d.offset + d.len <= d.kv_rows, "attention: a chunk at offset ", d.offset, " of length ",
           d.len, " does not fit K/V buffers of ", d.kv_rows, " rows per sequence");
  SF_CHECK(d.kv_heads >= 1 && d.q_heads % d.kv_heads == 0, "attention: ", d.q_heads,
           " query heads are not a multiple of ", d.kv_heads, " K/V heads");
  SF_CHECK(d.head_dim >= 1, "attention: head_dim ", d.head_dim, " must be >= 1");
}

namespace {

template <class T> T dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t e = 0; e < n; ++e) s += a[e] * b[e];
  return s;
}

// Walks every (sequence, query row, query head) with pointers to its rows: the query's and
// output's vectors, and the first row of its K/V head in the buffers (stride kv_stride).
struct RowWalk {
  const AttentionDims& d;
  int64_t group() const { return d.q_heads / d.kv_heads; }
  int64_t kv_stride() const { return d.kv_heads * d.head_dim; }
  int64_t q_index(int64_t b, int64_t i, int64_t h) const { return ((b * d.len + i) * d.q_heads + h) * d.head_dim; }
  int64_t kv_index(int64_t b, int64_t h) const { return b * d.kv_rows * kv_stride() + (h / group()) * d.head_dim; }
  int64_t lse_index(int64_t b, int64_t i, int64_t h) const { return (b * d.len + i) * d.q_heads + h; }
};

}  // namespace

template <class T>
void prefix_attention_forward(const AttentionDims& d, const T* q, const T* k, const T* v, T* o, T* lse) {
  check_attention_dims(d);
  const RowWalk w{d};
  const int64_t D = d.head_dim, ks = w.kv_stride();
  std::vector<T> p(d.offset + d.len);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t i = 0; i < d.len; ++i)
      for (int64_t h = 0; h < d.q_heads; ++h) {
        const int64_t keys = d.offset + i + 1;  // causal: positions 0 .. offset+i
        const T* qi = q + w.q_index(b, i, h);
        const T* kb = k + w.kv_index(b, h);
        const T* vb = v + w.kv_index(b, h);
        T m = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < keys; ++j) p[j] = T(d.scale) * dot(qi, kb + j * ks, D), m = std::max(m, p[j]);
        T l = 0;
        for (int64_t j = 0; j < keys; ++j) p[j] = std::exp(p[j] - m), l += p[j];
        T* oi = o + w.q_index(b, i, h);
        for (int64_t e = 0; e < D; ++e) oi[e] = 0;
        for (int64_t j = 0; j < keys; ++j) {
          const T pj = p[j] / l;
          const T* vj = vb + j * ks;
          for (int64_t e = 0; e < D; ++e) oi[e] += pj * vj[e];
        }
        lse[w.lse_index(b, i, h)] = m + std::log(l);
      }
}

template <class T>
void prefix_attention_backward(const AttentionDims& d, const T* q, const T* k, const T* v, const T* o, const T* lse,
                               const T* dout, T* dq, T* dk, T* dv) {
  check_attention_dims(d);
  const RowWalk w{d};
  const int64_t D = d.head_dim, ks = w.kv_stride();
  const T scale = T(d.scale);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t i = 0; i < d.len; ++i)
      for (int64_t h = 0; h < d.q_heads; ++h) {
        const int64_t keys = d.offset + i + 1, qi_at = w.q_index(b, i, h), kv_at = w.kv_index(b, h);
        const T* qi = q + qi_at;
        const T* doi = dout + qi_at;
        const T row_lse = lse[w.lse_index(b, i, h)];
        const T delta = dot(doi, o + qi_at, D);  // sum_j p_j dp_j, from the saved output
        T* dqi = dq + qi_at;
        for (int64_t e = 0; e < D; ++e) dqi[e] = 0;
        for (int64_t j = 0; j < keys; ++j) {
          const T* kj = k + kv_at + j * ks;
          const T* vj = v + kv_at + j * ks;
          const T p = std::exp(scale * dot(qi, kj, D) - row_lse);  // probability, recomputed
          const T ds = p * (dot(doi, vj, D) - delta);              // softmax Jacobian
          T* dkj = dk + kv_at + j * ks;
          T* dvj = dv + kv_at + j * ks;
          for (int64_t e = 0; e < D; ++e) {
            dqi[e] += scale * ds * kj[e];
            dkj[e] += scale * ds * qi[e];
            dvj[e] += p * doi[e];
          }
        }
      }
}

template void prefix_attention_forward<float>(const AttentionDims&, const float*, const float*, const float*, float*,
                                              float*);
template void prefix_attention_forward<double>(const AttentionDims&, const double*, const double*, const double*,
                                               double*, double*);
template void prefix_attention_backward<float>(const AttentionDims&, const float*, const float*, const float*,
                                               const float*, const float*, const float*, float*, float*, float*);
template void prefix_attention_backward<double>(const AttentionDims&, const double*, const double*, const double*,
                                                const double*, const double*, const double*, double*, double*,
                                                double*);

}  // namespace stateflow
