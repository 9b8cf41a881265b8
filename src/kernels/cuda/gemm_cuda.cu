#include "kernels/cuda/gemm_cuda.h"

#include <cublas_v2.h>

#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/levers.h"
#include "kernels/cuda/weight_grad_cuda.h"

namespace stateflow {

namespace {

void cublas_check(cublasStatus_t s, const char* what) {
  SF_CHECK(s == CUBLAS_STATUS_SUCCESS, "cuBLAS: ", what, " failed: ", cublasGetStatusName(s), " (",
           cublasGetStatusString(s), ")");
}

template <class T>
cudaDataType_t cuda_type() {
  return std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;
}

}  // namespace

// Descriptors of one column-major product C^T = op(B)^T op(A)^T for a given M, freed at scope end.
struct LtProblem {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  LtProblem(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
            cudaDataType_t in, cudaDataType_t out) {
    cublas_check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t oa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, ob = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublas_check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &oa, sizeof oa), "TRANSA");
    cublas_check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &ob, sizeof ob), "TRANSB");
    // Lt's A is our B (N x K after its op), Lt's B our A (K x M after its op), as stored.
    cublas_check(cublasLtMatrixLayoutCreate(&a, in, tb ? K : N, tb ? N : K, ldb), "cublasLtMatrixLayoutCreate (A)");
    cublas_check(cublasLtMatrixLayoutCreate(&b, in, ta ? M : K, ta ? K : M, lda), "cublasLtMatrixLayoutCreate (B)");
    cublas_check(cublasLtMatrixLayoutCreate(&c, out, N, M, ldc), "cublasLtMatrixLayoutCreate (C)");
  }
  ~LtProblem() {
    cublasLtMatrixLayoutDestroy(c), cublasLtMatrixLayoutDestroy(b), cublasLtMatrixLayoutDestroy(a);
    cublasLtMatmulDescDestroy(op);
  }
  LtProblem(const LtProblem&) = delete;
  LtProblem& operator=(const LtProblem&) = delete;
};

namespace {

// The row count the pinned algorithm is chosen for: the 2K-token chunks of a pipeline cut fine
// (a tile that fills the GPU there; a long chunk is many waves of any tile). Before the
// chunk-tax work it was a 16K-row chunk (STATEFLOW_LEVERS_OFF=gemm_rows, kernels/cuda/levers.h).
constexpr int64_t kRepresentativeRows = 2048, kOldRepresentativeRows = 16384;

// The largest power of two up to 16 that divides every pointer's address.
uint32_t common_alignment(std::initializer_list<const void*> ptrs) {
  uint32_t a = 16;
  for (const void* p : ptrs)
    while (reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

// The heuristic's best algorithm for problem p without split-K or a reduction scheme, for
// operands aligned to `align` bytes.
cublasLtMatmulAlgo_t heuristic_algo(const CublasGemm& g, const LtProblem& p, uint32_t align) {
  cublasLtMatmulPreference_t pref = nullptr;
  cublas_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const size_t ws = g.workspace_bytes();
  const uint32_t no_reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &no_reduction,
                                       sizeof no_reduction);
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align);
  cublasLtMatmulHeuristicResult_t r{};
  int found = 0;
  const cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(g.handle(), p.op, p.a, p.b, p.c, p.c, pref, 1, &r, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  cublas_check(s, "cublasLtMatmulAlgoGetHeuristic");
  SF_CHECK(found > 0, "cuBLASLt found no algorithm for a GEMM of these shapes and types");
  const int32_t one_split = 1;
  cublasLtMatmulAlgoConfigSetAttribute(&r.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one_split, sizeof one_split);
  cublasLtMatmulAlgoConfigSetAttribute(&r.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &no_reduction,
                                       sizeof no_reduction);
  return r.algo;
}

bool algo_fits(const CublasGemm& g, const LtProblem& p, const cublasLtMatmulAlgo_t& algo) {
  cublasLtMatmulHeuristicResult_t r{};
  return cublasLtMatmulAlgoCheck(g.handle(), p.op, p.a, p.b, p.c, p.c, &algo, &r) == CUBLAS_STATUS_SUCCESS &&
         r.workspaceSize <= g.workspace_bytes();
}

__global__ void cast_to_bf16_kernel(const float* src, __nv_bfloat16* dst, int64_t n, int64_t cols, int64_t ld) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[ld > cols ? i / cols * ld + i % cols : i] = __float2bfloat16(src[i]);
}

}  // namespace

CublasGemm::CublasGemm(cudaStream_t stream, size_t workspace_bytes) : stream_(stream) {
  cublas_check(cublasLtCreate(&handle_), "cublasLtCreate");
  if (workspace_bytes > 0) {
    cuda_check(cudaMalloc(&workspace_, workspace_bytes), "cudaMalloc (cuBLAS workspace)");
    workspace_bytes_ = workspace_bytes;
  }
}

