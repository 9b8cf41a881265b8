#include "kernels/cuda/embedding_cuda.h"

#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/levers.h"

namespace stateflow {
namespace {

using cuda::bf16;

constexpr int kBackwardThreads = 64;  // column vectors (of 8) per backward block
constexpr int kBackwardAhead = 8;     // rows of a run whose loads one thread issues together

template <class A>
__global__ void embedding_forward_kernel(const int32_t* tokens, const float* table, A* out, int64_t rows,
                                         int64_t nvec, int64_t vocab, int* bad_token) {
  const int64_t dim = nvec * 8;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * nvec;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / nvec, c = (i % nvec) * 8;
    const int32_t id = tokens[r];
    float v[8];
    if (id >= 0 && id < vocab) {
      cuda::load8(table + id * dim + c, v);
    } else {
      cuda::zero8(v);
      if (bad_token) *bad_token = 1;
    }
    cuda::store8(out + r * dim + c, v);
  }
}

// order[i] = the i-th row in reverse token order: token len - 1 of sequences batch - 1 .. 0,
// then token len - 2, and so on; keys[i] = that row's token id (the sort's key for order[i]).
__global__ void reverse_token_order_kernel(const int32_t* tokens, int32_t* keys, int32_t* order, int64_t batch,
                                           int64_t len) {
  const int64_t n = batch * len;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t r = int32_t((batch - 1 - i % batch) * len + (len - 1 - i / batch));
    order[i] = r;
    keys[i] = tokens[r];
  }
}

// Block (i, y) owns the run of equal tokens that starts at sorted position i (blocks at other
// positions return at once), columns [512 y, 512 y + 512). The run's rows are in reverse token
// order, and each is added straight into the table row in that order. The rows of a frequent
// token make a long run: Ahead rows' loads are issued before any is added, so the walk is not
// one memory latency per row (Ahead = 1 is the walk before this lever,
// STATEFLOW_LEVERS_OFF=embed_ahead; the same additions either way).
template <class A, int Ahead>
__global__ void embedding_backward_kernel(const int32_t* token_sorted, const int32_t* row_sorted, const A* dout,
                                          float* dtable, int64_t rows, int64_t nvec, int64_t vocab) {
  const int64_t i = blockIdx.x;
  const int32_t v = token_sorted[i];
  if ((i > 0 && token_sorted[i - 1] == v) || v < 0 || v >= vocab) return;  // bad ids: flagged by forward
  const int64_t c = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * 8;
  const int64_t dim = nvec * 8;
  if (c >= dim) return;
  float acc[8];
  float* drow = dtable + int64_t(v) * dim + c;
  cuda::load8(drow, acc);
  for (int64_t j = i; j < rows; j += Ahead) {
    bool in_run[Ahead];  // a prefix of the Ahead positions: the ids are sorted
    float g[Ahead][8];
#pragma unroll
    for (int u = 0; u < Ahead; ++u) {
      in_run[u] = j + u < rows && token_sorted[j + u] == v;
      if (in_run[u]) cuda::load8(dout + int64_t(row_sorted[j + u]) * dim + c, g[u]);
    }
#pragma unroll
    for (int u = 0; u < Ahead; ++u)
      if (in_run[u])
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] += g[u][e];
    if (!in_run[Ahead - 1]) break;
  }
  cuda::store8(drow, acc);
}

struct SortLayout {
  size_t rows_in, tokens_in, token_sorted, row_sorted, temp, temp_bytes, total;
  explicit SortLayout(int64_t rows) {
    temp_bytes = 0;
    cuda_check(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const int32_t*>(nullptr),
                                               static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                               static_cast<int32_t*>(nullptr), int(rows)),
               "cub::DeviceRadixSort::SortPairs (size query)");
    const size_t ints = (size_t(rows) * 4 + 255) / 256 * 256;
    rows_in = 0, tokens_in = ints, token_sorted = 2 * ints, row_sorted = 3 * ints, temp = 4 * ints;
    total = temp + temp_bytes;
  }
};

void check_shape(const char* kernel, int64_t rows, int64_t dim, int64_t vocab) {
  SF_CHECK(dim > 0 && dim % 8 == 0, kernel, ": dim = ", dim, " must be a positive multiple of 8 on the GPU");
  SF_CHECK(rows >= 0 && rows <= INT32_MAX && vocab > 0 && vocab <= INT32_MAX, kernel, ": rows = ", rows,
           " and vocab = ", vocab, " must fit in 32 bits");
}

}  // namespace

