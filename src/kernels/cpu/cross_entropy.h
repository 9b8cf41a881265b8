// Softmax cross-entropy over logits[rows, vocab] with integer targets; target -1 = ignored.
#pragma once
#include <cstdint>

namespace stateflow {

struct LossStats {
  double loss_sum = 0;   // sum of -log p(target) over counted rows
  int64_t correct = 0;   // rows whose argmax equals the target
  int64_t counted = 0;   // rows with a target
  void add(const LossStats& o) {
    loss_sum += o.loss_sum;
    correct += o.correct;
    counted += o.counted;
  }
};

// Throws stateflow::Error for targets outside [-1, vocab).
template <class T>
LossStats cross_entropy_forward(const T* logits, const int32_t* targets, int64_t rows, int64_t vocab);
// dlogits = scale * (softmax(logits) - onehot(target)) on counted rows, 0 on ignored rows.
template <class T>
void cross_entropy_backward(const T* logits, const int32_t* targets, T scale, T* dlogits, int64_t rows,
                            int64_t vocab);

}  // namespace stateflow
