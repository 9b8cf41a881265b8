#include "kernels/cuda/gemm_cuda.h"

#include <cublas_v2.h>

#include <algorithm>
#include <functional>
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
// Short rows (gemm_cuda.h) pin theirs at 1K rows, the chunks of a 32K sequence cut in 32.
constexpr int64_t kRepresentativeRows = kGemmAlignedRows, kOldRepresentativeRows = 16384, kShortRows = 1024;

// The largest power of two up to 16 that divides every pointer's address.
uint32_t common_alignment(std::initializer_list<const void*> ptrs) {
  uint32_t a = 16;
  for (const void* p : ptrs)
    while (reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

template <class T>
T algo_config(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof v, &written);
  return v;
}

// The heuristic's first `count` algorithms for problem p, operands aligned to `align` bytes,
// within `workspace` bytes. Without `split_k` each is made to run without split-K; with it,
// split-K may come with the reduction in a separate kernel over fp32 partials (a fixed order),
// never in place.
std::vector<cublasLtMatmulAlgo_t> heuristic_algos(const CublasGemm& g, const LtProblem& p, uint32_t align,
                                                  bool split_k, size_t workspace, int count) {
  cublasLtMatmulPreference_t pref = nullptr;
  cublas_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint32_t reductions =
      split_k ? uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE) : uint32_t(CUBLASLT_REDUCTION_SCHEME_NONE);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reductions,
                                       sizeof reductions);
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof align);
  std::vector<cublasLtMatmulHeuristicResult_t> r(size_t(std::max(count, 1)));
  int found = 0;
  const cublasStatus_t s =
      cublasLtMatmulAlgoGetHeuristic(g.handle(), p.op, p.a, p.b, p.c, p.c, pref, int(r.size()), r.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  cublas_check(s, "cublasLtMatmulAlgoGetHeuristic");
  SF_CHECK(found > 0, "cuBLASLt found no algorithm for a GEMM of these shapes and types");
  std::vector<cublasLtMatmulAlgo_t> algos;
  for (int i = 0; i < found; ++i) {
    cublasLtMatmulAlgo_t algo = r[size_t(i)].algo;
    const uint32_t reduction = algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME);
    const bool ordered =
        reduction == CUBLASLT_REDUCTION_SCHEME_NONE || reduction == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    if (!split_k || !ordered) {
      const int32_t one_split = 1;
      const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
      cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one_split, sizeof one_split);
      cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof none);
    }
    algos.push_back(algo);
  }
  return algos;
}

// An algorithm in words: cuBLASLt's id, tile (cublasLtMatmulTile_t), stages id, split-K count
// and reduction scheme (2: fp32 partials summed apart), cluster shape id.
std::string describe_algo(const cublasLtMatmulAlgo_t& algo) {
  static const char* const kTiles[] = {"?",      "8x8",     "8x16",    "16x8",    "8x32",    "16x16",   "32x8",
                                       "8x64",   "16x32",   "32x16",   "64x8",    "32x32",   "32x64",   "64x32",
                                       "32x128", "64x64",   "128x32",  "64x128",  "128x64",  "64x256",  "128x128",
                                       "256x64", "64x512",  "128x256", "256x128", "512x64",  "64x96",   "96x64",
                                       "96x128", "128x160", "160x128", "192x128", "128x192", "128x96",  "32x256",
                                       "256x32"};
  const uint32_t tile = algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID);
  std::string s = "algo " + std::to_string(algo_config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID)) + " tile " +
                  (tile < std::size(kTiles) ? kTiles[tile] : std::to_string(tile)) + " stages " +
                  std::to_string(algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID)) + " splitK " +
                  std::to_string(algo_config<int32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM)) + " reduction " +
                  std::to_string(algo_config<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME)) + " cluster " +
                  std::to_string(algo_config<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
  return s;
}

