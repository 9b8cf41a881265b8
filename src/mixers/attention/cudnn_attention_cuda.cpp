// Prefix attention through cuDNN's fused flash attention (cudnn_attention.h).
//
// The graphs are the flash-attention patterns cuDNN's fused engines recognise, node by node
// (cuDNN's "fused flash attention" operation graphs; dims [batch, heads, rows, cols], our
// token-major buffers described by strides, no copies):
//   forward   S = Q K^T; S *= scale; causal mask (row index + (kv_len - len) >= column index,
//             else -inf: bottom-right alignment); M = rowmax S; E = exp(S - M); Z = rowsum E;
//             lse = M + log Z (fp32 output); P = E / Z (bf16); O = P V.
//   backward  D = rowsum(dO * O); S as above minus lse, masked, P = exp; dV = P^T dO;
//             dP = dO V^T; dS = P (dP - D) scale; dK = dS^T Q; dQ = dS K.
//             With grouped K/V heads, dK/dV are formed per query head and summed over the group.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <tuple>

#include "core/allocator.h"
#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "mixers/attention/cudnn_attention.h"
#include "mixers/attention/cudnn_attention_glue.h"
#include "mixers/attention/cudnn_graph.h"

namespace stateflow {

namespace {
thread_local std::optional<size_t> workspace_limit_for_test;
}  // namespace

CudnnWorkspaceLimitForTest::CudnnWorkspaceLimitForTest(size_t bytes) : previous_(workspace_limit_for_test) {
  workspace_limit_for_test = bytes;
}
CudnnWorkspaceLimitForTest::~CudnnWorkspaceLimitForTest() { workspace_limit_for_test = previous_; }

#ifdef STATEFLOW_HAVE_CUDNN
namespace {

using bf16 = __nv_bfloat16;
using Dims = std::vector<int64_t>;

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// The shapes of one call (a piece of a chunk's queries), as cuDNN sees them.
struct Shape {
  int64_t B, Hq, Hkv, L, S, D, rows;  // S = kv_len = offset + len; rows = kv_rows of the buffers
  int64_t q_rows;                     // rows per sequence of the q, o, dout, dq buffers (the chunk's)

  Shape(const AttentionDims& d, int64_t q_rows_)
      : B(d.batch), Hq(d.q_heads), Hkv(d.kv_heads), L(d.len), S(d.offset + d.len), D(d.head_dim), rows(d.kv_rows),
        q_rows(q_rows_) {}
  // q, o, dout, dq: [B, q_rows, Hq, D] (rows [0, L) of a piece) seen as [B, Hq, L, D]
  Dims q_strides() const { return {q_rows * Hq * D, D, Hq * D, 1}; }
  // k, v: [B, rows, Hkv, D] seen as [B, Hkv, S, D]; transposed view [B, Hkv, D, S]
  Dims kv_strides() const { return {rows * Hkv * D, D, Hkv * D, 1}; }
  Dims kvT_strides() const { return {rows * Hkv * D, D, 1, Hkv * D}; }
  // cuDNN's dK/dV copy: [B, S, Hkv, D] packed, seen as [B, Hkv, S, D]
  Dims dkv_strides() const { return {S * Hkv * D, D, Hkv * D, 1}; }
  Dims stats_dims() const { return {B, Hq, L, 1}; }
  Dims stats_strides() const { return {Hq * L, L, 1, 1}; }
  Dims scores_dims() const { return {B, Hq, L, S}; }
  Dims scores_strides() const { return {Hq * L * S, L * S, S, 1}; }
};

// Ids of the graph's caller-visible tensors.
struct Ids {
  int64_t q = -1, k = -1, v = -1, o = -1, stats = -1, dout = -1, dq = -1, dk = -1, dv = -1, dsum = -1, dq_acc = -1;
};

// Score tensor S (fp32, virtual) -> S with the bottom-right causal mask applied.
int64_t causal_mask(CudnnGraph& g, const Shape& s, int64_t scores) {
  auto virt = [&](cudnnDataType_t t) { return g.tensor(t, s.scores_dims(), s.scores_strides(), true); };
  int64_t row = virt(CUDNN_DATA_INT32);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, row, -1, -1, CUDNN_DATA_FLOAT, 2);
  if (s.S != s.L) {  // query i sits at key position i + (kv_len - len)
    const int64_t shifted = virt(CUDNN_DATA_INT32);
    g.pointwise(CUDNN_POINTWISE_ADD, row, shifted, g.scalar_i32(int32_t(s.S - s.L)), -1, CUDNN_DATA_INT32);
    row = shifted;
  }
  const int64_t col = virt(CUDNN_DATA_INT32), keep = virt(CUDNN_DATA_BOOLEAN), out = virt(CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, col, -1, -1, CUDNN_DATA_FLOAT, 3);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, keep, col, -1, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scores, out, g.scalar_f32(-std::numeric_limits<float>::infinity()), keep);
  return out;
}

