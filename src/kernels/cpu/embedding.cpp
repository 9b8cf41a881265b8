#include "kernels/cpu/embedding.h"

#include <algorithm>

#include "core/error.h"

namespace stateflow {

template <class T>
void embedding_forward(const int32_t* tokens, const T* table, T* out, int64_t rows, int64_t dim, int64_t vocab) {
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t id = tokens[r];
    SF_CHECK(id >= 0 && id < vocab, "embedding: token id ", id, " at position ", r,
             " is outside the vocabulary [0, ", vocab, "); the data must be tokenized with a vocabulary of at most ",
             vocab, " ids (check the tokenizer against the model's vocab_size)");
    std::copy_n(table + id * dim, dim, out + r * dim);
  }
}

// The ids were validated by the forward pass of the same rows.
template <class T>
void embedding_backward(const int32_t* tokens, const T* dout, T* dtable, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    T* drow = dtable + int64_t(tokens[r]) * dim;
    const T* g = dout + r * dim;
    for (int64_t i = 0; i < dim; ++i) drow[i] += g[i];
  }
}

#define SF_INSTANTIATE(T)                                                                          \
  template void embedding_forward<T>(const int32_t*, const T*, T*, int64_t, int64_t, int64_t); \
  template void embedding_backward<T>(const int32_t*, const T*, T*, int64_t, int64_t);
SF_INSTANTIATE(float)
SF_INSTANTIATE(double)
#undef SF_INSTANTIATE

}  // namespace stateflow