// The algorithm pinned for a key: for aligned rows the heuristic's first at kRepresentativeRows
// without split-K; for short rows its first at kShortRows with deterministic split-K, within half
// the workspace so that every short call (< 2048 rows) fits it.
cublasLtMatmulAlgo_t pinned_algo(const CublasGemm& g, const LtProblem& rep, uint32_t align, bool short_rows) {
  const size_t ws = short_rows ? g.workspace_bytes() / 2 : g.workspace_bytes();
  return heuristic_algos(g, rep, align, short_rows, ws, 1).front();
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

namespace {

// gemm_cuda with the algorithm pinned for aligned or for short rows (gemm_cuda.h).
// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the same call with the
// operands swapped (a row-major matrix read column-major is its transpose).
// C_in: where beta's C is read from (nullptr: C itself; else a matrix of C's layout: C = A B + beta C_in).
template <class In, class Out>
void pinned_gemm(const CublasGemm& g, bool short_rows, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                 const In* A, int64_t lda, const In* B, int64_t ldb, float beta, Out* C, int64_t ldc,
                 const Out* C_in = nullptr) {
  static_assert(std::is_same_v<In, float> || std::is_same_v<In, __nv_bfloat16>, "operands: float or bf16");
  static_assert(std::is_same_v<Out, float> || std::is_same_v<Out, In>, "result: float, or the operand type");
  if (M == 0 || N == 0) return;
  SF_CHECK(M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX && lda <= INT32_MAX && ldb <= INT32_MAX &&
               ldc <= INT32_MAX,
           "gemm_cuda: dimensions ", M, " x ", N, " x ", K, " exceed cuBLAS's 32-bit sizes; split the rows");
  const cudaDataType_t in = cuda_type<In>(), out = cuda_type<Out>();
  const uint32_t align = common_alignment({A, B, C, C_in ? C_in : C});
  const CublasGemm::AlgoKey key{ta,  tb,      ta ? M : 0, N,           K,          lda,       ldb,
                                ldc, int(in), int(out),   beta != 0.f, int(align), short_rows};
  auto& pinned = g.algorithms();
  auto it = pinned.find(key);
  if (it == pinned.end()) {
    // A fixed M, not this call's: the choice must not depend on which chunk length came first.
    const int64_t rep_rows =
        short_rows ? kShortRows : lever_off("gemm_rows") ? kOldRepresentativeRows : kRepresentativeRows;
    const LtProblem rep(ta, tb, ta ? M : rep_rows, N, K, lda, ldb, ldc, in, out);
    it = pinned.emplace(key, CublasGemm::Pinned{pinned_algo(g, rep, align, short_rows), {}}).first;
  }
  auto run = it->second.runs.find(M);
  if (run == it->second.runs.end()) {
    auto p = std::make_shared<const LtProblem>(ta, tb, M, N, K, lda, ldb, ldc, in, out);
    // An algorithm that cannot run this M (not seen on H200) falls back to this M's own choice:
    // correct, but then not row-invariant.
    const cublasLtMatmulAlgo_t algo =
        algo_fits(g, *p, it->second.algo) ? it->second.algo : pinned_algo(g, *p, align, short_rows);
    run = it->second.runs.emplace(M, CublasGemm::Pinned::Run{std::move(p), algo}).first;
  }
  const LtProblem& p = *run->second.problem;
  cublas_check(cublasLtMatmul(g.handle(), p.op, &alpha, B, p.a, A, p.b, &beta, C_in ? C_in : C, p.c, C, p.c,
                              &run->second.algo,
                              g.workspace(), g.workspace_bytes(), g.stream()),
               "cublasLtMatmul");
}

// A row-wise product C[rows, N] = A[rows, K] op(B) + beta C (or + beta C_in) over `batch`
// sequences of rows / batch rows: the sequences' tails on the short-row algorithm where they are
// short (gemm_cuda.h).
template <class In, class Out>
void row_wise_gemm(const CublasGemm& g, bool tb, int64_t rows, int64_t batch, int64_t N, int64_t K, const In* A,
                   int64_t lda, const In* B, int64_t ldb, float beta, Out* C, int64_t ldc, const Out* C_in = nullptr) {
  SF_CHECK(batch > 0 && rows % batch == 0, "gemm: rows = ", rows, " are not batch = ", batch,
           " sequences of equal length");
  const int64_t len = rows / batch, tail = len % kGemmAlignedRows, head = len - tail;
  if (tail == 0 || batch * tail >= kGemmAlignedRows || !gemm_short_rows_for_thread()) {
    pinned_gemm<In, Out>(g, false, false, tb, rows, N, K, 1.f, A, lda, B, ldb, beta, C, ldc, C_in);
  } else if (head == 0) {
    pinned_gemm<In, Out>(g, true, false, tb, rows, N, K, 1.f, A, lda, B, ldb, beta, C, ldc, C_in);
  } else {
    auto rows_of = [&](const Out* M, int64_t r) { return M ? M + r * ldc : nullptr; };
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t r = b * len;
      pinned_gemm<In, Out>(g, false, false, tb, head, N, K, 1.f, A + r * lda, lda, B, ldb, beta, C + r * ldc, ldc,
                           rows_of(C_in, r));
      pinned_gemm<In, Out>(g, true, false, tb, tail, N, K, 1.f, A + (r + head) * lda, lda, B, ldb, beta,
                           C + (r + head) * ldc, ldc, rows_of(C_in, r + head));
    }
  }
}

}  // namespace

