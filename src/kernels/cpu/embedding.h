// Token embedding: out[r] = table[tokens[r]]. Backward scatter-adds into dtable.
#pragma once
#include <cstdint>

namespace stateflow {

// Throws stateflow::Error when a token id is outside [0, vocab).
template <class T>
void embedding_forward(const int32_t* tokens, const T* table, T* out, int64_t rows, int64_t dim, int64_t vocab);
template <class T>
void embedding_backward(const int32_t* tokens, const T* dout, T* dtable, int64_t rows, int64_t dim);

}  // namespace stateflow
