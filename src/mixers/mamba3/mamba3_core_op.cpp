// The Mamba-3 chunk core as an op (kernels/op_def.h): what its CUDA test and mamba3_core_bench
// share. bf16 x, b, c, dy; fp32 scalars as the layer makes them (adt = A dt < 0, dt in about
// [0.001, 0.1), lam = sigmoid); fp32 edges in and out, their gradients too; dD accumulated.
// Reference: the float64 token recurrence (mixers/mamba3/mamba3_core.h). P = 64, N = 128:
// what the kernel supports; rank 1, 2 or 4 (a sub-chunk of 64 / rank tokens).
#include "kernels/op_def.h"
#include "mixers/mamba3/mamba3_core.h"
#include "model/config.h"
#include "model/mixer.h"

#ifdef STATEFLOW_HAVE_CUDA
#include "kernels/cuda/op_launch.h"
#include "mixers/mamba3/mamba3_core_cuda.h"
#endif

namespace stateflow {
namespace {

constexpr int64_t kP = 64, kN = 128;

Mamba3Dims dims_of(const OpShape& s) {
  Mamba3Dims d;
  d.batch = s["batch"], d.len = s["len"], d.heads = s["heads"], d.rank = s["rank"], d.P = kP, d.N = kN;
  d.block = 64 / d.rank;  // the kernel's sub-chunk (its count below uses the same)
  return d;
}

// Tokens x heads; per-token vectors x (rank x P) and b, c (rank x N); the edge tensors.
double head_tokens(const OpShape& s) { return double(s["batch"] * s["len"] * s["heads"]); }
double xs(const OpShape& s) { return head_tokens(s) * double(s["rank"] * kP); }
double bs(const OpShape& s) { return head_tokens(s) * double(s["rank"] * kN); }
double edges(const OpShape& s) {  // S, x_prev, b_prev of every (sequence, head)
  return double(s["batch"] * s["heads"]) * double(kP * kN + s["rank"] * (kP + kN));
}

// The M registry row's core count per head and token at this rank (MATH.md section 9).
MixerFlops flops_per_head_token(int64_t rank) {
  ModelConfig one_head;
  one_head.pattern = "M";
  one_head.mixers["mamba3"] = {
      {"heads", 1}, {"head_dim", kP}, {"state_size", kN}, {"rank", rank}, {"block_size", 64 / rank}};
  one_head.complete_sections();
  return mixer_for_letter('M').flops_per_token(one_head);
}

Mamba3CoreInputs<double> inputs_of(OpHost& h) {
  return {h.at("x").data(), h.at("b").data(), h.at("c").data(), h.at("adt").data(),
          h.at("dt").data(), h.at("lam").data(), h.at("D").data()};
}

void reference_forward(const OpShape& s, DType, OpHost& h) {
  mamba3_recurrent_forward<double>(dims_of(s), inputs_of(h), {h.at("S_in").data(), h.at("xp_in").data(), h.at("bp_in").data()},
                                   h.at("y").data(), {h.at("S_out").data(), h.at("xp_out").data(), h.at("bp_out").data()});
}

// The kernel adds dD into what it holds; the recurrence writes it.
void reference_backward(const OpShape& s, DType, OpHost& h) {
  std::vector<double> dD(h.at("dD").size());
  mamba3_recurrent_backward<double>(
      dims_of(s), inputs_of(h), {h.at("S_in").data(), h.at("xp_in").data(), h.at("bp_in").data()}, h.at("dy").data(),
      {h.at("dS_out").data(), h.at("dxp_out").data(), h.at("dbp_out").data()},
      {h.at("dx").data(), h.at("db").data(), h.at("dc").data(), h.at("dadt").data(), h.at("ddt").data(),
       h.at("dlam").data(), dD.data()},
      {h.at("dS_in").data(), h.at("dxp_in").data(), h.at("dbp_in").data()});
  for (size_t i = 0; i < dD.size(); ++i) h.at("dD")[i] += dD[i];
}

#ifdef STATEFLOW_HAVE_CUDA
using bf16 = __nv_bfloat16;

Mamba3CudaInputs cuda_inputs_of(const OpLaunch& l) {
  return {l.at<bf16>("x"), l.at<bf16>("b"), l.at<bf16>("c"), l.at<float>("adt"),
          l.at<float>("dt"), l.at<float>("lam"), l.at<float>("D")};
}

Mamba3Edge<float> edge_in_of(const OpLaunch& l) { return {l.at<float>("S_in"), l.at<float>("xp_in"), l.at<float>("bp_in")}; }

void run_forward(const OpLaunch& l) {
  mamba3_chunk_forward_cuda(dims_of(l.shape), cuda_inputs_of(l), edge_in_of(l), l.at<bf16>("y"),
                            {l.at<float>("S_out"), l.at<float>("xp_out"), l.at<float>("bp_out")}, l.workspace, nullptr);
}

void run_backward(const OpLaunch& l) {
  mamba3_chunk_backward_cuda(dims_of(l.shape), cuda_inputs_of(l), edge_in_of(l), l.at<bf16>("dy"),
                             {l.at<float>("dS_out"), l.at<float>("dxp_out"), l.at<float>("dbp_out")},
                             {l.at<bf16>("dx"), l.at<bf16>("db"), l.at<bf16>("dc"), l.at<float>("dadt"),
                              l.at<float>("ddt"), l.at<float>("dlam"), l.at<float>("dD")},
                             {l.at<float>("dS_in"), l.at<float>("dxp_in"), l.at<float>("dbp_in")}, l.workspace, nullptr);
}
#endif

OpDef make_mamba3_core_op() {
  OpDef op;
  op.name = "mamba3_core";
  op.label = "mamba3 core";
  op.bench = "mamba3_core_bench";
  op.acts = {DType::BF16};  // the kernel's storage is fixed: bf16 vectors, fp32 scalars and edges
  // 203 tokens: a short last sub-chunk at every rank (64, 32 and 16 tokens per sub-chunk).
  for (int64_t rank : {1, 2, 4})
    op.test_shapes.push_back({{{"batch", 2}, {"len", 203}, {"heads", 3}, {"rank", rank}}});
  op.bench_shapes = [](const BenchSizes& b) {
    return std::vector<OpShape>{{{{"batch", b.batch}, {"len", b.tokens}, {"heads", b.heads}, {"rank", 1}}}};
  };
  op.bench_label = [](const OpShape& s) { return s.times({"batch", "len", "heads", "rank"}); };
  op.arrays = [](const OpShape& s) {
    const int64_t nt = int64_t(head_tokens(s)), nx = int64_t(xs(s)), nb = int64_t(bs(s)), H = s["heads"];
    const int64_t BH = s["batch"] * H, ns = BH * kP * kN, nxp = BH * s["rank"] * kP, nbp = BH * s["rank"] * kN;
    // Per-token scalar gradients sum many bf16-rounded terms: a looser band.
    const Tolerance summed{2e-5, 3e-2};
    return std::vector<OpArray>{
        {"x", ArrayType::BF16, nx, Role::In, Fill::normal()},
        {"b", ArrayType::BF16, nb, Role::In, Fill::normal(0.3)},
        {"c", ArrayType::BF16, nb, Role::In, Fill::normal(0.3)},
        {"adt", ArrayType::F32, nt, Role::In, Fill::log_decay(H)},
        {"dt", ArrayType::F32, nt, Role::In, Fill::uniform(0.001, 0.1)},
        {"lam", ArrayType::F32, nt, Role::In, Fill::sigmoid()},
        {"D", ArrayType::F32, H, Role::In, Fill::normal()},
        {"S_in", ArrayType::F32, ns, Role::In, Fill::normal(0.5)},
        {"xp_in", ArrayType::F32, nxp, Role::In, Fill::normal()},
        {"bp_in", ArrayType::F32, nbp, Role::In, Fill::normal(0.3)},
        {"dy", ArrayType::BF16, nx, Role::In, Fill::normal()},
        {"dS_out", ArrayType::F32, ns, Role::In, Fill::normal()},
        {"dxp_out", ArrayType::F32, nxp, Role::In, Fill::normal()},
        {"dbp_out", ArrayType::F32, nbp, Role::In, Fill::normal()},
        {"y", ArrayType::BF16, nx, Role::Out},
        {"S_out", ArrayType::F32, ns, Role::Out},
        {"xp_out", ArrayType::F32, nxp, Role::Out},
        {"bp_out", ArrayType::F32, nbp, Role::Out},
        {"dx", ArrayType::BF16, nx, Role::Out},
        {"db", ArrayType::BF16, nb, Role::Out},
        {"dc", ArrayType::BF16, nb, Role::Out},
        {"dadt", ArrayType::F32, nt, Role::Out, {}, summed},
        {"ddt", ArrayType::F32, nt, Role::Out, {}, summed},
        {"dlam", ArrayType::F32, nt, Role::Out, {}, summed},
        {"dD", ArrayType::F32, H, Role::Acc, Fill::normal()},
        {"dS_in", ArrayType::F32, ns, Role::Out},
        {"dxp_in", ArrayType::F32, nxp, Role::Out},
        {"dbp_in", ArrayType::F32, nbp, Role::Out},
    };
  };
  op.passes = {
      {"fwd", {"y", "S_out", "xp_out", "bp_out"}, reference_forward,
       [](const OpShape& s) { return flops_per_head_token(s["rank"]).core_forward * head_tokens(s); },
       // Reads x, b, c, adt, dt, lam, D and the edge; writes y and the edge out.
       [](const OpShape& s) {
         return 2 * (2 * xs(s) + 2 * bs(s)) + 4 * 3 * head_tokens(s) + 4.0 * s["heads"] + 4 * 2 * edges(s);
       }},
      {"bwd", {"dx", "db", "dc", "dadt", "ddt", "dlam", "dD", "dS_in", "dxp_in", "dbp_in"}, reference_backward,
       [](const OpShape& s) { return flops_per_head_token(s["rank"]).core_backward * head_tokens(s); },
       // Reads x, dy, b, c, adt, dt, lam, D, the edge and its gradient; writes dx, db, dc, the
       // scalar gradients and the edge's; dD read and written.
       [](const OpShape& s) {
         return 2 * (3 * xs(s) + 4 * bs(s)) + 4 * 6 * head_tokens(s) + 4 * 3.0 * s["heads"] + 4 * 3 * edges(s);
       }},
  };
#ifdef STATEFLOW_HAVE_CUDA
  op.workspace_bytes = [](const OpShape& s) { return mamba3_cuda_workspace_bytes(dims_of(s)); };
  op.passes[0].run = run_forward;
  op.passes[1].run = run_backward;
#endif
  return op;
}

const OpRegistration registered(make_mamba3_core_op());

}  // namespace
}  // namespace stateflow
