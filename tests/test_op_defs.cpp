// The CPU side of the kernel op definitions (kernels/op_def.h): the registry, every op's
// pieces that need no GPU (shapes, arrays, references, FLOP and byte counts), hand counts for
// one shape, and the input draw's determinism. The GPU side is tests/cuda/test_op_defs_cuda.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "kernels/op_def.h"
#include "kernels/op_inputs.h"
#include "test_util.h"

namespace stateflow {
namespace {

using testing::expect_error;

const OpShape kGdnOneBlock{{{"batch", 1}, {"len", 64}, {"heads", 1}, {"value_tile", 0}}};

TEST(OpDefs, RegistryHoldsEveryBenchmarkedKernelOnceSortedByName) {
  std::vector<std::string> names;
  for (const OpDef& op : all_ops()) names.push_back(op.name);
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size());
  // Every kernel gdn_core_bench and kernels_bench time.
  for (const char* expected : {"adamw", "attention_prefix_rows", "attention_rope", "attention_sigmoid_gate", "embedding", "gated_rmsnorm", "gdn_core", "gdn_gates", "gdn_groups", "l2norm", "linear",
                               "lm_head_ce", "mamba3_angles", "mamba3_core", "mamba3_expand_x", "mamba3_gates",
                               "mamba3_output_gate", "mamba3_rotary_bc", "prefix_attention", "rmsnorm", "short_conv", "swiglu"})
    EXPECT_NO_THROW(op_named(expected)) << expected;
  expect_error([] { op_named("no_such_op"); }, "registered: ");
}

TEST(OpDefs, EveryOpIsCompleteAndItsReferencesWriteWhatTheySay) {
  const uint64_t seed = testing::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const OpDef& op : all_ops()) {
    SCOPED_TRACE(op.name);
    EXPECT_FALSE(op.acts.empty());
    for (const OpShape& shape : op.bench_shapes(BenchSizes{})) {
      for (const OpArray& a : op.arrays(shape)) EXPECT_GT(a.size, 0) << a.name << " at " << shape.label();
      for (const OpPass& p : op.passes) EXPECT_GT(p.bytes(shape), 0) << p.name << " at " << shape.label();
    }
    for (const OpPass& p : op.passes) {
#ifdef STATEFLOW_HAVE_CUDA
      EXPECT_NE(p.run, nullptr) << p.name << ": a CUDA build must have its launch";
#endif
      for (const std::string& w : p.writes) EXPECT_NE(op.array(op.test_shapes[0], w).role, Role::In) << w;
    }
    // Each pass's reference on the first test shape: what it writes becomes finite and not all zero.
    const OpShape& shape = op.test_shapes.front();
    OpHost host = draw_inputs(op, shape, op.acts.front(), seed);
    for (const OpPass& p : op.passes) {
      for (const std::string& w : p.writes)
        if (op.array(shape, w).role == Role::Out) std::fill(host.at(w).begin(), host.at(w).end(), std::nan(""));
      p.reference(shape, op.acts.front(), host);
      for (const std::string& w : p.writes) {
        bool finite = true, nonzero = false;
        for (double x : host.at(w)) finite = finite && std::isfinite(x), nonzero = nonzero || x != 0;
        EXPECT_TRUE(finite && nonzero) << p.name << " writes " << w << ": finite " << finite << ", nonzero " << nonzero;
      }
    }
  }
}

// One block of 64 tokens, one head of dk = dv = 128, counted by hand (MATH.md section 9):
// forward per token 6 dk dv + 2 C (3 dk + 2 dv) + 2 C^2 / 3 = 98304 + 81920 + 2730.67.
TEST(OpDefs, GdnCoreFlopsAndBytesMatchAHandCount) {
  const OpDef& op = op_named("gdn_core");
  EXPECT_NEAR(op.pass("fwd").flops(kGdnOneBlock), 64 * (98304 + 81920 + 8192.0 / 3), 1e-6);
  // backward per token 18 dk dv + 18 C dk + 10 C dv + 4 C^2 = 294912 + 147456 + 81920 + 16384.
  EXPECT_NEAR(op.pass("bwd").flops(kGdnOneBlock), 64 * 540672.0, 1e-6);
  EXPECT_EQ(op.pass("bwd saved").flops(kGdnOneBlock), op.pass("bwd").flops(kGdnOneBlock));
  EXPECT_EQ(op.pass("bwd kept T").flops(kGdnOneBlock), op.pass("bwd").flops(kGdnOneBlock));
  EXPECT_EQ(op.pass("bwd kept sweep").flops(kGdnOneBlock), op.pass("bwd").flops(kGdnOneBlock));
  // fwd reads q, k, v (3 x 64 x 128 bf16) and beta, g (2 x 64 fp32) and S_in (128 x 128 fp32),
  // writes o (64 x 128 bf16) and S_out: 49152 + 512 + 65536 + 16384 + 65536.
  EXPECT_EQ(op.pass("fwd").bytes(kGdnOneBlock), 197120.0);
  // bwd reads q, k, v, dO, beta, g, S_in, dS_out and writes dq, dk, dv, dbeta, dg, dS_in:
  // 4 x 16384 + 512 + 2 x 65536 + 3 x 16384 + 512 + 65536.
  EXPECT_EQ(op.pass("bwd").bytes(kGdnOneBlock), 312320.0);
}

