// RMSNorm, gated RMSNorm and L2 norm as ops (kernels/op_def.h), for their CUDA test and
// kernels_bench. Test shapes: every lane-team and vector-per-lane width of the kernels (48,
// 128: teams of 8 and 16 lanes; 136: one vector per lane, lanes partly idle; 520, 2048, 4096:
// 4, 8 and 16 vectors per lane) on 37 rows (a part-filled last warp), and many token blocks of
// two sequences with 4 rows per token (dw's fixed-order reduction). References: kernels/cpu/norms.
#include "kernels/cpu/norms.h"
#include "kernels/op_def.h"

#ifdef STATEFLOW_HAVE_CUDA
#include "kernels/cuda/norms_cuda.h"
#include "kernels/cuda/op_launch.h"
#endif

namespace stateflow {
namespace {

constexpr double kRmsEps = 1e-5, kL2Eps = 1e-6;

#ifdef STATEFLOW_HAVE_CUDA
// The backward's dw partials (rmsnorm and gated_rmsnorm; l2norm has no weight).
size_t dw_workspace_bytes(const OpShape& s) {
  return norm_backward_workspace_bytes(s["rows"], s["dim"], TokenRows{s["batch"], s["per_token"]});
}
#endif

// rows = batch x tokens x per_token (rows of one token: heads for the per-head norms).
OpShape norm_shape(int64_t rows, int64_t dim, int64_t batch = 1, int64_t per_token = 1) {
  return {{{"rows", rows}, {"dim", dim}, {"batch", batch}, {"per_token", per_token}}};
}

std::vector<OpShape> test_shapes() {
  std::vector<OpShape> s;
  for (int64_t dim : {48, 128, 136, 520, 2048, 4096}) s.push_back(norm_shape(37, dim));
  s.push_back(norm_shape(17000, 64, 2, 4));  // 2 x 2125 tokens x 4 rows: 34 token blocks each, the last short
  return s;
}

double elems(const OpShape& s) { return double(s["rows"] * s["dim"]); }

// Activations (x, z, y, dy, dx, dz) bf16; w, rstd fp32. Arrays of the three norms.
std::vector<OpArray> norm_arrays(const OpShape& s, bool gated, bool weighted) {
  const int64_t n = s["rows"] * s["dim"];
  std::vector<OpArray> a = {{"x", ArrayType::Act, n, Role::In, Fill::normal(2.0)}};
  if (gated) a.push_back({"z", ArrayType::Act, n, Role::In, Fill::normal()});
  if (weighted) a.push_back({"w", ArrayType::F32, s["dim"], Role::In, Fill::normal(0.3, 1.0)});
  a.push_back({"y", ArrayType::Act, n, Role::Out});
  a.push_back({"rstd", ArrayType::F32, s["rows"], Role::Out, {}, kFp32Math});
  a.push_back({"dy", ArrayType::Act, n, Role::In, Fill::normal()});
  a.push_back({"dx", ArrayType::Act, n, Role::Out});
  if (gated) a.push_back({"dz", ArrayType::Act, n, Role::Out});
  if (weighted) a.push_back({"dw", ArrayType::F32, s["dim"], Role::Acc, Fill::normal()});
  return a;
}

OpDef norm_op(const std::string& name, bool gated, bool weighted) {
  OpDef op;
  op.name = op.label = name;
  op.test_shapes = test_shapes();
  op.arrays = [gated, weighted](const OpShape& s) { return norm_arrays(s, gated, weighted); };
  op.bench_label = [](const OpShape& s) { return s.times({"rows", "dim"}); };
  // Bytes at bf16 activations: fwd reads x (z) and writes y, rstd; bwd reads x (z), dy, rstd and
  // writes dx (dz); l2norm's backward reads y instead of x. w, dw (one row) are left out.
  const double acts_fwd = gated ? 3 : 2, acts_bwd = gated ? 5 : 3;
  auto zero = [](const OpShape&) { return 0.0; };
  op.passes = {{"fwd", {"y", "rstd"}, nullptr, zero,
                [=](const OpShape& s) { return 2 * acts_fwd * elems(s) + 4.0 * s["rows"]; }},
               {"bwd", {}, nullptr, zero, [=](const OpShape& s) { return 2 * acts_bwd * elems(s) + 4.0 * s["rows"]; }}};
  op.passes[1].writes = gated ? std::vector<std::string>{"dx", "dz", "dw"}
                        : weighted ? std::vector<std::string>{"dx", "dw"}
                                   : std::vector<std::string>{"dx"};
  return op;
}

double* at(OpHost& h, const char* name) { return h.at(name).data(); }

OpDef make_rmsnorm_op() {
  OpDef op = norm_op("rmsnorm", false, true);
  op.passes[0].reference = [](const OpShape& s, DType, OpHost& h) {
    rmsnorm_forward<double>(at(h, "x"), at(h, "w"), at(h, "y"), at(h, "rstd"), s["rows"], s["dim"], kRmsEps);
  };
  op.passes[1].reference = [](const OpShape& s, DType, OpHost& h) {
    rmsnorm_backward<double>(at(h, "x"), at(h, "w"), at(h, "rstd"), at(h, "dy"), at(h, "dx"), at(h, "dw"), s["rows"],
                             s["dim"]);
  };
#ifdef STATEFLOW_HAVE_CUDA
  op.workspace_bytes = dw_workspace_bytes;
  op.passes[0].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) {
      using A = decltype(a);
      rmsnorm_forward_cuda<A>(l.at<A>("x"), l.at<float>("w"), l.at<A>("y"), l.at<float>("rstd"), l["rows"], l["dim"],
                              kRmsEps, nullptr);
    });
  };
  op.passes[1].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) {
      using A = decltype(a);
      rmsnorm_backward_cuda<A>(l.at<A>("x"), l.at<float>("w"), l.at<float>("rstd"), l.at<A>("dy"), l.at<A>("dx"),
                               l.at<float>("dw"), l["rows"], l["dim"], TokenRows{l["batch"], l["per_token"]},
                               l.workspace, nullptr);
    });
  };
