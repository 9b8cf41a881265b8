// GPU prefix attention's own properties on the prefix_attention op's inputs and float64
// reference (mixers/attention/prefix_attention_op.cpp; each pass against its reference is
// tests/cuda/test_op_defs_cuda.cpp's): NaN in the K/V rows past the chunk is never read; the
// GPU chunk rule: cuts on multiples of 64 rows are bitwise neutral for o, lse, dq, dk and dv,
// other cuts stay within twice the unsplit error; head_dims without a kernel are refused.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda_test_util.h"
#include "kernels/op_def.h"
#include "mixers/attention/prefix_attention.h"
#include "mixers/attention/prefix_attention_cuda.h"
#include "test_util.h"

namespace stateflow {
namespace {

using testing::bf16;
using testing::bitwise_equal;
using testing::Dev;
using testing::fresh_seed;
using testing::has_nan;
using testing::rel_err;
using testing::Vec;

// The prefix_attention op's inputs (mixers/attention/prefix_attention_op.cpp) at one shape:
// bf16 q, k, v, dout; fp32 for the dK/dV already in the buffers.
struct Problem {
  AttentionDims d;
  Vec q, k, v, dout, dk0, dv0;
};

const OpDef& attention_op() { return op_named("prefix_attention"); }

OpShape shape_of(const AttentionDims& d) {
  return {{{"batch", d.batch}, {"len", d.len}, {"offset", d.offset}, {"kv_rows", d.kv_rows}, {"q_heads", d.q_heads},
           {"kv_heads", d.kv_heads}, {"head_dim", d.head_dim}}};
}

Problem make_problem(uint64_t seed, int64_t B, int64_t L, int64_t offset, int64_t kv_rows, int64_t Hq, int64_t Hkv,
                     int64_t D) {
  Problem p;
  p.d = {B, L, offset, kv_rows, Hq, Hkv, D, 1.0 / std::sqrt(double(D))};
  OpHost h = draw_inputs(attention_op(), shape_of(p.d), DType::BF16, seed);
  p.q = h.at("q"), p.k = h.at("k"), p.v = h.at("v"), p.dout = h.at("dout"), p.dk0 = h.at("dk"), p.dv0 = h.at("dv");
  return p;
}

struct Out {
  Vec o, lse, dq, dk, dv;
};

// The op's bound for output `name` (max|got - ref| / max|ref|).
double tolerance(const Problem& p, const std::string& name) {
  return attention_op().array(shape_of(p.d), name).tolerance.at(DType::BF16);
}

// The op's float64 references on p.
Out reference(const Problem& p) {
  const OpShape shape = shape_of(p.d);
  OpHost h{{"q", p.q}, {"k", p.k}, {"v", p.v}, {"dout", p.dout}, {"dk", p.dk0}, {"dv", p.dv0},
           {"o", Vec(p.q.size())}, {"lse", Vec(p.q.size() / p.d.head_dim)}, {"dq", Vec(p.q.size())}};
  for (const OpPass& pass : attention_op().passes) pass.reference(shape, DType::BF16, h);
  return {h.at("o"), h.at("lse"), h.at("dq"), h.at("dk"), h.at("dv")};
}

struct GpuOut {
  Out x;
  std::vector<bf16> o, dq;
  std::vector<float> lse, dk, dv;  // raw, for bitwise comparisons
};

// Runs a one-sequence problem (offset 0, kv_rows = len) as chunks cut at `cuts`: forward in
// order, backward last chunk first, every chunk reading the same K/V buffers and adding into
// the same dK/dV buffers, as the layer does. No cuts = one call over the whole sequence.
// With batch > 1 only the unsplit run is possible (chunks of a batch are not contiguous).
GpuOut run_gpu(const Problem& p, std::vector<int64_t> cuts = {}) {
  const AttentionDims& d = p.d;
  Dev<bf16> q(p.q), k(p.k), v(p.v), dout(p.dout), o(p.q.size()), dq(p.q.size());
  Dev<float> lse(p.q.size() / d.head_dim), dk(p.dk0), dv(p.dv0);
  o.poison(), dq.poison(), lse.poison();
  cuts.insert(cuts.begin(), 0), cuts.push_back(d.len);
  EXPECT_TRUE(cuts.size() == 2 || (d.batch == 1 && d.offset == 0));
  const int64_t row = d.q_heads * d.head_dim;
  auto chunk = [&](size_t c) {
    AttentionDims dc = d;
    dc.offset = d.offset + cuts[c], dc.len = cuts[c + 1] - cuts[c];
    return dc;
  };
  for (size_t c = 0; c + 1 < cuts.size(); ++c)
    prefix_attention_forward_cuda(chunk(c), q.p + cuts[c] * row, k.p, v.p, o.p + cuts[c] * row,
                                  lse.p + cuts[c] * d.q_heads, nullptr);
  for (size_t c = cuts.size() - 1; c-- > 0;) {
    const AttentionDims dc = chunk(c);
    Dev<char> ws(prefix_attention_workspace_bytes(dc));
    prefix_attention_backward_cuda(dc, q.p + cuts[c] * row, k.p, v.p, o.p + cuts[c] * row,
                                   lse.p + cuts[c] * d.q_heads, dout.p + cuts[c] * row, dq.p + cuts[c] * row, dk.p,
                                   dv.p, ws.p, nullptr);
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  GpuOut g{{o.get(), lse.get(), dq.get(), dk.get(), dv.get()}, o.raw(), dq.raw(), lse.raw(), dk.raw(), dv.raw()};
  return g;
}

// The dK/dV rows the problem's chunk owns or reads (the NaN rows past it are not compared).
Vec kv_rows_read(const Problem& p, const Vec& x) {
  Vec y;
  const int64_t w = p.d.kv_heads * p.d.head_dim;
  for (int64_t b = 0; b < p.d.batch; ++b)
    y.insert(y.end(), x.begin() + b * p.d.kv_rows * w, x.begin() + (b * p.d.kv_rows + p.d.offset + p.d.len) * w);
  return y;
}

std::vector<std::pair<std::string, double>> errors(const Problem& p, const Out& x, const Out& r) {
  return {{"o", rel_err(x.o, r.o)},
          {"lse", rel_err(x.lse, r.lse)},
          {"dq", rel_err(x.dq, r.dq)},
          {"dk", rel_err(kv_rows_read(p, x.dk), kv_rows_read(p, r.dk))},
          {"dv", rel_err(kv_rows_read(p, x.dv), kv_rows_read(p, r.dv))}};
}

// Each pass against its reference (on every test shape of the op, with dK/dV rows past the
// chunk left alone) is tests/cuda/test_op_defs_cuda.cpp's; here: NaN there is never read.
TEST(PrefixAttentionCuda, NeverReadsKvRowsPastTheChunk) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int64_t D : {128, 256}) {
    SCOPED_TRACE("head_dim " + std::to_string(D));
    Problem p = make_problem(seed, 1, 70, 130, 260, 4, 1, D);  // an unaligned chunk, 60 rows after it
    const Out r = reference(p);
    const int64_t w = p.d.kv_heads * D;
    for (int64_t e = (p.d.offset + p.d.len) * w; e < p.d.kv_rows * w; ++e)
      p.k[e] = p.v[e] = std::numeric_limits<double>::quiet_NaN();
    const GpuOut g = run_gpu(p);
    for (const Vec* x : {&g.x.o, &g.x.lse, &g.x.dq}) EXPECT_FALSE(has_nan(*x));
    EXPECT_FALSE(has_nan(kv_rows_read(p, g.x.dk)) || has_nan(kv_rows_read(p, g.x.dv)));
    for (const auto& [name, err] : errors(p, g.x, r)) EXPECT_LE(err, tolerance(p, name)) << name;
  }
}

TEST(PrefixAttentionCuda, CutsOnTheBlockGridAreBitwiseOthersWithinTwiceTheError) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int64_t D : {128, 256}) {
    SCOPED_TRACE("head_dim " + std::to_string(D));
    const Problem p = make_problem(seed, 1, 330, 0, 330, 4, 2, D);
    const GpuOut whole = run_gpu(p);
    const Out r = reference(p);
    const GpuOut aligned = run_gpu(p, {128, 192});
    EXPECT_TRUE(bitwise_equal(aligned.o, whole.o));
    EXPECT_TRUE(bitwise_equal(aligned.lse, whole.lse));
    EXPECT_TRUE(bitwise_equal(aligned.dq, whole.dq));
    EXPECT_TRUE(bitwise_equal(aligned.dk, whole.dk));
    EXPECT_TRUE(bitwise_equal(aligned.dv, whole.dv));
    const GpuOut again = run_gpu(p);  // deterministic: no atomics anywhere
    EXPECT_TRUE(bitwise_equal(again.dk, whole.dk) && bitwise_equal(again.dq, whole.dq));

    const auto e_whole = errors(p, whole.x, r);
    const auto e_split = errors(p, run_gpu(p, {1, 100, 237}).x, r);
    for (size_t i = 0; i < e_whole.size(); ++i) {
      EXPECT_LE(e_whole[i].second, tolerance(p, e_whole[i].first)) << e_whole[i].first;
      EXPECT_LE(e_split[i].second, 2 * e_whole[i].second + 1e-6) << e_split[i].first;
    }
  }
}

TEST(PrefixAttentionCuda, RefusesHeadDimsWithoutAKernel) {
  AttentionDims d{1, 8, 0, 8, 2, 1, 64, 0.125};
  try {
    check_attention_dims_cuda(d);
    FAIL() << "head_dim 64 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 64 has no GPU kernel"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace stateflow