bool& gemm_short_rows_for_thread() {
  thread_local bool on = !lever_off("gemm_short");
  return on;
}

template <class In, class Out>
void gemm_cuda(const CublasGemm& g, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const In* A,
               int64_t lda, const In* B, int64_t ldb, float beta, Out* C, int64_t ldc) {
  pinned_gemm<In, Out>(g, false, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <class In, class Out>
void linear_forward_cuda(const CublasGemm& g, const In* x, const In* W, Out* y, int64_t rows, int64_t in,
                         int64_t out, int64_t batch, const Out* residual) {
  SF_CHECK(residual != y || residual == nullptr, "linear_forward_cuda: the residual must not be y itself");
  row_wise_gemm<In, Out>(g, false, rows, batch, out, in, x, in, W, out, residual ? 1.f : 0.f, y, out, residual);
}

template <class In, class Out>
void linear_backward_data_cuda(const CublasGemm& g, const In* dy, const In* W, Out* dx, int64_t rows, int64_t in,
                               int64_t out, int64_t batch, bool accumulate) {
  row_wise_gemm<In, Out>(g, true, rows, batch, in, out, dy, out, W, out, accumulate ? 1.f : 0.f, dx, in);
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

std::vector<GemmCandidate> gemm_candidates(const CublasGemm& g, bool tb, int64_t N, int64_t K, int64_t choose_rows,
                                           bool split_k, int count) {
  SF_CHECK(N > 0 && K > 0 && choose_rows > 0 && count > 0, "gemm_candidates: bad arguments");
  const LtProblem p(false, tb, choose_rows, N, K, K, tb ? K : N, N, CUDA_R_16BF, CUDA_R_16BF);
  const size_t ws = split_k ? g.workspace_bytes() / 2 : g.workspace_bytes();
  std::vector<GemmCandidate> out;
  for (const cublasLtMatmulAlgo_t& algo : heuristic_algos(g, p, 16, split_k, ws, count))
    out.push_back({algo, describe_algo(algo)});
  return out;
}

std::function<void()> gemm_candidate_call(const CublasGemm& g, const GemmCandidate& c, bool tb, int64_t M, int64_t N,
                                          int64_t K, const __nv_bfloat16* A, const __nv_bfloat16* B,
                                          __nv_bfloat16* C) {
  auto p = std::make_shared<const LtProblem>(false, tb, M, N, K, K, tb ? K : N, N, CUDA_R_16BF, CUDA_R_16BF);
  if (!algo_fits(g, *p, c.algo)) return {};
  return [&g, p, algo = c.algo, A, B, C] {
    const float alpha = 1.f, beta = 0.f;
    cublas_check(cublasLtMatmul(g.handle(), p->op, &alpha, B, p->a, A, p->b, &beta, C, p->c, C, p->c, &algo,
                                g.workspace(), g.workspace_bytes(), g.stream()),
                 "cublasLtMatmul");
  };
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
                                             int64_t, int64_t, const Out*);                                     \
  template void linear_backward_data_cuda<In, Out>(const CublasGemm&, const In*, const In*, Out*, int64_t,     \
                                                   int64_t, int64_t, int64_t, bool);
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
