#include "kernels/cpu/cross_entropy.h"

#include <cmath>

#include "core/error.h"

namespace stateflow {

static void check_target(int32_t target, int64_t row, int64_t vocab) {
  SF_CHECK(target >= -1 && target < vocab, "cross_entropy: target ", target, " at row ", row,
           " is outside [0, ", vocab, ") and is not the ignore value -1; the targets must be token ids of a "
           "vocabulary of at most ", vocab, " (check the tokenizer against the model's vocab_size)");
}

// What both passes need from one row of logits. Subtracting the row max before exp keeps
// every term in (0, 1], so large logits cannot overflow.
struct RowSoftmax {
  int64_t argmax = 0;   // first index of the maximum
  double max = 0;
  double sum_exp = 0;   // sum_v exp(logit_v - max), in [1, vocab]
};

template <class T>
static RowSoftmax row_softmax(const T* logits, int64_t vocab) {
  RowSoftmax s;
  for (int64_t v = 1; v < vocab; ++v)
    if (logits[v] > logits[s.argmax]) s.argmax = v;  // strict: ties keep the first index
  s.max = double(logits[s.argmax]);
  for (int64_t v = 0; v < vocab; ++v) s.sum_exp += std::exp(double(logits[v]) - s.max);
  return s;
}

template <class T>
LossStats cross_entropy_forward(const T* logits, const int32_t* targets, int64_t rows, int64_t vocab) {
  LossStats stats;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t target = targets[r];
    check_target(target, r, vocab);
    if (target == -1) continue;
    const T* lr = logits + r * vocab;
    const RowSoftmax s = row_softmax(lr, vocab);
    // -log p(target) = log(sum_v exp(l_v - max)) - (l_target - max)
    stats.loss_sum += std::log(s.sum_exp) - (double(lr[target]) - s.max);
    stats.correct += s.argmax == target;
    stats.counted += 1;
  }
  return stats;
}

template <class T>
void cross_entropy_backward(const T* logits, const int32_t* targets, T scale, T* dlogits, int64_t rows,
                            int64_t vocab) {
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t target = targets[r];
    check_target(target, r, vocab);
    const T* lr = logits + r * vocab;
    T* dr = dlogits + r * vocab;
    if (target == -1) {
      for (int64_t v = 0; v < vocab; ++v) dr[v] = T(0);
      continue;
    }
    const RowSoftmax s = row_softmax(lr, vocab);
    for (int64_t v = 0; v < vocab; ++v) {
      const double p = std::exp(double(lr[v]) - s.max) / s.sum_exp;
      dr[v] = T(double(scale) * (p - (v == target ? 1.0 : 0.0)));
    }
  }
}

#define SF_INSTANTIATE(T)                                                                        \
  template LossStats cross_entropy_forward<T>(const T*, const int32_t*, int64_t, int64_t); \
  template void cross_entropy_backward<T>(const T*, const int32_t*, T, T*, int64_t, int64_t);
SF_INSTANTIATE(float)
SF_INSTANTIATE(double)
#undef SF_INSTANTIATE

}  // namespace stateflow