CublasGemm::~CublasGemm() {
  cublasLtDestroy(handle_);
  cudaFree(workspace_);
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the same call with the
// operands swapped (a row-major matrix read column-major is its transpose).
template <class In, class Out>
void gemm_cuda(const CublasGemm& g, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const In* A,
               int64_t lda, const In* B, int64_t ldb, float beta, Out* C, int64_t ldc) {
  static_assert(std::is_same_v<In, float> || std::is_same_v<In, __nv_bfloat16>, "operands: float or bf16");
  static_assert(std::is_same_v<Out, float> || std::is_same_v<Out, In>, "result: float, or the operand type");
  if (M == 0 || N == 0) return;
  SF_CHECK(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX && lda <= INT32_MAX && ldb <= INT32_MAX &&
               ldc <= INT32_MAX,
           "gemm_cuda: dimensions ", M, " x ", N, " x ", K, " exceed cuBLAS's 32-bit sizes; split the rows");
  const cudaDataType_t in = cuda_type<In>(), out = cuda_type<Out>();
  const uint32_t align = common_alignment({A, B, C});
  const CublasGemm::AlgoKey key{ta, tb, ta ? M : 0, N, K, lda, ldb, ldc, int(in), int(out), beta != 0.f, int(align)};
  auto& pinned = g.algorithms();
  auto it = pinned.find(key);
  if (it == pinned.end()) {
    // A fixed M, not this call's: the choice must not depend on which chunk length came first.
    const int64_t rep_rows = lever_off("gemm_rows") ? kOldRepresentativeRows : kRepresentativeRows;
    const LtProblem rep(ta, tb, ta ? M : rep_rows, N, K, lda, ldb, ldc, in, out);
    it = pinned.emplace(key, CublasGemm::Pinned{heuristic_algo(g, rep, align), {}}).first;
  }
  auto run = it->second.runs.find(M);
  if (run == it->second.runs.end()) {
    auto p = std::make_shared<const LtProblem>(ta, tb, M, N, K, lda, ldb, ldc, in, out);
    // An algorithm that cannot run this M (not seen on H200) falls back to this M's own choice:
    // correct, but then not row-invariant.
    const cublasLtMatmulAlgo_t algo =
        algo_fits(g, *p, it->second.algo) ? it->second.algo : heuristic_algo(g, *p, align);
    run = it->second.runs.emplace(M, CublasGemm::Pinned::Run{std::move(p), algo}).first;
  }
  const LtProblem& p = *run->second.problem;
  cublas_check(cublasLtMatmul(g.handle(), p.op, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c, &run->second.algo,
                              g.workspace(), g.workspace_bytes(), g.stream()),
               "cublasLtMatmul");
}

template <class In, class Out>
void linear_forward_cuda(const CublasGemm& g, const In* x, const In* W, Out* y, int64_t rows, int64_t in,
                         int64_t out) {
  gemm_cuda<In, Out>(g, false, false, rows, out, in, 1.f, x, in, W, out, 0.f, y, out);
}

template <class In, class Out>
void linear_backward_data_cuda(const CublasGemm& g, const In* dy, const In* W, Out* dx, int64_t rows, int64_t in,
                               int64_t out, bool accumulate) {
  gemm_cuda<In, Out>(g, false, true, rows, in, out, 1.f, dy, out, W, out, accumulate ? 1.f : 0.f, dx, in);
}

template <class In>
void linear_backward_weight_cuda(const CublasGemm& g, const In* x, const In* dy, float* dW, int64_t rows,
                                 int64_t in, int64_t out, int64_t batch, int64_t ldy) {
  SF_CHECK(batch > 0 && rows % batch == 0, "linear_backward_weight_cuda: rows = ", rows, " is not batch = ", batch,
           " sequences of equal length");
  SF_CHECK(ldy == 0 || ldy >= out, "linear_backward_weight_cuda: ldy = ", ldy, " is narrower than out = ", out);
  const int64_t len = rows / batch, ld = ldy > 0 ? ldy : out;
  const WeightGradOperands<In> ops{x, in, len * in, dy, ld, len * ld};
  weight_grad_cuda<In>(g, ops, dW, batch, len, in, out);
}

void cast_to_bf16_cuda(const float* src, __nv_bfloat16* dst, int64_t n, cudaStream_t stream, int64_t cols,
                       int64_t ld) {
  SF_CHECK(ld <= cols || (cols > 0 && n % cols == 0), "cast_to_bf16_cuda: rows of ", cols, " values in rows of ", ld,
           " do not tile ", n, " values");
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 4096);
  cast_to_bf16_kernel<<<unsigned(blocks), 256, 0, stream>>>(src, dst, n, cols, ld);
  cuda_check_launch("cast_to_bf16_kernel");
}

#define SF_INSTANTIATE(In, Out)                                                                                 \
  template void gemm_cuda<In, Out>(const CublasGemm&, bool, bool, int64_t, int64_t, int64_t, float, const In*, \
                                   int64_t, const In*, int64_t, float, Out*, int64_t);                          \
  template void linear_forward_cuda<In, Out>(const CublasGemm&, const In*, const In*, Out*, int64_t, int64_t,  \
                                             int64_t);                                                          \
  template void linear_backward_data_cuda<In, Out>(const CublasGemm&, const In*, const In*, Out*, int64_t,     \
                                                   int64_t, int64_t, bool);
SF_INSTANTIATE(float, float)
SF_INSTANTIATE(__nv_bfloat16, float)
SF_INSTANTIATE(__nv_bfloat16, __nv_bfloat16)
#undef SF_INSTANTIATE
template void linear_backward_weight_cuda<float>(const CublasGemm&, const float*, const float*, float*, int64_t,
                                                 int64_t, int64_t, int64_t, int64_t);
template void linear_backward_weight_cuda<__nv_bfloat16>(const CublasGemm&, const __nv_bfloat16*,
                                                         const __nv_bfloat16*, float*, int64_t, int64_t, int64_t,
                                                         int64_t, int64_t);

}  // namespace stateflow