#endif
  return op;
}

OpDef make_gated_rmsnorm_op() {
  OpDef op = norm_op("gated_rmsnorm", true, true);
  op.passes[0].reference = [](const OpShape& s, DType, OpHost& h) {
    gated_rmsnorm_forward<double>(at(h, "x"), at(h, "z"), at(h, "w"), at(h, "y"), at(h, "rstd"), s["rows"], s["dim"],
                                  kRmsEps);
  };
  op.passes[1].reference = [](const OpShape& s, DType, OpHost& h) {
    gated_rmsnorm_backward<double>(at(h, "x"), at(h, "z"), at(h, "w"), at(h, "rstd"), at(h, "dy"), at(h, "dx"),
                                   at(h, "dz"), at(h, "dw"), s["rows"], s["dim"]);
  };
#ifdef STATEFLOW_HAVE_CUDA
  op.workspace_bytes = dw_workspace_bytes;
  op.passes[0].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) {
      using A = decltype(a);
      gated_rmsnorm_forward_cuda<A>(l.at<A>("x"), l.at<A>("z"), l.at<float>("w"), l.at<A>("y"), l.at<float>("rstd"),
                                    l["rows"], l["dim"], kRmsEps, nullptr);
    });
  };
  op.passes[1].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) {
      using A = decltype(a);
      gated_rmsnorm_backward_cuda<A>(l.at<A>("x"), l.at<A>("z"), l.at<float>("w"), l.at<float>("rstd"),
                                     l.at<A>("dy"), l.at<A>("dx"), l.at<A>("dz"), l.at<float>("dw"), l["rows"],
                                     l["dim"], TokenRows{l["batch"], l["per_token"]}, l.workspace, nullptr);
    });
  };
#endif
  return op;
}

OpDef make_l2norm_op() {
  OpDef op = norm_op("l2norm", false, false);
  op.passes[0].reference = [](const OpShape& s, DType, OpHost& h) {
    l2norm_forward<double>(at(h, "x"), at(h, "y"), at(h, "rstd"), s["rows"], s["dim"], kL2Eps);
  };
  // The backward reads y as the kernel stored it (in the activation type).
  op.passes[1].reference = [](const OpShape& s, DType act, OpHost& h) {
    std::vector<double> y = h.at("y");
    for (double& e : y) e = round_to_storage(e, act);
    l2norm_backward<double>(y.data(), at(h, "rstd"), at(h, "dy"), at(h, "dx"), s["rows"], s["dim"]);
  };
#ifdef STATEFLOW_HAVE_CUDA
  op.passes[0].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) {
      using A = decltype(a);
      l2norm_forward_cuda<A>(l.at<A>("x"), l.at<A>("y"), l.at<float>("rstd"), l["rows"], l["dim"], kL2Eps, nullptr);
    });
  };
  op.passes[1].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) {
      using A = decltype(a);
      l2norm_backward_cuda<A>(l.at<A>("y"), l.at<float>("rstd"), l.at<A>("dy"), l.at<A>("dx"), l["rows"], l["dim"],
                              nullptr);
    });
  };
#endif
  return op;
}

// kernels_bench: the model-width norm over T x D, and the per-head norms over T x H rows of D / H.
std::vector<OpShape> model_width(const BenchSizes& b) { return {norm_shape(b.tokens, b.dim)}; }
std::vector<OpShape> per_head(const BenchSizes& b) {
  return {norm_shape(b.tokens * b.heads, b.dim / b.heads, 1, b.heads)};
}

OpDef with_bench(OpDef op, std::vector<OpShape> (*shapes)(const BenchSizes&)) {
  op.bench_shapes = shapes;
  return op;
}

const OpRegistration rmsnorm(with_bench(make_rmsnorm_op(), model_width));
const OpRegistration gated_rmsnorm(with_bench(make_gated_rmsnorm_op(), per_head));
const OpRegistration l2norm(with_bench(make_l2norm_op(), per_head));

}  // namespace
}  // namespace stateflow
