// The Mamba-3 layer's per-token GPU operations (mixers/mamba3/mamba3_ops_cuda.h) as ops
// (kernels/op_def.h), for their CUDA test and kernels_bench: the gates, the cumulative rotary
// angle, the rotation of B and C, the MIMO expansion of x and the output gate. bf16 storage as
// the kernels have it; references: the float64 CPU ops (mamba3_ops.h). Test shapes: two
// sequences of 70 tokens (a full and a short block of kTokenBlock = 64 for the parameter
// gradients' fixed-order sums), grouped B/C, ranks 1 (SISO: no rank parameters), 2 and 4.
// Bench shapes: the mamba3-1.3b layer (heads of P = 64 filling the model width, N = 128, half
// of it rotated, one B/C group, rank 1; rank 4 for the MIMO expansion).
// Kernel-specific properties (the angle wraps modulo 2 pi) stay in test_mamba3_ops_cuda.cu.
#include <array>
#include <initializer_list>
#include <string>
#include <vector>

#include "kernels/op_def.h"
#include "mixers/mamba3/mamba3_config.h"
#include "mixers/mamba3/mamba3_ops.h"

#ifdef STATEFLOW_HAVE_CUDA
#include "kernels/cuda/op_launch.h"
#include "mixers/mamba3/mamba3_ops_cuda.h"
#endif