// Grouped values' copy and gradient sum move bytes only: 10 rows of 2 q/k heads of 128, groups
// of 2: expand reads 2560 bf16 values and writes 5120; sum reads 5120 and writes 2560.
TEST(OpDefs, GdnGroupsBytesMatchAHandCount) {
  const OpShape s{{{"rows", 10}, {"heads", 2}, {"group", 2}, {"d", 128}}};
  const OpDef& op = op_named("gdn_groups");
  EXPECT_EQ(op.pass("expand").bytes(s), 2 * (2560 + 5120.0));
  EXPECT_EQ(op.pass("sum").bytes(s), 2 * (5120 + 2560.0));
  EXPECT_EQ(op.pass("sum").flops(s), 0.0);
}

// One sub-chunk of 64 tokens, one head, P = 64, N = 128, rank 1 (MATH.md section 9): forward
// per token 4 R N P + 2 C R^2 (N + P) = 32768 + 24576, backward 10 R N P + 2 C R^2 (3N + 2P) =
// 81920 + 65536.
TEST(OpDefs, Mamba3CoreFlopsAndBytesMatchAHandCount) {
  const OpShape one{{{"batch", 1}, {"len", 64}, {"heads", 1}, {"rank", 1}}};
  const OpDef& op = op_named("mamba3_core");
  EXPECT_EQ(op.pass("fwd").flops(one), 64 * 57344.0);
  EXPECT_EQ(op.pass("bwd").flops(one), 64 * 147456.0);
  // fwd reads x (64 x 64 bf16 = 8192 bytes), b, c (64 x 128 bf16, 16384 each), adt, dt, lam
  // (768), D (4) and the edge S, x_prev, b_prev (32768 + 256 + 512 = 33536); writes y (8192)
  // and the edge out (33536).
  EXPECT_EQ(op.pass("fwd").bytes(one), 8192 + 32768 + 768 + 4 + 33536 + 33536 + 8192.0);
  // bwd reads x, dy, b, c, the scalars, D, the edge and its gradient; writes dx, db, dc, the
  // scalar gradients and the edge's gradient; reads and writes dD.
  EXPECT_EQ(op.pass("bwd").bytes(one), 3 * 8192 + 4 * 16384 + 6 * 256 + 4 + 8 + 3 * 33536.0);
}

// The Mamba-3 per-token ops are memory-bound: bytes only.
TEST(OpDefs, Mamba3OpBytesMatchAHandCount) {
  // Gates, 4 rows of 2 heads: fwd reads dd_dt, dd_A, trap (3 x 8 bf16) and dt_bias (2 fp32),
  // writes dt, adt, lam (3 x 8 fp32); bwd also reads ddt, dadt, dlam (fp32), writes three bf16
  // gradients, reads and writes d_dt_bias.
  const OpShape gates{{{"rows", 4}, {"heads", 2}, {"batch", 1}}};
  EXPECT_EQ(op_named("mamba3_gates").pass("fwd").bytes(gates), 48 + 8 + 96.0);
  EXPECT_EQ(op_named("mamba3_gates").pass("bwd").bytes(gates), 48 + 8 + 96 + 48 + 16.0);
  EXPECT_EQ(op_named("mamba3_gates").pass("bwd").flops(gates), 0.0);
  // Output gate, 2 rows of 1 head of P = 4 at rank 2: y (16 bf16), z and out (8 bf16 each),
  // mimo_z and mimo_o (8 fp32 each); SISO (rank 1) reads no rank parameters.
  const OpShape gate{{{"rows", 2}, {"heads", 1}, {"rank", 2}, {"P", 4}, {"batch", 1}}};
  const OpDef& out = op_named("mamba3_output_gate");
  EXPECT_EQ(out.pass("fwd").bytes(gate), 32 + 32 + 64.0);
  EXPECT_EQ(out.pass("fwd").bytes(gate.with("rank", 1)), 16 + 32.0);
  // bwd: y, dy (16 bf16 each), z, dout, dz (8 bf16 each), the parameters read and their
  // gradients read and written.
  EXPECT_EQ(out.pass("bwd").bytes(gate), 64 + 48 + 64 + 128.0);
  // Angles, one sequence of 3 tokens, 2 heads, 4 angles: fwd reads ang (12 bf16), dt (6 fp32),
  // phi_in (8 fp32), writes phi (24 fp32) and phi_out (8 fp32).
  const OpShape angles{{{"batch", 1}, {"len", 3}, {"heads", 2}, {"angles", 4}}};
  EXPECT_EQ(op_named("mamba3_angles").pass("fwd").bytes(angles), 24 + 24 + 32 + 96 + 32.0);
}

