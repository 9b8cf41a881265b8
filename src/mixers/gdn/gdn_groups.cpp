#include "mixers/gdn/gdn_groups.h"

#include <algorithm>

namespace stateflow {

template <class T>
void gdn_expand_groups(const T* x, T* y, int64_t rows, int64_t heads, int64_t group, int64_t d) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t j = 0; j < group; ++j)
        std::copy_n(x + (r * heads + h) * d, d, y + ((r * heads + h) * group + j) * d);
}

template <class T>
void gdn_sum_groups(const T* dy, T* dx, int64_t rows, int64_t heads, int64_t group, int64_t d) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      T* out = dx + (r * heads + h) * d;
      const T* in = dy + (r * heads + h) * group * d;
      std::copy_n(in, d, out);
      for (int64_t j = 1; j < group; ++j)
        for (int64_t i = 0; i < d; ++i) out[i] += in[j * d + i];
    }
}

#define INSTANTIATE(T)                                                                                        \
  template void gdn_expand_groups<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t);                       \
  template void gdn_sum_groups<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t);
INSTANTIATE(float)
INSTANTIATE(double)
#undef INSTANTIATE

}  // namespace stateflow