namespace stateflow {
namespace {

#ifdef STATEFLOW_HAVE_CUDA
using bf16 = __nv_bfloat16;
#endif

double* at(OpHost& h, const char* name) { return h.at(name).data(); }
double zero_flops(const OpShape&) { return 0; }  // all memory-bound

constexpr Tolerance kSummed{1e-4, 1e-4};  // fp32 parameter gradients summed over tokens
constexpr Tolerance kFp32Sum{1e-5, 1e-5};  // fp32 sums of fp32 inputs

// The mamba3-1.3b layer at the bench's sizes: P = 64 channels per head, N = 128, NA = 32.
constexpr int64_t kBenchP = 64, kBenchN = 128, kBenchAngles = 32;
int64_t bench_heads(const BenchSizes& b) { return b.dim / kBenchP; }

// ---- gates: dt, adt, lam per token and head
OpDef make_gates_op() {
  OpDef op;
  op.name = op.label = "mamba3_gates";
  op.acts = {DType::BF16};
  op.test_shapes = {{{{"rows", 140}, {"heads", 3}, {"batch", 2}}}};
  op.bench_shapes = [](const BenchSizes& b) {
    return std::vector<OpShape>{{{{"rows", b.batch * b.tokens}, {"heads", bench_heads(b)}, {"batch", b.batch}}}};
  };
  op.bench_label = [](const OpShape& s) { return s.times({"rows", "heads"}); };
  op.arrays = [](const OpShape& s) {
    const int64_t n = s["rows"] * s["heads"], H = s["heads"];
    // dd_A below about -9.2 (a quarter of them) puts softplus(dd_A) under the decay floor: A clamps.
    return std::vector<OpArray>{{"dd_dt", ArrayType::BF16, n, Role::In, Fill::normal()},
                                {"dd_A", ArrayType::BF16, n, Role::In, Fill::uniform(-14, 4)},
                                {"trap", ArrayType::BF16, n, Role::In, Fill::normal()},
                                {"dt_bias", ArrayType::F32, H, Role::In, Fill::normal()},
                                {"dt", ArrayType::F32, n, Role::Out, {}, kFp32Math},
                                {"adt", ArrayType::F32, n, Role::Out, {}, kFp32Math},
                                {"lam", ArrayType::F32, n, Role::Out, {}, kFp32Math},
                                {"ddt", ArrayType::F32, n, Role::In, Fill::normal()},
                                {"dadt", ArrayType::F32, n, Role::In, Fill::normal()},
                                {"dlam", ArrayType::F32, n, Role::In, Fill::normal()},
                                {"d_dd_dt", ArrayType::BF16, n, Role::Out},
                                {"d_dd_A", ArrayType::BF16, n, Role::Out},
                                {"d_trap", ArrayType::BF16, n, Role::Out},
                                {"d_dt_bias", ArrayType::F32, H, Role::Acc, Fill::normal(), kSummed}};
  };
  auto n = [](const OpShape& s) { return double(s["rows"] * s["heads"]); };
  op.passes = {{"fwd", {"dt", "adt", "lam"},
                [](const OpShape& s, DType, OpHost& h) {
                  mamba3_gates_forward<double>(at(h, "dd_dt"), at(h, "dd_A"), at(h, "trap"), at(h, "dt_bias"),
                                               at(h, "dt"), at(h, "adt"), at(h, "lam"), s["rows"], s["heads"],
                                               kMamba3AFloor);
                },
                // Three bf16 projections in, dt_bias, three fp32 gates out.
                zero_flops, [n](const OpShape& s) { return 18 * n(s) + 4.0 * s["heads"]; }},
               {"bwd", {"d_dd_dt", "d_dd_A", "d_trap", "d_dt_bias"},
                [](const OpShape& s, DType, OpHost& h) {
                  mamba3_gates_backward<double>(at(h, "dd_dt"), at(h, "dd_A"), at(h, "trap"), at(h, "dt_bias"),
                                                at(h, "ddt"), at(h, "dadt"), at(h, "dlam"), at(h, "d_dd_dt"),
                                                at(h, "d_dd_A"), at(h, "d_trap"), at(h, "d_dt_bias"), s["rows"],
                                                s["heads"], kMamba3AFloor);
                },
                // The projections and three fp32 gradients in, three bf16 gradients out; dt_bias
                // read, d_dt_bias read and written.
                zero_flops, [n](const OpShape& s) { return 24 * n(s) + 12.0 * s["heads"]; }}};
#ifdef STATEFLOW_HAVE_CUDA
  op.workspace_bytes = [](const OpShape& s) {
    return mamba3_gates_backward_workspace_bytes(s["rows"], s["heads"], s["batch"]);
  };
  op.passes[0].run = [](const OpLaunch& l) {
    mamba3_gates_forward_cuda(l.at<bf16>("dd_dt"), l.at<bf16>("dd_A"), l.at<bf16>("trap"), l.at<float>("dt_bias"),
                              l.at<float>("dt"), l.at<float>("adt"), l.at<float>("lam"), l["rows"], l["heads"],
                              kMamba3AFloor, nullptr);
  };
  op.passes[1].run = [](const OpLaunch& l) {
    mamba3_gates_backward_cuda(l.at<bf16>("dd_dt"), l.at<bf16>("dd_A"), l.at<bf16>("trap"), l.at<float>("dt_bias"),
                               l.at<float>("ddt"), l.at<float>("dadt"), l.at<float>("dlam"), l.at<bf16>("d_dd_dt"),
                               l.at<bf16>("d_dd_A"), l.at<bf16>("d_trap"), l.at<float>("d_dt_bias"), l["rows"],
                               l["heads"], l["batch"], kMamba3AFloor, l.workspace, nullptr);
  };
#endif
  return op;
}

// ---- cumulative rotary angle phi_t = wrap(phi_{t-1} + dt_t pi tanh(ang_t))
OpDef make_angles_op() {
  OpDef op;
  op.name = op.label = "mamba3_angles";
  op.acts = {DType::BF16};
  op.test_shapes = {{{{"batch", 2}, {"len", 70}, {"heads", 3}, {"angles", 4}}}};
  op.bench_shapes = [](const BenchSizes& b) {
    return std::vector<OpShape>{
        {{{"batch", b.batch}, {"len", b.tokens}, {"heads", bench_heads(b)}, {"angles", kBenchAngles}}}};
  };
  op.bench_label = [](const OpShape& s) { return s.times({"len", "heads", "angles"}); };
  op.arrays = [](const OpShape& s) {
    const int64_t rows = s["batch"] * s["len"], H = s["heads"], NA = s["angles"], edge = s["batch"] * H * NA;
    // Small steps and a small start keep every angle inside (-pi, pi), so the reduction never
    // wraps and the angles compare by relative error; the wrap is the kernel test's.
    return std::vector<OpArray>{{"ang", ArrayType::BF16, rows * NA, Role::In, Fill::normal()},
                                {"dt", ArrayType::F32, rows * H, Role::In, Fill::uniform(0.001, 0.02)},
                                {"phi_in", ArrayType::F32, edge, Role::In, Fill::normal(0.5)},
                                {"phi", ArrayType::F32, rows * H * NA, Role::Out, {}, kFp32Math},
                                {"phi_out", ArrayType::F32, edge, Role::Out, {}, kFp32Math},
                                {"dphi", ArrayType::F32, rows * H * NA, Role::In, Fill::normal()},
                                {"dphi_out", ArrayType::F32, edge, Role::In, Fill::normal()},
                                {"dang", ArrayType::BF16, rows * NA, Role::Out},
                                {"ddt", ArrayType::F32, rows * H, Role::Acc, Fill::normal(), kSummed},
                                {"dphi_in", ArrayType::F32, edge, Role::Out, {}, kFp32Sum}};
  };
  auto rows = [](const OpShape& s) { return double(s["batch"] * s["len"]); };
  auto edge = [](const OpShape& s) { return double(s["batch"] * s["heads"] * s["angles"]); };
  op.passes = {{"fwd", {"phi", "phi_out"},
                [](const OpShape& s, DType, OpHost& h) {
                  mamba3_angles_forward<double>(at(h, "ang"), at(h, "dt"), at(h, "phi_in"), at(h, "phi"),
                                                at(h, "phi_out"), s["batch"], s["len"], s["heads"], s["angles"]);
                },
                // ang (bf16), dt, phi_in in; phi and phi_out out (fp32).
                zero_flops,
                [rows, edge](const OpShape& s) {
                  return rows(s) * (2.0 * s["angles"] + 4.0 * s["heads"] + 4.0 * s["heads"] * s["angles"]) +
                         8 * edge(s);
                }},
               {"bwd", {"dang", "ddt", "dphi_in"},
                [](const OpShape& s, DType, OpHost& h) {
                  mamba3_angles_backward<double>(at(h, "ang"), at(h, "dt"), at(h, "dphi"), at(h, "dphi_out"),
                                                 at(h, "dang"), at(h, "ddt"), at(h, "dphi_in"), s["batch"], s["len"],
                                                 s["heads"], s["angles"]);
                },
                // ang, dt, dphi, dphi_out in; dang out; ddt read and written; dphi_in out.
                zero_flops,
                [rows, edge](const OpShape& s) {
                  return rows(s) * (2 * 2.0 * s["angles"] + 3 * 4.0 * s["heads"] + 4.0 * s["heads"] * s["angles"]) +
                         8 * edge(s);
                }}};
#ifdef STATEFLOW_HAVE_CUDA
  op.workspace_bytes = [](const OpShape& s) {
    return mamba3_angles_backward_workspace_bytes(s["batch"] * s["len"], s["heads"], s["angles"]);
  };
  op.passes[0].run = [](const OpLaunch& l) {
    mamba3_angles_forward_cuda(l.at<bf16>("ang"), l.at<float>("dt"), l.at<float>("phi_in"), l.at<float>("phi"),
                               l.at<float>("phi_out"), l["batch"], l["len"], l["heads"], l["angles"], nullptr);
  };
  op.passes[1].run = [](const OpLaunch& l) {
    mamba3_angles_backward_cuda(l.at<bf16>("ang"), l.at<float>("dt"), l.at<float>("dphi"), l.at<float>("dphi_out"),
                                l.at<bf16>("dang"), l.at<float>("ddt"), l.at<float>("dphi_in"), l["batch"], l["len"],
                                l["heads"], l["angles"], l.workspace, nullptr);
  };
#endif
  return op;
}

// ---- rotary B/C: out[row, h, r] = Rot(phi[row, h]) (bc[row, r, g(h)] + bias[h, r])
OpDef make_rotary_bc_op() {
  OpDef op;
  op.name = op.label = "mamba3_rotary_bc";
  op.acts = {DType::BF16};
  // NA = 4 < N / 2 = 8: the coordinates past the rotated pairs pass through.
  op.test_shapes = {
      {{{"rows", 140}, {"heads", 4}, {"rank", 2}, {"groups", 2}, {"state", 16}, {"angles", 4}, {"batch", 2}}}};
  op.bench_shapes = [](const BenchSizes& b) {
    return std::vector<OpShape>{{{{"rows", b.batch * b.tokens}, {"heads", bench_heads(b)}, {"rank", 1}, {"groups", 1},
                                  {"state", kBenchN}, {"angles", kBenchAngles}, {"batch", b.batch}}}};
  };
  op.bench_label = [](const OpShape& s) { return s.times({"rows", "heads", "state"}); };
  op.arrays = [](const OpShape& s) {
    const int64_t rows = s["rows"], H = s["heads"], R = s["rank"], N = s["state"];
    const int64_t n_in = rows * R * s["groups"] * N, n_out = rows * H * R * N, n_phi = rows * H * s["angles"];
    return std::vector<OpArray>{
        {"bc", ArrayType::BF16, n_in, Role::In, Fill::normal()},
        {"bias", ArrayType::F32, H * R * N, Role::In, Fill::normal()},
        {"phi", ArrayType::F32, n_phi, Role::In, Fill::normal(2.0)},
        {"out", ArrayType::BF16, n_out, Role::Out},
        {"dout", ArrayType::BF16, n_out, Role::In, Fill::normal()},
        // The forward's output as the backward reads it (for dphi). Drawn rather than taken from
        // "out", so the float64 reference sees the bf16 values the kernel reads, bit for bit.
        {"out_saved", ArrayType::BF16, n_out, Role::In, Fill::normal()},
        {"dbc", ArrayType::BF16, n_in, Role::Out},
        {"dbias", ArrayType::F32, H * R * N, Role::Acc, Fill::normal(), kFp32Sum},
        {"dphi", ArrayType::F32, n_phi, Role::Acc, Fill::normal(), kFp32Sum}};
  };
  auto dims = [](const OpShape& s) {  // elements of bc, of out, of phi, of bias
    const double rows = double(s["rows"]), RN = double(s["rank"] * s["state"]);
    return std::array<double, 4>{rows * RN * double(s["groups"]), rows * RN * double(s["heads"]),
                                 rows * double(s["heads"] * s["angles"]), RN * double(s["heads"])};
  };
  op.passes = {{"fwd", {"out"},
                [](const OpShape& s, DType, OpHost& h) {
                  mamba3_rotary_bc_forward<double>(at(h, "bc"), at(h, "bias"), at(h, "phi"), at(h, "out"), s["rows"],
                                                   s["heads"], s["rank"], s["groups"], s["state"], s["angles"]);
                },
                // bc (bf16), bias, phi in; out (bf16) out.
                zero_flops,
                [dims](const OpShape& s) {
                  const auto [bc, out, phi, bias] = dims(s);
                  return 2 * bc + 4 * bias + 4 * phi + 2 * out;
                }},
               {"bwd", {"dbc", "dbias", "dphi"},
                [](const OpShape& s, DType, OpHost& h) {
                  mamba3_rotary_bc_backward<double>(at(h, "dout"), at(h, "out_saved"), at(h, "phi"), at(h, "dbc"),
                                                    at(h, "dbias"), at(h, "dphi"), s["rows"], s["heads"], s["rank"],
                                                    s["groups"], s["state"], s["angles"]);
                },
                // dout, out_saved (bf16), phi in; dbc out; dbias and dphi read and written.
                zero_flops,
                [dims](const OpShape& s) {
                  const auto [bc, out, phi, bias] = dims(s);
                  return 2 * 2 * out + 4 * phi + 2 * bc + 8 * bias + 8 * phi;
                }}};
#ifdef STATEFLOW_HAVE_CUDA
  op.workspace_bytes = [](const OpShape& s) {
    return mamba3_rotary_bc_backward_workspace_bytes(s["rows"], s["heads"], s["rank"], s["state"], s["batch"]);
  };
  op.passes[0].run = [](const OpLaunch& l) {
    mamba3_rotary_bc_forward_cuda(l.at<bf16>("bc"), l.at<float>("bias"), l.at<float>("phi"), l.at<bf16>("out"),
                                  l["rows"], l["heads"], l["rank"], l["groups"], l["state"], l["angles"], nullptr);
  };
  op.passes[1].run = [](const OpLaunch& l) {
    mamba3_rotary_bc_backward_cuda(l.at<bf16>("dout"), l.at<bf16>("out_saved"), l.at<float>("phi"), l.at<bf16>("dbc"),
                                   l.at<float>("dbias"), l.at<float>("dphi"), l["rows"], l["heads"], l["rank"],
                                   l["groups"], l["state"], l["angles"], l["batch"], l.workspace, nullptr);
  };
#endif
  return op;
}

// Shapes of the rank ops: 140 rows of 3 heads of P = 8 at each rank given.
std::vector<OpShape> rank_test_shapes(std::initializer_list<int64_t> ranks) {
  std::vector<OpShape> shapes;
  for (int64_t R : ranks) shapes.push_back({{{"rows", 140}, {"heads", 3}, {"rank", R}, {"P", 8}, {"batch", 2}}});
  return shapes;
}

OpShape rank_bench_shape(const BenchSizes& b, int64_t rank) {
  return {{{"rows", b.batch * b.tokens}, {"heads", bench_heads(b)}, {"rank", rank}, {"P", kBenchP}, {"batch", b.batch}}};
}

std::string rank_bench_label(const OpShape& s) { return s.times({"rows", "heads", "rank", "P"}); }

// Elements of [rows, H, P] and of [rows, H, R, P], and of the rank parameters [H, R, P].
double per_head(const OpShape& s) { return double(s["rows"] * s["heads"] * s["P"]); }
double per_rank(const OpShape& s) { return per_head(s) * double(s["rank"]); }
double rank_params(const OpShape& s) { return double(s["heads"] * s["rank"] * s["P"]); }

// ---- MIMO inputs X[row, h, r] = x[row, h] mimo_x[h, r] (MIMO only: SISO uses x itself)
OpDef make_expand_x_op() {
  OpDef op;
  op.name = op.label = "mamba3_expand_x";
  op.acts = {DType::BF16};
  op.test_shapes = rank_test_shapes({2, 4});
  op.bench_shapes = [](const BenchSizes& b) { return std::vector<OpShape>{rank_bench_shape(b, 4)}; };
  op.bench_label = rank_bench_label;
  op.arrays = [](const OpShape& s) {
    const int64_t nx = int64_t(per_head(s)), nX = int64_t(per_rank(s)), W = int64_t(rank_params(s));
    return std::vector<OpArray>{{"x", ArrayType::BF16, nx, Role::In, Fill::normal()},
                                {"mimo_x", ArrayType::F32, W, Role::In, Fill::normal()},
                                {"X", ArrayType::BF16, nX, Role::Out},
                                {"dX", ArrayType::BF16, nX, Role::In, Fill::normal()},
                                {"dx", ArrayType::BF16, nx, Role::Out},
                                {"dmimo_x", ArrayType::F32, W, Role::Acc, Fill::normal(), kSummed}};
  };
  op.passes = {{"fwd", {"X"},
                [](const OpShape& s, DType, OpHost& h) {
                  mamba3_expand_x_forward<double>(at(h, "x"), at(h, "mimo_x"), at(h, "X"), s["rows"], s["heads"],
                                                  s["rank"], s["P"]);
                },
                zero_flops,  // x in, X out (bf16); mimo_x read
                [](const OpShape& s) { return 2 * per_head(s) + 2 * per_rank(s) + 4 * rank_params(s); }},
               {"bwd", {"dx", "dmimo_x"},
                [](const OpShape& s, DType, OpHost& h) {
                  mamba3_expand_x_backward<double>(at(h, "x"), at(h, "mimo_x"), at(h, "dX"), at(h, "dx"),
                                                   at(h, "dmimo_x"), s["rows"], s["heads"], s["rank"], s["P"]);
                },
                zero_flops,  // x, dX in, dx out (bf16); mimo_x read, dmimo_x read and written
                [](const OpShape& s) { return 2 * 2 * per_head(s) + 2 * per_rank(s) + 12 * rank_params(s); }}};
#ifdef STATEFLOW_HAVE_CUDA
  op.workspace_bytes = [](const OpShape& s) {
    return mamba3_rank_params_workspace_bytes(s["rows"], s["heads"], s["rank"], s["P"], s["batch"]);
  };
  op.passes[0].run = [](const OpLaunch& l) {
    mamba3_expand_x_forward_cuda(l.at<bf16>("x"), l.at<float>("mimo_x"), l.at<bf16>("X"), l["rows"], l["heads"],
                                 l["rank"], l["P"], nullptr);
  };
  op.passes[1].run = [](const OpLaunch& l) {
    mamba3_expand_x_backward_cuda(l.at<bf16>("x"), l.at<float>("mimo_x"), l.at<bf16>("dX"), l.at<bf16>("dx"),
                                  l.at<float>("dmimo_x"), l["rows"], l["heads"], l["rank"], l["P"], l["batch"],
                                  l.workspace, nullptr);
  };
#endif
  return op;
}

// ---- output gate out[row, h] = sum_r y[row, h, r] silu(z[row, h] mimo_z[h, r]) mimo_o[h, r];
// rank 1 is SISO: no rank parameters (null), as the layer calls it.
OpDef make_output_gate_op() {
  OpDef op;
  op.name = op.label = "mamba3_output_gate";
  op.acts = {DType::BF16};
  op.test_shapes = rank_test_shapes({2, 1, 4});
  op.bench_shapes = [](const BenchSizes& b) { return std::vector<OpShape>{rank_bench_shape(b, 1)}; };
  op.bench_label = rank_bench_label;
  op.arrays = [](const OpShape& s) {
    const int64_t nx = int64_t(per_head(s)), nY = int64_t(per_rank(s)), W = int64_t(rank_params(s));
    return std::vector<OpArray>{{"y", ArrayType::BF16, nY, Role::In, Fill::normal()},
                                {"z", ArrayType::BF16, nx, Role::In, Fill::normal()},
                                {"mimo_z", ArrayType::F32, W, Role::In, Fill::normal()},
                                {"mimo_o", ArrayType::F32, W, Role::In, Fill::normal()},
                                {"out", ArrayType::BF16, nx, Role::Out},
                                {"dout", ArrayType::BF16, nx, Role::In, Fill::normal()},
                                {"dy", ArrayType::BF16, nY, Role::Out},
                                {"dz", ArrayType::BF16, nx, Role::Out},
                                {"dmimo_z", ArrayType::F32, W, Role::Acc, Fill::normal(), kSummed},
                                {"dmimo_o", ArrayType::F32, W, Role::Acc, Fill::normal(), kSummed}};
  };
  // The rank parameters (or null) and their gradients: MIMO only.
  auto mimo = [](const OpShape& s, OpHost& h, const char* name) { return s["rank"] > 1 ? at(h, name) : nullptr; };
  auto params = [](const OpShape& s) { return s["rank"] > 1 ? rank_params(s) : 0.0; };
  op.passes = {{"fwd", {"out"},
                [mimo](const OpShape& s, DType, OpHost& h) {
                  mamba3_output_gate_forward<double>(at(h, "y"), at(h, "z"), mimo(s, h, "mimo_z"),
                                                     mimo(s, h, "mimo_o"), at(h, "out"), s["rows"], s["heads"],
                                                     s["rank"], s["P"]);
                },
                zero_flops,  // y, z in, out out (bf16); the rank parameters read
                [params](const OpShape& s) { return 2 * per_rank(s) + 2 * 2 * per_head(s) + 8 * params(s); }},
               {"bwd", {"dy", "dz", "dmimo_z", "dmimo_o"},
                [mimo](const OpShape& s, DType, OpHost& h) {
                  mamba3_output_gate_backward<double>(at(h, "y"), at(h, "z"), mimo(s, h, "mimo_z"),
                                                      mimo(s, h, "mimo_o"), at(h, "dout"), at(h, "dy"), at(h, "dz"),
                                                      mimo(s, h, "dmimo_z"), mimo(s, h, "dmimo_o"), s["rows"],
                                                      s["heads"], s["rank"], s["P"]);
                },
                // y, dy and z, dout, dz (bf16); the rank parameters read, their gradients read and written.
                zero_flops,
                [params](const OpShape& s) { return 2 * 2 * per_rank(s) + 3 * 2 * per_head(s) + 24 * params(s); }}};
#ifdef STATEFLOW_HAVE_CUDA
  op.workspace_bytes = [](const OpShape& s) {
    return 2 * mamba3_rank_params_workspace_bytes(s["rows"], s["heads"], s["rank"], s["P"], s["batch"]);
  };
  op.passes[0].run = [](const OpLaunch& l) {
    const bool mimo = l["rank"] > 1;
    mamba3_output_gate_forward_cuda(l.at<bf16>("y"), l.at<bf16>("z"), mimo ? l.at<float>("mimo_z") : nullptr,
                                    mimo ? l.at<float>("mimo_o") : nullptr, l.at<bf16>("out"), l["rows"], l["heads"],
                                    l["rank"], l["P"], nullptr);
  };
  op.passes[1].run = [](const OpLaunch& l) {
    const bool mimo = l["rank"] > 1;
    mamba3_output_gate_backward_cuda(
        l.at<bf16>("y"), l.at<bf16>("z"), mimo ? l.at<float>("mimo_z") : nullptr, mimo ? l.at<float>("mimo_o") : nullptr,
        l.at<bf16>("dout"), l.at<bf16>("dy"), l.at<bf16>("dz"), mimo ? l.at<float>("dmimo_z") : nullptr,
        mimo ? l.at<float>("dmimo_o") : nullptr, l["rows"], l["heads"], l["rank"], l["P"], l["batch"], l.workspace,
        nullptr);
  };
#endif
  return op;
}

const OpRegistration gates(make_gates_op());
const OpRegistration angles(make_angles_op());
const OpRegistration rotary_bc(make_rotary_bc_op());
const OpRegistration expand_x(make_expand_x_op());
const OpRegistration output_gate(make_output_gate_op());

}  // namespace
}  // namespace stateflow
