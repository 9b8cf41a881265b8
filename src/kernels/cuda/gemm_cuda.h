// GEMMs on the GPU through cuBLASLt, with the row-major semantics of kernels/cpu/gemm.h:
// C = alpha * op(A) op(B) + beta * C, op(A) M x K, op(B) K x N, lda/ldb/ldc row strides.
// Operands are bf16 (the production path: fp32 accumulation, fp32 or bf16 result) or fp32
// (full fp32 arithmetic, no TF32: the reference path of the tests).
//
// Determinism: cuBLAS gives bitwise-equal results for the same call on the same GPU model and
// library version, provided the algorithm and workspace do not change between calls. Left to
// itself, cuBLAS picks the algorithm by shape, so a chunk's rows could be computed by another
// kernel (another reduction order) than the same rows of the whole sequence. Here the
// algorithm is pinned per (transposes, N, K, strides, types): chosen once by the heuristic for
// a large representative M, with no split-K and no reduction scheme, and reused for every M
// (checked with cublasLtMatmulAlgoCheck). With trans_a, A's rows are its contiguous dimension
// and lda bounds M: such products (sums over the rows, not row-wise) pin per M as well. Each output row is then computed identically for
// any row count: row-wise GEMMs (y = x W, dx += dy W^T) are chunk-invariant. CublasGemm owns
// a fixed workspace. Weight gradients (a sum over the rows) go through weight_grad_cuda.
//
// Short rows (linear_forward_cuda, linear_backward_data_cuda; lever gemm_short). A chunk of 1K
// tokens gives a 2048-wide projection 64 tiles of 128 x 256 for 132 SMs; the algorithm pinned at
// 2048 rows then leaves half the GPU idle. Chunked == unchunked must be bitwise only where the
// cuts fall on multiples of kGemmAlignedRows tokens, so the rows of a sequence past its last
// multiple of 2048 (its "tail": len % 2048 tokens) may run a second pinned algorithm, chosen at
// 1024 rows with split-K allowed in its deterministic form (partials kept in fp32 in the
// workspace and summed by a separate kernel in a fixed order; never the in-place reduction, whose
// order follows the blocks' arrival). With aligned cuts every chunk but the last is whole
// multiples of 2048 and the last has the whole sequence's tail, so each token runs the same
// algorithm in both: bitwise. Tails take the second algorithm only where they are short
// (batch x tail < 2048 rows, the same in both runs): then a call of short chunks (len < 2048) is
// one call of it, and a longer chunk's tails are calls of their own beside its head's.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>


namespace stateflow {

// Rows of a sequence in whole multiples of this run the GEMM algorithm pinned for them; cuts of a
// sequence at multiples of it give bitwise the unsplit run's rows (and weight gradients:
// kWeightGradTokens).
constexpr int64_t kGemmAlignedRows = 2048;

struct LtProblem;  // the cuBLASLt descriptors of one GEMM shape (gemm_cuda.cu)

// A cuBLASLt handle bound to one stream, with its own fixed workspace and pinned algorithms.
// One per stream/thread: it must not be used by two threads at once.
class CublasGemm {
 public:
  explicit CublasGemm(cudaStream_t stream = nullptr, size_t workspace_bytes = size_t(32) << 20);
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  cublasLtHandle_t handle() const { return handle_; }
  cudaStream_t stream() const { return stream_; }
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return workspace_bytes_; }

  // (trans_a, trans_b, M if trans_a else 0, N, K, lda, ldb, ldc, operand type, result type, beta != 0,
  //  pointer alignment in bytes up to 16, short rows)
  using AlgoKey =
      std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, bool, int, bool>;
  // A pinned algorithm, and per row count M met so far the cuBLASLt descriptors of the call and
  // the algorithm it runs (the pinned one wherever that can run M): built once, not per call.
  struct Pinned {
    struct Run {
      std::shared_ptr<const LtProblem> problem;
      cublasLtMatmulAlgo_t algo;
    };
    cublasLtMatmulAlgo_t algo;
    std::map<int64_t, Run> runs;
  };
  // The pinned algorithms (filled by gemm_cuda; the cache is not part of the handle's state).
  std::map<AlgoKey, Pinned>& algorithms() const { return algorithms_; }