CudnnPlan forward_plan(const Shape& s, float scale, Ids& id) {
  CudnnGraph g;
  const Dims q_dims{s.B, s.Hq, s.L, s.D}, kT_dims{s.B, s.Hkv, s.D, s.S}, v_dims{s.B, s.Hkv, s.S, s.D};
  const Dims row_dims = s.stats_dims(), row_strides = s.stats_strides();
  id.q = g.tensor(CUDNN_DATA_BFLOAT16, q_dims, s.q_strides(), false);
  id.k = g.tensor(CUDNN_DATA_BFLOAT16, kT_dims, s.kvT_strides(), false);
  id.v = g.tensor(CUDNN_DATA_BFLOAT16, v_dims, s.kv_strides(), false);
  id.o = g.tensor(CUDNN_DATA_BFLOAT16, q_dims, s.q_strides(), false);
  id.stats = g.tensor(CUDNN_DATA_FLOAT, row_dims, row_strides, false);
  auto scores = [&](cudnnDataType_t t) { return g.tensor(t, s.scores_dims(), s.scores_strides(), true); };
  auto per_row = [&] { return g.tensor(CUDNN_DATA_FLOAT, row_dims, row_strides, true); };

  const int64_t qk = scores(CUDNN_DATA_FLOAT), scaled = scores(CUDNN_DATA_FLOAT);
  g.matmul(id.q, id.k, qk);
  g.pointwise(CUDNN_POINTWISE_MUL, qk, scaled, g.scalar_f32(scale));
  const int64_t masked = causal_mask(g, s, scaled);
  const int64_t max = per_row(), shifted = scores(CUDNN_DATA_FLOAT), e = scores(CUDNN_DATA_FLOAT);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, max);
  g.pointwise(CUDNN_POINTWISE_SUB, masked, shifted, max);
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, e);
  const int64_t sum = per_row(), log_sum = per_row(), p = scores(CUDNN_DATA_BFLOAT16);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  g.pointwise(CUDNN_POINTWISE_LOG, sum, log_sum);
  g.pointwise(CUDNN_POINTWISE_ADD, max, id.stats, log_sum);
  g.pointwise(CUDNN_POINTWISE_DIV, e, p, sum);
  g.matmul(p, id.v, id.o);
  return g.build("the attention forward");
}

// dK or dV: [B, Hq, S, L] (bf16 view) times [B, Hq, L, D]; summed over each K/V head's group.
void key_side_product(CudnnGraph& g, const Shape& s, int64_t lhsT, int64_t rhs, int64_t out) {
  if (s.Hq == s.Hkv) return g.matmul(lhsT, rhs, out);
  const int64_t full = g.tensor(CUDNN_DATA_BFLOAT16, {s.B, s.Hq, s.S, s.D}, {s.Hq * s.S * s.D, s.S * s.D, s.D, 1}, true);
  g.matmul(lhsT, rhs, full);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
}