template <class A>
void embedding_forward_cuda(const int32_t* tokens, const float* table, A* out, int64_t rows, int64_t dim,
                            int64_t vocab, int* bad_token, cudaStream_t stream) {
  check_shape("embedding_forward_cuda", rows, dim, vocab);
  check_aligned16(table, "embedding_forward_cuda", "table"), check_aligned16(out, "embedding_forward_cuda", "out");
  if (rows == 0) return;
  const int64_t work = rows * (dim / 8);
  const int64_t blocks = std::min<int64_t>((work + 255) / 256, 65536);
  embedding_forward_kernel<<<unsigned(blocks), 256, 0, stream>>>(tokens, table, out, rows, dim / 8, vocab, bad_token);
  cuda_check_launch("embedding_forward_kernel");
}

size_t embedding_backward_workspace_bytes(int64_t rows) {
  check_shape("embedding_backward_cuda", rows, 8, 1);
  return SortLayout(rows).total;
}

template <class A>
void embedding_backward_cuda(const int32_t* tokens, const A* dout, float* dtable, int64_t rows, int64_t dim,
                             int64_t vocab, int64_t batch, void* workspace, cudaStream_t stream) {
  check_shape("embedding_backward_cuda", rows, dim, vocab);
  SF_CHECK(batch > 0 && rows % batch == 0, "embedding_backward_cuda: rows = ", rows, " is not batch = ", batch,
           " sequences of equal length");
  check_aligned16(dout, "embedding_backward_cuda", "dout"), check_aligned16(dtable, "embedding_backward_cuda", "dtable");
  if (rows == 0) return;
  SF_CHECK(workspace != nullptr, "embedding_backward_cuda: workspace is null; allocate "
           "embedding_backward_workspace_bytes(rows) bytes");
  const SortLayout L(rows);
  char* ws = static_cast<char*>(workspace);
  auto* rows_in = reinterpret_cast<int32_t*>(ws + L.rows_in);
  auto* tokens_in = reinterpret_cast<int32_t*>(ws + L.tokens_in);
  auto* token_sorted = reinterpret_cast<int32_t*>(ws + L.token_sorted);
  auto* row_sorted = reinterpret_cast<int32_t*>(ws + L.row_sorted);
  reverse_token_order_kernel<<<unsigned(std::min<int64_t>((rows + 255) / 256, 4096)), 256, 0, stream>>>(
      tokens, tokens_in, rows_in, batch, rows / batch);
  cuda_check_launch("reverse_token_order_kernel");
  size_t temp_bytes = L.temp_bytes;
  // All 32 key bits: equal ids are then adjacent even if a bad (negative or too large) id slipped
  // through. The radix sort is stable: equal ids keep reverse token order.
  cuda_check(cub::DeviceRadixSort::SortPairs(ws + L.temp, temp_bytes, tokens_in, token_sorted, rows_in, row_sorted,
                                             int(rows), 0, 32, stream),
             "cub::DeviceRadixSort::SortPairs");
  const int64_t nvec = dim / 8;
  const dim3 grid(unsigned(rows), unsigned((nvec + kBackwardThreads - 1) / kBackwardThreads));
  if (lever_off("embed_ahead"))
    embedding_backward_kernel<A, 1>
        <<<grid, kBackwardThreads, 0, stream>>>(token_sorted, row_sorted, dout, dtable, rows, nvec, vocab);
  else
    embedding_backward_kernel<A, kBackwardAhead>
        <<<grid, kBackwardThreads, 0, stream>>>(token_sorted, row_sorted, dout, dtable, rows, nvec, vocab);
  cuda_check_launch("embedding_backward_kernel");
}

#define SF_INSTANTIATE(A)                                                                                      \
  template void embedding_forward_cuda<A>(const int32_t*, const float*, A*, int64_t, int64_t, int64_t, int*,  \
                                          cudaStream_t);                                                       \
  template void embedding_backward_cuda<A>(const int32_t*, const A*, float*, int64_t, int64_t, int64_t,        \
                                           int64_t, void*, cudaStream_t);
SF_INSTANTIATE(float)
SF_INSTANTIATE(bf16)
#undef SF_INSTANTIATE

}  // namespace stateflow
