// The GDN chunk core as an op (kernels/op_def.h): what its CUDA test and gdn_core_bench share.
// bf16 q, k, v, dO (q, k l2-normalised as the layer makes them), fp32 gates as the layer makes
// them (beta = sigmoid, g = -A softplus(. + dt_bias)), fp32 states; reference: the float64 token
// recurrence (mixers/gdn/gdn_core.h). dk = dv = 128, C = 64: what the kernel supports.
#include <cmath>

#include "kernels/op_def.h"
#include "mixers/gdn/gdn_core.h"
#include "model/config.h"
#include "model/mixer.h"

#ifdef STATEFLOW_HAVE_CUDA
#include "kernels/cuda/op_launch.h"
#include "mixers/gdn/gdn_core_cuda.h"
#endif

namespace stateflow {
namespace {

constexpr int64_t kDk = 128, kDv = 128, kBlock = 64;

GdnDims dims_of(const OpShape& s) {
  GdnDims d;
  d.batch = s["batch"], d.len = s["len"], d.heads = s["heads"], d.dk = kDk, d.dv = kDv, d.block = kBlock;
  d.scale = 1.0 / std::sqrt(double(kDk));
  return d;
}

// Tokens x heads, and the elements of one [batch, len, heads, 128] or [batch, heads, 128, 128] tensor.
double head_tokens(const OpShape& s) { return double(s["batch"] * s["len"] * s["heads"]); }
double vectors(const OpShape& s) { return head_tokens(s) * kDk; }
double states(const OpShape& s) { return double(s["batch"] * s["heads"]) * kDv * kDk; }

// The GDN registry row's count per head and token with these head sizes (MATH.md section 9).
MixerFlops flops_per_head_token() {
  ModelConfig one_head;
  one_head.mixers["gdn"] = {{"heads", 1}, {"head_dk", kDk}, {"head_dv", kDv}, {"block_size", kBlock}};
  one_head.complete_sections();
  return mixer_for_letter('G').flops_per_token(one_head);
}

void reference_forward(const OpShape& s, DType, OpHost& h) {
  gdn_recurrent_forward<double>(dims_of(s), h.at("q").data(), h.at("k").data(), h.at("v").data(),
                                h.at("beta").data(), h.at("g").data(), h.at("S_in").data(), h.at("o").data(),
                                h.at("S_out").data());
}

void reference_backward(const OpShape& s, DType, OpHost& h) {
  gdn_recurrent_backward<double>(dims_of(s), h.at("q").data(), h.at("k").data(), h.at("v").data(),
                                 h.at("beta").data(), h.at("g").data(), h.at("S_in").data(), h.at("dO").data(),
                                 h.at("dS_out").data(), h.at("dq").data(), h.at("dk").data(), h.at("dv").data(),
                                 h.at("dbeta").data(), h.at("dg").data(), h.at("dS_in").data());
}

#ifdef STATEFLOW_HAVE_CUDA
using bf16 = __nv_bfloat16;

// The shape's kernel settings: sweep (0: STATEFLOW_GDN_SWEEP, default rows; 1 rows; 2 tiles),
// sweep_key_split, sweep_warps, value_tile, piece_len / piece_tile of the split core (piece_len 0:
// STATEFLOW_GDN_PIECE_LEN, default unsplit; -1: unsplit), B4's slab height b4_slab (0: the core's)
// and the overlap of the sweeps with Out and B4, overlap (1 on, -1 off, 0 the lever core_overlap)
// overlap_segment and overlap_streams (0: the core's).
// How the backward reuses the forward: not at all, T only (kept_T), T and the forward sweep's
// V_new and states (kept_T, kept_sweep), or the whole workspace (saved_forward).
enum class Reuse { kNothing, kT, kTAndSweep, kWorkspace };

GdnCudaConfig config_of(const OpShape& s, Reuse reuse = Reuse::kNothing) {
  GdnCudaConfig cfg;
  cfg.sweep = int(s["sweep"]);
  cfg.sweep_key_split = int(s["sweep_key_split"]);
  cfg.sweep_warps = int(s["sweep_warps"]);
  cfg.value_tile = int(s["value_tile"]);
  cfg.piece_len = int(s["piece_len"]);
  cfg.piece_tile = int(s["piece_tile"]);
  cfg.b4_slab = int(s["b4_slab"]);
  cfg.overlap = int(s["overlap"]);
  cfg.overlap_segment = int(s["overlap_segment"]);
  cfg.overlap_streams = int(s["overlap_streams"]);
  cfg.kept_T = reuse == Reuse::kT || reuse == Reuse::kTAndSweep;
  cfg.kept_sweep = reuse == Reuse::kTAndSweep;
  cfg.saved_forward = reuse == Reuse::kWorkspace;
  return cfg;
}

void run_forward(const OpLaunch& l) {
  gdn_chunk_forward_cuda(dims_of(l.shape), l.at<bf16>("q"), l.at<bf16>("k"), l.at<bf16>("v"), l.at<float>("beta"),
                         l.at<float>("g"), l.at<float>("S_in"), l.at<bf16>("o"), l.at<float>("S_out"), l.workspace,
                         nullptr, config_of(l.shape));
}

void run_backward(const OpLaunch& l, Reuse reuse) {
  gdn_chunk_backward_cuda(dims_of(l.shape), l.at<bf16>("q"), l.at<bf16>("k"), l.at<bf16>("v"), l.at<float>("beta"),
                          l.at<float>("g"), l.at<float>("S_in"), l.at<bf16>("dO"), l.at<float>("dS_out"),
                          l.at<bf16>("dq"), l.at<bf16>("dk"), l.at<bf16>("dv"), l.at<float>("dbeta"),
                          l.at<float>("dg"), l.at<float>("dS_in"), l.workspace, nullptr, config_of(l.shape, reuse));
}
#endif

OpDef make_gdn_core_op() {
  OpDef op;
  op.name = "gdn_core";
  op.label = "gdn core";
  op.bench = "gdn_core_bench";
  op.acts = {DType::BF16};  // the kernel's storage is fixed: bf16 vectors, fp32 scalars and states
  // Short last sub-chunks (150 = 2 x 64 + 22, 200 = 3 x 64 + 8): the row sweeps with whole and
  // with split key columns, the tile sweeps with a fixed and the automatic value tile, and the
  // split core with pieces of 64 and 128 tokens (the last one short); B4 with the default
  // 16-row slabs and with 64-row ones.
  auto shape = [](int64_t batch, int64_t len, int64_t heads, int64_t sweep, int64_t key_split, int64_t value_tile,
                  int64_t piece_len, int64_t piece_tile, int64_t b4_slab = 0) {
    return OpShape{{{"batch", batch}, {"len", len}, {"heads", heads}, {"sweep", sweep},
                    {"sweep_key_split", key_split}, {"sweep_warps", 0}, {"value_tile", value_tile},
                    {"piece_len", piece_len}, {"piece_tile", piece_tile}, {"b4_slab", b4_slab},
                    {"overlap", 0}, {"overlap_segment", 0}, {"overlap_streams", 0}}};
  };
  op.test_shapes = {shape(1, 150, 2, 1, 1, 0, -1, 0),  shape(2, 200, 3, 1, 2, 0, -1, 0),
                    shape(1, 150, 2, 2, 0, 16, -1, 0), shape(2, 200, 3, 2, 0, 0, -1, 0),
                    shape(2, 200, 3, 0, 0, 0, 64, 32), shape(1, 333, 2, 0, 0, 0, 128, 128),
                    shape(2, 200, 3, 1, 2, 0, -1, 0, 64)};
  op.bench_shapes = [shape](const BenchSizes& b) {
    return std::vector<OpShape>{shape(b.batch, b.tokens, b.heads, 0, 0, 0, 0, 0)};
  };
  op.arrays = [](const OpShape& s) {
    const int64_t nt = int64_t(head_tokens(s)), nk = int64_t(vectors(s)), ns = int64_t(states(s));
    // Per-token scalar gradients (dg, dbeta) sum many bf16-rounded terms: a looser band.
    const Tolerance summed{2e-5, 3e-2};
    return std::vector<OpArray>{
        {"q", ArrayType::BF16, nk, Role::In, Fill::unit_rows(kDk)},
        {"k", ArrayType::BF16, nk, Role::In, Fill::unit_rows(kDk)},
        {"v", ArrayType::BF16, nk, Role::In, Fill::normal()},
        {"beta", ArrayType::F32, nt, Role::In, Fill::sigmoid()},
        {"g", ArrayType::F32, nt, Role::In, Fill::log_decay(s["heads"])},
        {"S_in", ArrayType::F32, ns, Role::In, Fill::normal(0.5)},
        {"dO", ArrayType::BF16, nk, Role::In, Fill::normal()},
        {"dS_out", ArrayType::F32, ns, Role::In, Fill::normal()},
        {"o", ArrayType::BF16, nk, Role::Out},
        {"S_out", ArrayType::F32, ns, Role::Out},
        {"dq", ArrayType::BF16, nk, Role::Out},
        {"dk", ArrayType::BF16, nk, Role::Out},
        {"dv", ArrayType::BF16, nk, Role::Out},
        {"dbeta", ArrayType::F32, nt, Role::Out, {}, summed},
        {"dg", ArrayType::F32, nt, Role::Out, {}, summed},
        {"dS_in", ArrayType::F32, ns, Role::Out},
    };
  };
  const std::vector<std::string> grads = {"dq", "dk", "dv", "dbeta", "dg", "dS_in"};
  auto backward_flops = [](const OpShape& s) { return flops_per_head_token().core_backward * head_tokens(s); };
  // Reads q, k, v, dO, beta, g, S_in, dS_out; writes dq, dk, dv, dbeta, dg, dS_in.
  auto backward_bytes = [](const OpShape& s) {
    return 2 * (4 + 3) * vectors(s) + 4 * (2 + 2) * head_tokens(s) + 4 * (2 + 1) * states(s);
  };
  op.passes = {
      {"fwd", {"o", "S_out"}, reference_forward,
       [](const OpShape& s) { return flops_per_head_token().core_forward * head_tokens(s); },
       // Reads q, k, v, beta, g, S_in; writes o, S_out.
       [](const OpShape& s) { return 2 * (3 + 1) * vectors(s) + 4 * 2 * head_tokens(s) + 4 * 2 * states(s); }},
      {"bwd", grads, reference_backward, backward_flops, backward_bytes},
      // The backward reading what the forward left in the workspace (GdnCudaConfig::saved_forward).
      {"bwd saved", grads, reference_backward, backward_flops, backward_bytes},
      // The backward reading only T from the workspace (GdnCudaConfig::kept_T; the layer keeps
      // it in a buffer of its own).
      {"bwd kept T", grads, reference_backward, backward_flops, backward_bytes},
      // The backward reading T and the forward sweep's V_new and states from the workspace
      // (GdnCudaConfig::kept_T and kept_sweep; the layer's gdn.keep_sweep keeps them in buffers).
      {"bwd kept sweep", grads, reference_backward, backward_flops, backward_bytes},
  };
#ifdef STATEFLOW_HAVE_CUDA
  op.workspace_bytes = [](const OpShape& s) {
    return gdn_cuda_workspace_bytes(dims_of(s), config_of(s));
  };
  op.passes[0].run = run_forward;
  op.passes[1].run = [](const OpLaunch& l) { run_backward(l, Reuse::kNothing); };
  op.passes[2].run = [](const OpLaunch& l) { run_backward(l, Reuse::kWorkspace); };
  op.passes[3].run = [](const OpLaunch& l) { run_backward(l, Reuse::kT); };
  op.passes[4].run = [](const OpLaunch& l) { run_backward(l, Reuse::kTAndSweep); };
#endif
  return op;
}

const OpRegistration registered(make_gdn_core_op());

}  // namespace
}  // namespace stateflow