CudnnPlan backward_plan(const Shape& s, float scale, CudnnBackward mode, Ids& id) {
  CudnnGraph g;
  const Dims q_dims{s.B, s.Hq, s.L, s.D}, kT_dims{s.B, s.Hkv, s.D, s.S}, kv_dims{s.B, s.Hkv, s.S, s.D};
  const Dims row_dims = s.stats_dims(), row_strides = s.stats_strides();
  const Dims T_dims{s.B, s.Hq, s.S, s.L}, T_strides{s.Hq * s.L * s.S, s.L * s.S, 1, s.S};
  id.q = g.tensor(CUDNN_DATA_BFLOAT16, q_dims, s.q_strides(), false);
  id.k = g.tensor(CUDNN_DATA_BFLOAT16, kT_dims, s.kvT_strides(), false);
  id.v = g.tensor(CUDNN_DATA_BFLOAT16, kT_dims, s.kvT_strides(), false);
  id.o = g.tensor(CUDNN_DATA_BFLOAT16, q_dims, s.q_strides(), false);
  id.dout = g.tensor(CUDNN_DATA_BFLOAT16, q_dims, s.q_strides(), false);
  id.stats = g.tensor(CUDNN_DATA_FLOAT, row_dims, row_strides, false);
  id.dq = g.tensor(CUDNN_DATA_BFLOAT16, q_dims, s.q_strides(), false);
  // dK/dV in bf16: cuDNN 9.19 accepts fp32 ones without grouped heads but writes wrong values.
  id.dk = g.tensor(CUDNN_DATA_BFLOAT16, kv_dims, s.dkv_strides(), false);
  id.dv = g.tensor(CUDNN_DATA_BFLOAT16, kv_dims, s.dkv_strides(), false);
  auto scores = [&](cudnnDataType_t t) { return g.tensor(t, s.scores_dims(), s.scores_strides(), true); };

  // D = rowsum(dO * O), kept in the workspace (the kernels read it per query block).
  const int64_t dout_o = g.tensor(CUDNN_DATA_FLOAT, q_dims, {s.Hq * s.L * s.D, s.L * s.D, s.D, 1}, true);
  const int64_t dsum_raw = g.tensor(CUDNN_DATA_FLOAT, row_dims, row_strides, true);
  id.dsum = g.tensor(CUDNN_DATA_FLOAT, row_dims, row_strides, false);
  g.pointwise(CUDNN_POINTWISE_MUL, id.dout, dout_o, id.o);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, dout_o, dsum_raw);
  g.pointwise(CUDNN_POINTWISE_MUL, dsum_raw, id.dsum, g.scalar_f32(1.0f));

  // P = exp(scale q k - lse), masked
  const int64_t qk = scores(CUDNN_DATA_FLOAT), scaled = scores(CUDNN_DATA_FLOAT), centred = scores(CUDNN_DATA_FLOAT);
  g.matmul(id.q, id.k, qk);
  g.pointwise(CUDNN_POINTWISE_MUL, qk, scaled, g.scalar_f32(scale));
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, centred, id.stats);
  const int64_t masked = causal_mask(g, s, centred), p = scores(CUDNN_DATA_FLOAT);
  g.pointwise(CUDNN_POINTWISE_EXP, masked, p);

  // dV = P^T dO
  const int64_t pT = g.tensor(CUDNN_DATA_BFLOAT16, T_dims, T_strides, true);
  g.reshape(p, pT);
  key_side_product(g, s, pT, id.dout, id.dv);

  // dS = P (dO V^T - D) scale
  const int64_t dp = scores(CUDNN_DATA_FLOAT), dp_centred = scores(CUDNN_DATA_FLOAT), pdp = scores(CUDNN_DATA_FLOAT),
                ds = scores(CUDNN_DATA_FLOAT);
  g.matmul(id.dout, id.v, dp);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, dp_centred, id.dsum);
  g.pointwise(CUDNN_POINTWISE_MUL, dp_centred, pdp, p);
  g.pointwise(CUDNN_POINTWISE_MUL, pdp, ds, g.scalar_f32(scale));

  // dK = dS^T Q
  const int64_t dsT = g.tensor(CUDNN_DATA_BFLOAT16, T_dims, T_strides, true);
  g.reshape(ds, dsT);
  key_side_product(g, s, dsT, id.q, id.dk);

  // dQ = dS K (K seen untransposed)
  const int64_t k_rows = g.tensor(CUDNN_DATA_FLOAT, kv_dims, s.kv_strides(), true);
  g.reshape(id.k, k_rows);
  if (mode == CudnnBackward::AtomicDq) {
    id.dq_acc = g.tensor(CUDNN_DATA_FLOAT, q_dims, {s.Hq * s.L * s.D, s.L * s.D, s.D, 1}, false);
    g.matmul(ds, k_rows, id.dq_acc);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, id.dq_acc, id.dq);
  } else {
    g.matmul(ds, k_rows, id.dq);
  }
  return g.build("the attention backward");
}