// Attention's element-wise ops move bytes only: RoPE reads and writes x in place; the gate
// reads o, g (and dy) and writes y (d_o, dg); a chunk of 2 x 5 rows of 24 moves 240 elements:
// bf16 in and out, or fp32 read and zeroed and bf16 written.
TEST(OpDefs, AttentionElementwiseBytesMatchAHandCount) {
  const OpShape rope{{{"batch", 1}, {"len", 3}, {"offset", 9}, {"heads", 2}, {"head_dim", 8}, {"rotary_dim", 4},
                      {"theta", 10000}}};
  EXPECT_EQ(op_named("attention_rope").pass("fwd").bytes(rope), 2 * 2 * 48.0);
  EXPECT_EQ(op_named("attention_rope").pass("bwd").flops(rope), 0.0);
  const OpShape gate{{{"n", 10}}};
  EXPECT_EQ(op_named("attention_sigmoid_gate").pass("fwd").bytes(gate), 60.0);
  EXPECT_EQ(op_named("attention_sigmoid_gate").pass("bwd").bytes(gate), 100.0);
  const OpShape rows{{{"batch", 2}, {"seq_len", 20}, {"offset", 7}, {"len", 5}, {"width", 24}}};
  EXPECT_EQ(op_named("attention_prefix_rows").pass("write").bytes(rows), 4 * 240.0);
  EXPECT_EQ(op_named("attention_prefix_rows").pass("take").bytes(rows), 10 * 240.0);
}

// One sequence of 64 tokens, one head of 128: 64 x 65 / 2 = 2080 (query, key) pairs under the
// causal mask, 4 x 128 FLOPs each forward, 2.5 times that backward.
TEST(OpDefs, PrefixAttentionFlopsAndBytesMatchAHandCount) {
  const OpShape one{{{"batch", 1}, {"len", 64}, {"offset", 0}, {"kv_rows", 64}, {"q_heads", 1}, {"kv_heads", 1},
                     {"head_dim", 128}}};
  const OpDef& op = op_named("prefix_attention");
  EXPECT_EQ(op.pass("fwd").flops(one), 4 * 128 * 2080.0);
  EXPECT_EQ(op.pass("bwd").flops(one), 2.5 * 4 * 128 * 2080.0);
  // fwd reads q, k, v and writes o (64 x 128 bf16 = 16384 bytes each) and lse (64 fp32).
  EXPECT_EQ(op.pass("fwd").bytes(one), 4 * 16384 + 256.0);
  // bwd reads q, o, dout, k, v and lse, writes dq, reads and writes dk and dv (fp32, 32768 each).
  EXPECT_EQ(op.pass("bwd").bytes(one), 6 * 16384 + 256 + 4 * 32768.0);
  // A chunk of 64 after 64 others sees 64 x 64 more pairs and reads twice the K/V rows.
  const OpShape later = one.with("offset", 64).with("kv_rows", 128);
  EXPECT_EQ(op.pass("fwd").flops(later), 4 * 128 * (2080 + 4096.0));
  EXPECT_EQ(op.pass("fwd").bytes(later), 4 * 16384 + 2 * 16384 + 256.0);
}

