// Grouped value heads' copy and gradient sum (mixers/gdn/gdn_groups.h) as an op
// (kernels/op_def.h), for their CUDA test and kernels_bench. Test shapes: groups of 1, 2 and 4,
// a head size of 8 (one vector per row) and of 128 (the GPU core's), row counts that leave the
// last block part-filled. Bench: the gdn-1.3b shape's q (or k) with two value heads per q/k head.
#include "kernels/op_def.h"
#include "mixers/gdn/gdn_groups.h"

#ifdef STATEFLOW_HAVE_CUDA
#include "kernels/cuda/op_launch.h"
#include "mixers/gdn/gdn_groups_cuda.h"
#endif

namespace stateflow {
namespace {

OpShape groups_shape(int64_t rows, int64_t heads, int64_t group, int64_t d) {
  return {{{"rows", rows}, {"heads", heads}, {"group", group}, {"d", d}}};
}
double key_elems(const OpShape& s) { return double(s["rows"] * s["heads"] * s["d"]); }
double* at(OpHost& h, const char* name) { return h.at(name).data(); }

OpDef make_gdn_groups_op() {
  OpDef op;
  op.name = op.label = "gdn_groups";
  op.test_shapes = {groups_shape(77, 3, 2, 128), groups_shape(1001, 2, 4, 8), groups_shape(5, 4, 1, 128)};
  op.bench_shapes = [](const BenchSizes& b) {
    return std::vector<OpShape>{groups_shape(b.batch * b.tokens, b.heads, 2, 128)};
  };
  op.bench_label = [](const OpShape& s) { return s.times({"rows", "heads", "group", "d"}); };
  op.arrays = [](const OpShape& s) {
    const int64_t n = int64_t(key_elems(s)), nv = n * s["group"];
    return std::vector<OpArray>{{"x", ArrayType::Act, n, Role::In, Fill::normal()},
                                {"y", ArrayType::Act, nv, Role::Out, {}, kExact},
                                {"dy", ArrayType::Act, nv, Role::In, Fill::normal()},
                                {"dx", ArrayType::Act, n, Role::Out}};
  };
  auto zero = [](const OpShape&) { return 0.0; };
  // bf16: expand reads x once and writes group copies; sum reads group rows and writes one.
  auto bytes = [](const OpShape& s) { return 2 * key_elems(s) * double(1 + s["group"]); };
  op.passes = {{"expand", {"y"},
                [](const OpShape& s, DType, OpHost& h) {
                  gdn_expand_groups<double>(at(h, "x"), at(h, "y"), s["rows"], s["heads"], s["group"], s["d"]);
                },
                zero, bytes},
               {"sum", {"dx"},
                [](const OpShape& s, DType, OpHost& h) {
                  gdn_sum_groups<double>(at(h, "dy"), at(h, "dx"), s["rows"], s["heads"], s["group"], s["d"]);
                },
                zero, bytes}};
#ifdef STATEFLOW_HAVE_CUDA
  op.passes[0].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) {
      using A = decltype(a);
      gdn_expand_groups_cuda<A>(l.at<A>("x"), l.at<A>("y"), l["rows"], l["heads"], l["group"], l["d"], nullptr);
    });
  };
  op.passes[1].run = [](const OpLaunch& l) {
    dispatch_act(l.act, [&](auto a) {
      using A = decltype(a);
      gdn_sum_groups_cuda<A>(l.at<A>("dy"), l.at<A>("dx"), l["rows"], l["heads"], l["group"], l["d"], nullptr);
    });
  };
#endif
  return op;
}

const OpRegistration registered(make_gdn_groups_op());

}  // namespace
}  // namespace stateflow