// One cached plan (a forward, or a backward of one mode) with its workspace layout:
// [stats (head-major)] [D] [dQ accumulator] [dK copy] [dV copy] [cuDNN's own].
struct Plan {
  std::string refusal;  // non-empty: cuDNN cannot run this shape
  CudnnPlan plan;
  Ids ids;
  size_t stats_at = 0, dsum_at = 0, dq_acc_at = 0, dk_at = 0, dv_at = 0, cudnn_at = 0, bytes = 0;
};

// The largest workspace a plan may ask for (cuDNN's deterministic backward materialises dP:
// batch x heads x len x kv_len x 2 bytes); STATEFLOW_ATTENTION_WORKSPACE_GB, default 8, or the
// test seam's limit.
size_t workspace_limit() {
  if (workspace_limit_for_test) return *workspace_limit_for_test;
  static const size_t limit = [] {
    const char* v = std::getenv("STATEFLOW_ATTENTION_WORKSPACE_GB");
    const double gb = v && *v ? std::atof(v) : 8.0;
    SF_CHECK(gb > 0, "STATEFLOW_ATTENTION_WORKSPACE_GB must be a positive number of GiB, not '", v, "'");
    return size_t(gb * double(size_t(1) << 30));
  }();
  return limit;
}

enum class Pass { Forward, BackwardDeterministic, BackwardAtomicDq };

Plan make_plan(const AttentionDims& d, int64_t q_rows, Pass pass) {
  Plan p;
  const std::string missing = cudnn_unavailable_reason();
  if (!missing.empty()) {
    p.refusal = missing;
    return p;
  }
  const Shape s(d, q_rows);
  const float scale = float(d.scale);
  const CudnnBackward mode = pass == Pass::BackwardAtomicDq ? CudnnBackward::AtomicDq : CudnnBackward::Deterministic;
  try {
    if (pass == Pass::Forward) {
      p.plan = forward_plan(s, scale, p.ids);
    } else {
      p.plan = backward_plan(s, scale, mode, p.ids);
    }
  } catch (const Error& e) {
    p.refusal = e.what();
    return p;
  }
  const size_t rows = size_t(s.B * s.Hq * s.L), kv = size_t(s.B * s.S * s.Hkv * s.D);
  const bool bwd = pass != Pass::Forward;
  const size_t kv_bytes = bwd ? kv * 2 : 0;
  p.stats_at = 0;
  p.dsum_at = p.stats_at + align256(rows * 4);
  p.dq_acc_at = p.dsum_at + (bwd ? align256(rows * 4) : 0);
  p.dk_at = p.dq_acc_at + (pass == Pass::BackwardAtomicDq ? align256(rows * size_t(s.D) * 4) : 0);
  p.dv_at = p.dk_at + align256(kv_bytes);
  p.cudnn_at = p.dv_at + align256(kv_bytes);
  p.bytes = p.cudnn_at + align256(size_t(p.plan.workspace_bytes));
  return p;
}

// Plans per thread (a cuDNN handle and its plans belong to one thread's GPU), shape and pass.
const Plan& plan_for(const AttentionDims& d, int64_t q_rows, Pass pass) {
  int gpu = 0;
  cudaGetDevice(&gpu);
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, int>;
  const Key key{gpu,       d.batch,    d.len,      d.offset + d.len, d.kv_rows,      q_rows,
                d.q_heads, d.kv_heads, d.head_dim, float(d.scale),   int(pass)};
  thread_local std::map<Key, Plan> cache;
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_plan(d, q_rows, pass)).first;
  return it->second;
}

Pass backward_pass(CudnnBackward mode) {
  return mode == CudnnBackward::AtomicDq ? Pass::BackwardAtomicDq : Pass::BackwardDeterministic;
}