 private:
  cublasLtHandle_t handle_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  mutable std::map<AlgoKey, Pinned> algorithms_;
};

// In: float or __nv_bfloat16; Out: float, or __nv_bfloat16 when In is.
template <class In, class Out>
void gemm_cuda(const CublasGemm& g, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const In* A, int64_t lda, const In* B, int64_t ldb, float beta, Out* C, int64_t ldc);

// Whether this thread's row-wise GEMMs run short tails on the short-row algorithm (above): the
// gemm_short lever's setting (kernels/cuda/levers.h) unless a test switches it.
bool& gemm_short_rows_for_thread();

// Dense layers on row-major x[rows, in], W[in, out], as in kernels/cpu/gemm.h; the rows are
// `batch` sequences of rows / batch tokens, one after another (the short rows' split, above):
//   linear_forward_cuda:         y  = x W      (y overwritten), or y = residual + x W with a residual
//                                (rows x out, not y itself: added in the GEMM's fp32 epilogue, one
//                                rounding of y; the pre-norm residual's stream, lever residual_epilogue)
//   linear_backward_data_cuda:   dx += dy W^T  (dx = dy W^T with accumulate = false: no zero-fill
//                                needed for the first product into dx)
//   linear_backward_weight_cuda: dW += x^T dy  (dW is the fp32 gradient; the rows are batch
//                                sequences of rows / batch tokens: weight_grad_cuda's order;
//                                ldy: dy's row stride when it is a column block of a wider matrix)
template <class In, class Out>
void linear_forward_cuda(const CublasGemm& g, const In* x, const In* W, Out* y, int64_t rows, int64_t in,
                         int64_t out, int64_t batch, const Out* residual = nullptr);
template <class In, class Out>
void linear_backward_data_cuda(const CublasGemm& g, const In* dy, const In* W, Out* dx, int64_t rows, int64_t in,
                               int64_t out, int64_t batch, bool accumulate = true);
template <class In>
void linear_backward_weight_cuda(const CublasGemm& g, const In* x, const In* dy, float* dW, int64_t rows,
                                 int64_t in, int64_t out, int64_t batch, int64_t ldy = 0);

// For gemm_bench: the algorithms the pinning would consider for a bf16 row-wise product with a
// bf16 result (y = x W: trans_b false; dx = dy W^T: true; M x N, inner K, rows packed): the
// heuristic's first `count` at `choose_rows` rows, with split-K in its deterministic form allowed
// when `split_k` (as for short rows). The first is the one the pinning takes.
struct GemmCandidate {
  cublasLtMatmulAlgo_t algo;
  std::string config;  // in words: tile, stages, split-K count, reduction scheme, cluster
};
std::vector<GemmCandidate> gemm_candidates(const CublasGemm& g, bool trans_b, int64_t N, int64_t K,
                                           int64_t choose_rows, bool split_k, int count);
// One such product of M rows by candidate c on g's stream, or an empty function where c cannot run
// M within g's workspace. A: M x K, B: K x N (trans_b: N x K), C: M x N.
std::function<void()> gemm_candidate_call(const CublasGemm& g, const GemmCandidate& c, bool trans_b, int64_t M,
                                          int64_t N, int64_t K, const __nv_bfloat16* A, const __nv_bfloat16* B,
                                          __nv_bfloat16* C);

// bf16 copies of fp32 values (round to nearest even): the bf16 weights the GEMMs read are
// cast from the fp32 master weights after every optimizer step. With ld > cols, src is rows of
// `cols` values and dst's rows start every ld values (a column block of a wider matrix).
void cast_to_bf16_cuda(const float* src, __nv_bfloat16* dst, int64_t n, cudaStream_t stream, int64_t cols = 0,
                       int64_t ld = 0);

}  // namespace stateflow