// 4 rows of 8 (bf16 activations): rmsnorm reads x and writes y (2 x 2 x 32 bytes) and rstd
// (4 x 4); its backward reads x, dy and writes dx (3 x 2 x 32) and reads rstd.
TEST(OpDefs, NormAndGemmCountsMatchAHandCount) {
  const OpShape norm{{{"rows", 4}, {"dim", 8}, {"batch", 1}, {"per_token", 1}}};
  EXPECT_EQ(op_named("rmsnorm").pass("fwd").bytes(norm), 144.0);
  EXPECT_EQ(op_named("rmsnorm").pass("bwd").bytes(norm), 208.0);
  EXPECT_EQ(op_named("rmsnorm").pass("fwd").flops(norm), 0.0);
  // y = x W with x 4 x 8, W 8 x 3: 4 x 3 outputs of 8 multiply-adds; x, W, y in bf16.
  const OpShape gemm{{{"rows", 4}, {"in", 8}, {"out", 3}, {"step", 2}}};
  const OpDef& linear = op_named("linear");
  EXPECT_EQ(linear.passes[0].flops(gemm), 192.0);
  EXPECT_EQ(linear.passes[0].bytes(gemm), 2.0 * (32 + 24 + 12));
  // dW += x^T dy in 2 steps of 2 tokens: x, dy read once (bf16), dW (fp32) read and written per step.
  EXPECT_EQ(linear.passes[2].bytes(gemm), 2.0 * (32 + 12) + 2 * 8.0 * 24);
  EXPECT_TRUE(linear.passes[3].baseline);
}

TEST(OpDefs, InputsAreDeterministicRoundedToTheirStorageAndShapedByTheirFill) {
  const OpDef& op = op_named("gdn_core");
  const OpShape shape{{{"batch", 2}, {"len", 70}, {"heads", 3}, {"value_tile", 0}}};
  const OpHost a = draw_inputs(op, shape, DType::BF16, 7), b = draw_inputs(op, shape, DType::BF16, 7);
  const OpHost c = draw_inputs(op, shape, DType::BF16, 8);
  EXPECT_EQ(a, b) << "same seed, same values";
  for (const char* name : {"q", "v", "beta", "g", "S_in"}) EXPECT_NE(a.at(name), c.at(name)) << name;
  EXPECT_NE(a.at("q"), a.at("k")) << "each array draws from its own stream";
  for (const OpArray& arr : op.arrays(shape)) {
    const DType stored = array_dtype(arr.type, DType::BF16);
    for (double x : a.at(arr.name)) ASSERT_EQ(round_to_storage(x, stored), x) << arr.name << " not rounded";
    if (arr.role == Role::Out)
      for (double x : a.at(arr.name)) ASSERT_EQ(x, 0.0) << arr.name;
  }
  const std::vector<double>& q = a.at("q");
  for (size_t row = 0; row < q.size() / 128; ++row) {
    double n2 = 0;
    for (size_t j = row * 128; j < (row + 1) * 128; ++j) n2 += q[j] * q[j];
    ASSERT_NEAR(std::sqrt(n2), 1.0, 1e-2) << "q row " << row << " is not unit length";
  }
  for (double x : a.at("beta")) ASSERT_TRUE(x > 0 && x < 1) << x;
  for (double x : a.at("g")) ASSERT_LT(x, 0) << "log-decays are negative";
}

TEST(OpDefs, FillFormulasGiveTheirRanges) {
  for (int64_t i = 0; i < 1000; ++i) {
    const double id = op_inputs::fill_value(Fill::ids(37), 3, i);
    ASSERT_TRUE(id >= 0 && id < 37 && id == std::floor(id)) << id;
    const double u = op_inputs::fill_value(Fill::uniform(-2, 5), 3, i);
    ASSERT_TRUE(u >= -2 && u < 5) << u;
  }
  double sum = 0, sum2 = 0;
  for (int64_t i = 0; i < 20000; ++i) {
    const double x = op_inputs::fill_value(Fill::normal(2.0, 1.0), 11, i);
    sum += x, sum2 += x * x;
  }
  const double mean = sum / 20000, var = sum2 / 20000 - mean * mean;
  EXPECT_NEAR(mean, 1.0, 0.05);
  EXPECT_NEAR(var, 4.0, 0.2);
}

TEST(OpDefs, ShapeSizesAreLookedUpByName) {
  EXPECT_EQ(kGdnOneBlock["len"], 64);
  EXPECT_EQ(kGdnOneBlock.label(), "batch 1, len 64, heads 1, value_tile 0");
  expect_error([] { (void)kGdnOneBlock["rows"]; }, "no size 'rows'");
  expect_error([] { op_named("gdn_core").pass("sideways"); }, "no pass 'sideways'");
}

}  // namespace
}  // namespace stateflow