// The calls a chunk's queries are run as. Deterministic: pieces cut at absolute positions that
// are multiples of kCudnnAttentionPiece, so a chunk cut on that grid runs exactly the calls the
// whole sequence runs (the GPU chunk rule, bitwise), and the materialised dP stays bounded.
// Atomic dQ: one call (it is not repeatable anyway).
struct Piece {
  AttentionDims d;  // the piece as a chunk of its own (len, offset)
  int64_t first;    // its first row within the chunk
};

std::vector<Piece> pieces_of(const AttentionDims& d, CudnnBackward mode) {
  if (mode == CudnnBackward::AtomicDq) return {{d, 0}};
  std::vector<Piece> r;
  for (int64_t a = d.offset; a < d.offset + d.len;) {
    const int64_t end = std::min(d.offset + d.len, (a / kCudnnAttentionPiece + 1) * kCudnnAttentionPiece);
    AttentionDims p = d;
    p.offset = a, p.len = end - a;
    r.push_back({p, a - d.offset});
    a = end;
  }
  return r;
}

char* at(void* ws, size_t offset) { return static_cast<char*>(ws) + offset; }

}  // namespace

size_t cudnn_attention_workspace_bytes(const AttentionDims& d, CudnnBackward mode) {
  if (!cudnn_attention_refusal(d, mode).empty()) return 0;
  size_t bytes = 0;
  for (const Piece& p : pieces_of(d, mode))
    bytes = std::max({bytes, plan_for(p.d, d.len, Pass::Forward).bytes, plan_for(p.d, d.len, backward_pass(mode)).bytes});
  return bytes;
}

// The workspace limit is checked here, per call, not cached with the plan: the test seam may
// change it between calls.
std::string cudnn_attention_refusal(const AttentionDims& d, CudnnBackward mode) {
  for (const Piece& p : pieces_of(d, mode)) {
    const Plan &f = plan_for(p.d, d.len, Pass::Forward), &b = plan_for(p.d, d.len, backward_pass(mode));
    if (!f.refusal.empty()) return "forward: " + f.refusal;
    if (!b.refusal.empty()) return "backward: " + b.refusal;
    for (const Plan* plan : {&f, &b})
      if (size_t(plan->plan.workspace_bytes) > workspace_limit())
        return "cuDNN's " + plan->plan.engine + " needs " + format_bytes(plan->plan.workspace_bytes) +
               " of workspace, more than STATEFLOW_ATTENTION_WORKSPACE_GB allows";
  }
  return "";
}

std::string cudnn_attention_describe(const AttentionDims& d, CudnnBackward mode) {
  const std::string why = cudnn_attention_refusal(d, mode);
  if (!why.empty()) return "cuDNN unused: " + why;
  const std::vector<Piece> pieces = pieces_of(d, mode);
  const Plan &f = plan_for(pieces.back().d, d.len, Pass::Forward),
             &b = plan_for(pieces.back().d, d.len, backward_pass(mode));
  return "cuDNN " + std::to_string(cudnn_version()) + ", " + std::to_string(pieces.size()) + " call(s), forward " +
         f.plan.engine + ", backward " + b.plan.engine +
         (mode == CudnnBackward::AtomicDq ? " with atomic dQ" : " deterministic") + ", workspace " +
         std::to_string(cudnn_attention_workspace_bytes(d, mode) >> 20) + " MiB";
}

void cudnn_attention_forward(const AttentionDims& d, CudnnBackward mode, const bf16* q, const bf16* k, const bf16* v,
                             bf16* o, float* lse, void* ws, cudaStream_t stream) {
  const int64_t row = d.q_heads * d.head_dim;
  for (const Piece& piece : pieces_of(d, mode)) {
    const Plan& p = plan_for(piece.d, d.len, Pass::Forward);
    SF_CHECK(p.refusal.empty(), "attention: cuDNN cannot run this shape: ", p.refusal);
    const Ids& id = p.ids;
    float* stats = reinterpret_cast<float*>(at(ws, p.stats_at));
    p.plan.run(stream,
               {{id.q, const_cast<bf16*>(q + piece.first * row)},
                {id.k, const_cast<bf16*>(k)},
                {id.v, const_cast<bf16*>(v)},
                {id.o, o + piece.first * row},
                {id.stats, stats}},
               at(ws, p.cudnn_at));
    transpose_lse_cuda(stats, lse + piece.first * d.q_heads, d.batch, d.q_heads, piece.d.len, d.len, true, stream);
  }
}

