// Prefix attention as an op (kernels/op_def.h): what its CUDA test and attention_bench share.
// One chunk of `len` queries at position `offset` against K/V rows [0, offset + len) of
// buffers of `kv_rows` rows; bf16 q, k, v, dout, o, dq; fp32 lse; fp32 dK/dV added to.
// Reference: the float64 kernels of mixers/attention/prefix_attention.h. Test shapes: a whole
// sequence with a short last block, a chunk shorter than its prefix at an unaligned offset,
// head_dim 256, a one-token chunk; grouped K/V heads. Launches: what the layer calls (the
// dispatcher of prefix_attention_cuda.h: cuDNN by default, STATEFLOW_ATTENTION=kernels for ours).
#include <cmath>

#include "kernels/op_def.h"
#include "mixers/attention/prefix_attention.h"

#ifdef STATEFLOW_HAVE_CUDA
#include "kernels/cuda/op_launch.h"
#include "mixers/attention/prefix_attention_cuda.h"
#endif

namespace stateflow {
namespace {

AttentionDims dims_of(const OpShape& s) {
  return {s["batch"], s["len"],      s["offset"],   s["kv_rows"],
          s["q_heads"], s["kv_heads"], s["head_dim"], 1.0 / std::sqrt(double(s["head_dim"]))};
}

// Elements of q (and o, dout, dq); of the K/V rows the chunk reads; query rows x heads.
double q_elems(const OpShape& s) { return double(s["batch"] * s["len"] * s["q_heads"] * s["head_dim"]); }
double kv_read(const OpShape& s) {
  return double(s["batch"] * (s["offset"] + s["len"]) * s["kv_heads"] * s["head_dim"]);
}
double rows(const OpShape& s) { return double(s["batch"] * s["len"] * s["q_heads"]); }

// FlashAttention's count: 4 x head_dim per (query, key) pair the causal mask lets through.
double forward_flops(const OpShape& s) {
  const double L = double(s["len"]), pairs = L * double(s["offset"]) + L * (L + 1) / 2;
  return 4.0 * double(s["head_dim"]) * pairs * double(s["batch"] * s["q_heads"]);
}

#ifdef STATEFLOW_HAVE_CUDA
using bf16 = __nv_bfloat16;
#endif

OpDef make_prefix_attention_op() {
  OpDef op;
  op.name = "prefix_attention";
  op.label = "prefix attention";
  op.bench = "attention_bench";
  op.acts = {DType::BF16};  // the kernels' storage is fixed: bf16 operands, fp32 lse and dK/dV
  auto shape = [](int64_t B, int64_t L, int64_t offset, int64_t kv_rows, int64_t Hq, int64_t Hkv, int64_t D) {
    return OpShape{{{"batch", B}, {"len", L}, {"offset", offset}, {"kv_rows", kv_rows}, {"q_heads", Hq},
                    {"kv_heads", Hkv}, {"head_dim", D}}};
  };
  op.test_shapes = {shape(2, 100, 0, 100, 4, 2, 128),   // whole sequence, short last block, GQA 2
                    shape(1, 70, 130, 260, 4, 1, 128),  // chunk shorter than its prefix, unaligned offset, GQA 4
                    shape(2, 64, 192, 300, 2, 2, 256),  // head_dim 256, aligned chunk, no GQA
                    shape(1, 1, 77, 90, 2, 1, 256)};    // one-token chunk
  op.bench_shapes = [shape](const BenchSizes& b) {
    return std::vector<OpShape>{shape(b.batch, b.tokens, 0, b.tokens, b.heads, b.heads, 128)};
  };
  op.arrays = [](const OpShape& s) {
    const int64_t nq = int64_t(q_elems(s)), nkv = s["batch"] * s["kv_rows"] * s["kv_heads"] * s["head_dim"];
    const Tolerance bf16_operands{2e-5, 1e-2};
    return std::vector<OpArray>{
        {"q", ArrayType::BF16, nq, Role::In, Fill::normal(1.5)},
        {"k", ArrayType::BF16, nkv, Role::In, Fill::normal()},
        {"v", ArrayType::BF16, nkv, Role::In, Fill::normal()},
        {"dout", ArrayType::BF16, nq, Role::In, Fill::normal()},
        {"o", ArrayType::BF16, nq, Role::Out, {}, bf16_operands},
        {"lse", ArrayType::F32, int64_t(rows(s)), Role::Out, {}, bf16_operands},
        {"dq", ArrayType::BF16, nq, Role::Out, {}, bf16_operands},
        // What earlier chunks' backward passes left; rows past the chunk must stay as they are.
        {"dk", ArrayType::F32, nkv, Role::Acc, Fill::normal(0.1), bf16_operands},
        {"dv", ArrayType::F32, nkv, Role::Acc, Fill::normal(0.1), bf16_operands},
    };
  };
  op.passes = {
      {"fwd", {"o", "lse"},
       [](const OpShape& s, DType, OpHost& h) {
         prefix_attention_forward<double>(dims_of(s), h.at("q").data(), h.at("k").data(), h.at("v").data(),
                                          h.at("o").data(), h.at("lse").data());
       },
       forward_flops,
       // Reads q and the K/V prefix; writes o and lse.
       [](const OpShape& s) { return 2 * 2 * q_elems(s) + 2 * 2 * kv_read(s) + 4 * rows(s); }},
      // Reads what the forward wrote (o, lse), as the layer's backward does.
      {"bwd", {"dq", "dk", "dv"},
       [](const OpShape& s, DType, OpHost& h) {
         prefix_attention_backward<double>(dims_of(s), h.at("q").data(), h.at("k").data(), h.at("v").data(),
                                           h.at("o").data(), h.at("lse").data(), h.at("dout").data(),
                                           h.at("dq").data(), h.at("dk").data(), h.at("dv").data());
       },
       // It recomputes the scores: 2.5 times the forward.
       [](const OpShape& s) { return 2.5 * forward_flops(s); },
       // Reads q, o, dout, lse and the K/V prefix; writes dq; reads and writes the dK/dV prefix (fp32).
       [](const OpShape& s) { return 2 * 4 * q_elems(s) + 4 * rows(s) + (2 * 2 + 2 * 2 * 4) * kv_read(s); }},
  };
#ifdef STATEFLOW_HAVE_CUDA
  op.workspace_bytes = [](const OpShape& s) { return prefix_attention_workspace_bytes(dims_of(s)); };
  op.passes[0].run = [](const OpLaunch& l) {
    prefix_attention_forward_cuda(dims_of(l.shape), l.at<bf16>("q"), l.at<bf16>("k"), l.at<bf16>("v"),
                                  l.at<bf16>("o"), l.at<float>("lse"), l.workspace, nullptr);
  };
  op.passes[1].run = [](const OpLaunch& l) {
    prefix_attention_backward_cuda(dims_of(l.shape), l.at<bf16>("q"), l.at<bf16>("k"), l.at<bf16>("v"),
                                   l.at<bf16>("o"), l.at<float>("lse"), l.at<bf16>("dout"), l.at<bf16>("dq"),
                                   l.at<float>("dk"), l.at<float>("dv"), l.workspace, nullptr);
  };
#endif
  return op;
}

const OpRegistration registered(make_prefix_attention_op());

}  // namespace
}  // namespace stateflow
