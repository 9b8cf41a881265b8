// The GDN gates (g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b), per token and head)
// as an op (kernels/op_def.h), for their CUDA test and kernels_bench. Test shapes: head counts
// that do and do not divide the kernel's block, more rows than partial blocks, two sequences
// of several 2048-token steps, the last short (the per-head parameter gradients' fixed-order
// reduction). Reference: mixers/gdn/gdn_gates.
#include "kernels/op_def.h"
#include "mixers/gdn/gdn_gates.h"

#ifdef STATEFLOW_HAVE_CUDA
#include "kernels/cuda/op_launch.h"
#include "mixers/gdn/gdn_gates_cuda.h"
#endif

namespace stateflow {
namespace {

double elems(const OpShape& s) { return double(s["rows"] * s["heads"]); }
double* at(OpHost& h, const char* name) { return h.at(name).data(); }

OpDef make_gdn_gates_op() {
  OpDef op;
  op.name = op.label = "gdn_gates";
  op.test_shapes = {{{{"rows", 2500}, {"heads", 16}, {"batch", 2}}},
                    {{{"rows", 77}, {"heads", 3}, {"batch", 1}}},
                    {{{"rows", 9000}, {"heads", 5}, {"batch", 2}}}};
  op.bench_shapes = [](const BenchSizes& b) {
    return std::vector<OpShape>{{{{"rows", b.tokens}, {"heads", b.heads}, {"batch", 1}}}};
  };
  op.bench_label = [](const OpShape& s) { return s.times({"rows", "heads"}); };
  op.arrays = [](const OpShape& s) {
    const int64_t n = int64_t(elems(s)), H = s["heads"];
    // A = exp(A_log) in [1, 16), dt = softplus(dt_bias) in about [0.001, 0.1): the layer's init ranges.
    return std::vector<OpArray>{{"a", ArrayType::Act, n, Role::In, Fill::normal(2.0)},
                                {"b", ArrayType::Act, n, Role::In, Fill::normal(2.0)},
                                {"A_log", ArrayType::F32, H, Role::In, Fill::uniform(0, 2.77)},
                                {"dt_bias", ArrayType::F32, H, Role::In, Fill::uniform(-6.9, -2.25)},
                                {"g", ArrayType::F32, n, Role::Out, {}, kFp32Math},
                                {"beta", ArrayType::F32, n, Role::Out, {}, kFp32Math},
                                {"dg", ArrayType::F32, n, Role::In, Fill::normal()},
                                {"dbeta", ArrayType::F32, n, Role::In, Fill::normal()},
                                {"da", ArrayType::Act, n, Role::Out},
                                {"db", ArrayType::Act, n, Role::Out},
                                {"dA_log", ArrayType::F32, H, Role::Acc, Fill::normal(), kFp32Math},
                                {"ddt_bias", ArrayType::F32, H, Role::Acc, Fill::normal(), kFp32Math}};
  };
  auto zero = [](const OpShape&) { return 0.0; };
  op.passes = {{"fwd", {"g", "beta"},
                [](const OpShape& s, DType, OpHost& h) {
                  gdn_gates_forward<double>(at(h, "a"), at(h, "b"), at(h, "A_log"), at(h, "dt_bias"), at(h, "g"),
                                            at(h, "beta"), s["rows"], s["heads"]);
                },
                zero, [](const OpShape& s) { return 12 * elems(s); }},  // a, b in (bf16); g, beta out (fp32)
               {"bwd", {"da", "db", "dA_log", "ddt_bias"},
                [](const OpShape& s, DType, OpHost& h) {
                  gdn_gates_backward<double>(at(h, "a"), at(h, "b"), at(h, "A_log"), at(h, "dt_bias"), at(h, "dg"),
                                             at(h, "dbeta"), at(h, "da"), at(h, "db"), at(h, "dA_log"),
                                             at(h, "ddt_bias"), s["rows"], s["heads"]);
                },
                zero, [](const OpShape& s) { return 16 * elems(s); }}};  // a, b, dg, dbeta in; da, db out
#ifdef STATEFLOW_HAVE_CUDA
  op.workspace_bytes = [](const OpShape& s) {
    return gdn_gates_backward_workspace_bytes(s["rows"], s["heads"], s["batch"]);
  };
  op.passes[0].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) {
      using A = decltype(a);
      gdn_gates_forward_cuda<A>(l.at<A>("a"), l.at<A>("b"), l.at<float>("A_log"), l.at<float>("dt_bias"),
                                l.at<float>("g"), l.at<float>("beta"), l["rows"], l["heads"], nullptr);
    });
  };
  op.passes[1].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) {
      using A = decltype(a);
      gdn_gates_backward_cuda<A>(l.at<A>("a"), l.at<A>("b"), l.at<float>("A_log"), l.at<float>("dt_bias"),
                                 l.at<float>("dg"), l.at<float>("dbeta"), l.at<A>("da"), l.at<A>("db"),
                                 l.at<float>("dA_log"), l.at<float>("ddt_bias"), l["rows"], l["heads"], l["batch"],
                                 l.workspace, nullptr);
    });
  };
#endif
  return op;
}

const OpRegistration registered(make_gdn_gates_op());

}  // namespace
}  // namespace stateflow