void cudnn_attention_backward(const AttentionDims& d, CudnnBackward mode, const bf16* q, const bf16* k, const bf16* v,
                              const bf16* o, const float* lse, const bf16* dout, bf16* dq, float* dk, float* dv,
                              void* ws, cudaStream_t stream) {
  const int64_t row = d.q_heads * d.head_dim, width = d.kv_heads * d.head_dim;
  const std::vector<Piece> pieces = pieces_of(d, mode);
  for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {  // last first, as chunks run
    const Piece& piece = *it;
    const Plan& p = plan_for(piece.d, d.len, backward_pass(mode));
    SF_CHECK(p.refusal.empty(), "attention: cuDNN cannot run this shape: ", p.refusal);
    const Ids& id = p.ids;
    const int64_t at_row = piece.first * row;
    float* stats = reinterpret_cast<float*>(at(ws, p.stats_at));
    transpose_lse_cuda(lse + piece.first * d.q_heads, stats, d.batch, d.q_heads, piece.d.len, d.len, false,
                       stream);
    std::vector<std::pair<int64_t, void*>> t = {{id.q, const_cast<bf16*>(q + at_row)},
                                                {id.k, const_cast<bf16*>(k)},
                                                {id.v, const_cast<bf16*>(v)},
                                                {id.o, const_cast<bf16*>(o + at_row)},
                                                {id.dout, const_cast<bf16*>(dout + at_row)},
                                                {id.stats, stats},
                                                {id.dq, dq + at_row},
                                                {id.dk, at(ws, p.dk_at)},
                                                {id.dv, at(ws, p.dv_at)},
                                                {id.dsum, at(ws, p.dsum_at)}};
    if (id.dq_acc >= 0) {  // the atomics add into it: it starts at zero
      const size_t bytes = size_t(d.batch * d.q_heads * piece.d.len * d.head_dim) * 4;
      cuda_check(cudaMemsetAsync(at(ws, p.dq_acc_at), 0, bytes, stream), "clearing the attention dQ accumulator");
      t.emplace_back(id.dq_acc, at(ws, p.dq_acc_at));
    }
    p.plan.run(stream, t, at(ws, p.cudnn_at));
    const int64_t kv_len = piece.d.offset + piece.d.len;
    add_prefix_rows_cuda(reinterpret_cast<const bf16*>(at(ws, p.dk_at)), dk, d.batch, kv_len, d.kv_rows, width, stream);
    add_prefix_rows_cuda(reinterpret_cast<const bf16*>(at(ws, p.dv_at)), dv, d.batch, kv_len, d.kv_rows, width, stream);
  }
}

#else  // built without cuDNN

size_t cudnn_attention_workspace_bytes(const AttentionDims&, CudnnBackward) { return 0; }
std::string cudnn_attention_refusal(const AttentionDims&, CudnnBackward) { return cudnn_unavailable_reason(); }
std::string cudnn_attention_describe(const AttentionDims&, CudnnBackward) {
  return "cuDNN unused: " + cudnn_unavailable_reason();
}
void cudnn_attention_forward(const AttentionDims&, CudnnBackward, const __nv_bfloat16*, const __nv_bfloat16*,
                             const __nv_bfloat16*, __nv_bfloat16*, float*, void*, cudaStream_t) {
  throw Error("attention: " + cudnn_unavailable_reason());
}
void cudnn_attention_backward(const AttentionDims&, CudnnBackward, const __nv_bfloat16*, const __nv_bfloat16*,
                              const __nv_bfloat16*, const __nv_bfloat16*, const float*, const __nv_bfloat16*,
                              __nv_bfloat16*, float*, float*, void*, cudaStream_t) {
  throw Error("attention: " + cudnn_unavailable_reason());
}

#endif

}  // namespace stateflow
