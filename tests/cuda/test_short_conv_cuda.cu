// Short conv on the GPU: a forward run split into chunks (prefix_out -> prefix) gives bitwise
// the unsplit outputs (also where the pieces run shorter tiles than the whole), and so does
// the backward over chunks at multiples of 64; a group of convs gives each its own results, and
// threads of 2 channels those of 8 (conv_narrow), bitwise; unsupported shapes are refused. The
// kernel against its float64 reference (with and without a carried
// prefix, chunks shorter than K-1, several row tiles, K from 1 to 8) is its op's test
// (kernels/ops/short_conv_op.cpp, tests/cuda/test_op_defs_cuda.cpp).
#include <gtest/gtest.h>

#include "kernels/cuda/levers.h"
#include "kernels/cuda/short_conv_cuda.h"
#include "cuda_test_util.h"
#include "test_util.h"

namespace stateflow {
namespace {

using namespace testing;

template <class A>
class ShortConvCuda : public ::testing::Test {};
using ActTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(ShortConvCuda, ActTypes);

// MATH.md section 8: conv outputs do not depend on where the sequence is cut. Runs x[len, ch]
// whole and cut at `cuts` (the last is len), carrying the prefix.
template <class A>
void check_split_forward(int64_t len, int64_t ch, const std::vector<int64_t>& cuts) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", len " + std::to_string(len));
  Rng rng(seed);
  const int64_t K = 4, P = K - 1;
  const Vec x = normal_vec(rng, len * ch), w = normal_vec(rng, ch * K, 0.5);
  Dev<A> d_x(x), d_y(len * ch), d_pout(P * ch);
  Dev<float> d_w(w);
  short_conv_forward_cuda<A>(d_x.p, nullptr, d_w.p, d_y.p, d_pout.p, 1, len, ch, K, nullptr);
  sync_ok();
  const std::vector<A> whole = d_y.raw();
  std::vector<A> pieces;
  Dev<A> carry_a(P * ch), carry_b(P * ch);
  const A* prefix = nullptr;
  int64_t t0 = 0;
  for (int64_t cut : cuts) {
    const int64_t n = cut - t0;
    Dev<A> y(n * ch);
    A* out = prefix == carry_a.p ? carry_b.p : carry_a.p;
    short_conv_forward_cuda<A>(d_x.p + t0 * ch, prefix, d_w.p, y.p, out, 1, n, ch, K, nullptr);
    sync_ok();
    const std::vector<A> part = y.raw();
    pieces.insert(pieces.end(), part.begin(), part.end());
    prefix = out, t0 = cut;
  }
  EXPECT_TRUE(bitwise_equal(pieces, whole));
}

TYPED_TEST(ShortConvCuda, SplitForwardIsBitwiseTheWhole) {
  SKIP_WITHOUT_GPU();
  check_split_forward<TypeParam>(301, 32, {2, 130, 301});  // a piece shorter than K - 1 first
}

// The forward's tile shrinks for short chunks: the 32K-row whole runs 64-row tiles, the
// pieces 8- to 32-row ones, and every output row is still the same.
TYPED_TEST(ShortConvCuda, ForwardTilesOfAnyLengthGiveTheSameRows) {
  SKIP_WITHOUT_GPU();
  check_split_forward<TypeParam>(32768, 2048, {1024, 3000, 32768});
}

// The backward over chunks cut at multiples of 64, run last chunk first with the prefix
// gradient carried (dprefix_in -> dprefix_out), gives the unsplit dx, dw and dprefix bitwise,
// for each list of cuts (each starting at 0 and ending at len).
template <class A>
void check_split_backward(int64_t len, int64_t ch, const std::vector<std::vector<int64_t>>& splits) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed) + ", len " + std::to_string(len));
  Rng rng(seed);
  const int64_t K = 4, P = K - 1;
  const Vec x = normal_vec(rng, len * ch), dy = normal_vec(rng, len * ch), w = normal_vec(rng, ch * K, 0.5);
  const Vec dw0 = normal_vec(rng, ch * K);
  Dev<A> d_x(x), d_dy(dy);
  Dev<float> d_w(w);
  // Returns dx (all rows), then dw, then the first chunk's dprefix_in, as floats.
  auto run = [&](const std::vector<int64_t>& cuts) {
    const size_t n_chunks = cuts.size() - 1;
    std::vector<Dev<A>> prefix;  // prefix[c]: what chunk c reads (chunk 0: none)
    std::vector<Dev<float>> dprefix;
    for (size_t c = 0; c <= n_chunks; ++c) prefix.emplace_back(size_t(P * ch)), dprefix.emplace_back(size_t(P * ch));
    for (size_t c = 0; c < n_chunks; ++c) {
      Dev<A> y(size_t((cuts[c + 1] - cuts[c]) * ch));
      short_conv_forward_cuda<A>(d_x.p + cuts[c] * ch, c ? prefix[c].p : nullptr, d_w.p, y.p, prefix[c + 1].p, 1,
                                 cuts[c + 1] - cuts[c], ch, K, nullptr);
    }
    Dev<A> dx(size_t(len * ch));
    Dev<float> dw(dw0);
    for (size_t c = n_chunks; c-- > 0;) {
      const int64_t n = cuts[c + 1] - cuts[c];
      Dev<char> ws(short_conv_backward_workspace_bytes(1, n, ch, K));
      short_conv_backward_cuda<A>(d_x.p + cuts[c] * ch, c ? prefix[c].p : nullptr, d_w.p, d_dy.p + cuts[c] * ch,
                                  c + 1 < n_chunks ? dprefix[c + 1].p : nullptr, dx.p + cuts[c] * ch, dprefix[c].p,
                                  dw.p, 1, n, ch, K, ws.p, nullptr);
    }
    sync_ok();
    std::vector<float> out;
    for (A v : dx.raw()) out.push_back(float(v));
    for (float v : dw.raw()) out.push_back(v);
    for (float v : dprefix[0].raw()) out.push_back(v);
    return out;
  };
  const std::vector<float> whole = run({0, len});
  for (const std::vector<int64_t>& cuts : splits)
    EXPECT_TRUE(bitwise_equal(run(cuts), whole)) << "cuts " << ::testing::PrintToString(cuts);
}

TYPED_TEST(ShortConvCuda, SplitBackwardAtMultiplesOf64IsBitwiseTheWhole) {
  SKIP_WITHOUT_GPU();
  check_split_backward<TypeParam>(512, 32, {{0, 256, 512}, {0, 128, 448, 512}});
}

// A long chunk's backward walks whole token blocks per thread and adds their 16-row segments
// itself; short chunks give each segment a thread and the reduction adds them: the same bits.
TYPED_TEST(ShortConvCuda, BackwardBlockWalksGiveTheSegmentTilesBits) {
  SKIP_WITHOUT_GPU();
  const int64_t len = 32768, ch = 2048, K = 4;
  if (lever_off("conv_walk") || lever_off("conv_tiles")) GTEST_SKIP() << "STATEFLOW_LEVERS_OFF turns the walks off";
  ASSERT_TRUE(short_conv_backward_walks_blocks(1, len, ch, K));  // the premise: whole runs walk,
  ASSERT_FALSE(short_conv_backward_walks_blocks(1, 2048, ch, K));  // 2K-token pieces do not
  check_split_backward<TypeParam>(len, ch, {{0, 2048, 4096, 30720, len}});
}

// One conv of a group test: its inputs drawn (a carried prefix and prefix gradient included),
// its outputs, and its arguments for the group calls.
template <class A>
struct GroupConv {
  int64_t ch;
  Dev<A> x, prefix, dy, y, prefix_out, dx;
  Dev<float> w, dprefix_out, dprefix_in, dw;
  Dev<char> ws;
  std::vector<float> dw0;
  GroupConv(Rng& rng, int64_t B, int64_t len, int64_t ch_, int64_t K)
      : ch(ch_), x(normal_vec(rng, B * len * ch)), prefix(normal_vec(rng, B * (K - 1) * ch)),
        dy(normal_vec(rng, B * len * ch)), y(size_t(B * len * ch)), prefix_out(size_t(B * (K - 1) * ch)),
        dx(size_t(B * len * ch)), w(normal_vec(rng, ch * K, 0.5)), dprefix_out(normal_vec(rng, B * (K - 1) * ch)),
        dprefix_in(size_t(B * (K - 1) * ch)), dw(normal_vec(rng, ch * K)),
        ws(short_conv_backward_workspace_bytes(B, len, ch, K)), dw0(dw.raw()) {}
  ShortConvForward<A> forward() { return {x.p, prefix.p, w.p, y.p, prefix_out.p, ch}; }
  ShortConvBackward<A> backward() { return {x.p, prefix.p, w.p, dy.p, dprefix_out.p, dx.p, dprefix_in.p, dw.p, ch, ws.p}; }
  // Back to the drawn dw, every output poisoned: ready for another run.
  void reset() { dw.put(dw0), y.poison(), dx.poison(), prefix_out.poison(), dprefix_in.poison(); }
};

// Forward and backward of convs [first, first + n) in one group call each; their outputs, as bytes.
template <class A>
std::vector<char> run_group(std::vector<GroupConv<A>>& convs, size_t first, size_t n, int64_t B, int64_t len,
                            int64_t K) {
  std::vector<ShortConvForward<A>> fs;
  std::vector<ShortConvBackward<A>> bs;
  for (size_t i = first; i < first + n; ++i)
    convs[i].reset(), fs.push_back(convs[i].forward()), bs.push_back(convs[i].backward());
  short_conv_forward_group_cuda<A>(fs.data(), int(n), B, len, K, nullptr);
  short_conv_backward_group_cuda<A>(bs.data(), int(n), B, len, K, nullptr);
  sync_ok();
  std::vector<char> out;
  auto add = [&](const auto& d) {
    const auto v = d.raw();
    const char* b = reinterpret_cast<const char*>(v.data());
    out.insert(out.end(), b, b + v.size() * sizeof(v[0]));
  };
  for (size_t i = first; i < first + n; ++i)
    add(convs[i].y), add(convs[i].prefix_out), add(convs[i].dx), add(convs[i].dprefix_in), add(convs[i].dw);
  return out;
}

template <class A>
std::vector<GroupConv<A>> draw_group(Rng& rng, int64_t B, int64_t len, const std::vector<int64_t>& widths, int64_t K) {
  std::vector<GroupConv<A>> convs;
  for (int64_t ch : widths) convs.emplace_back(rng, B, len, ch, K);
  return convs;
}

// A group of convs of different widths in one launch (the GDN's q, k, v) gives each conv's own
// results bitwise: forward (its tiles are chosen for the whole group) and backward, with a
// carried prefix and prefix gradient, over two sequences of a length no tile divides.
TYPED_TEST(ShortConvCuda, AGroupGivesEachConvItsOwnResultsBitwise) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t B = 2, len = 300, K = 4;
  std::vector<GroupConv<A>> convs = draw_group<A>(rng, B, len, {32, 16, 48}, K);
  std::vector<char> one_by_one;
  for (size_t i = 0; i < convs.size(); ++i) {
    const std::vector<char> out = run_group(convs, i, 1, B, len, K);
    one_by_one.insert(one_by_one.end(), out.begin(), out.end());
  }
  EXPECT_TRUE(one_by_one == run_group(convs, 0, convs.size(), B, len, K));
}

// Threads of 2 channels (the default) give the bits of threads of 8 (conv_narrow off), forward
// and backward, where the two tile the backward alike and where not: the GDN's q, k, v group at
// 2K tokens (narrow threads walk whole blocks, wide ones 16-row tiles), at 1000 tokens (both
// tiles), a 32K-token conv (both walk), and two 300-token sequences of narrow convs.
TYPED_TEST(ShortConvCuda, NarrowThreadsGiveTheWideBits) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t K = 4;
  {  // the premise of the first case
    FlagScope narrow(short_conv_narrow_for_thread(), true);
    ASSERT_TRUE(short_conv_backward_walks_blocks(1, 2048, 3 * 2048, K));
    FlagScope wide(short_conv_narrow_for_thread(), false);
    ASSERT_FALSE(short_conv_backward_walks_blocks(1, 2048, 3 * 2048, K));
  }
  struct Case {
    int64_t batch, len;
    std::vector<int64_t> widths;
  };
  for (const Case& c : {Case{1, 2048, {2048, 2048, 2048}}, Case{1, 1000, {2048, 2048, 2048}},
                        Case{1, 32768, {2048}}, Case{2, 300, {32, 16, 48}}}) {
    SCOPED_TRACE("len " + std::to_string(c.len));
    std::vector<GroupConv<A>> convs = draw_group<A>(rng, c.batch, c.len, c.widths, K);
    std::vector<char> narrow, wide;
    {
      FlagScope scope(short_conv_narrow_for_thread(), true);
      narrow = run_group(convs, 0, convs.size(), c.batch, c.len, K);
    }
    {
      FlagScope scope(short_conv_narrow_for_thread(), false);
      wide = run_group(convs, 0, convs.size(), c.batch, c.len, K);
    }
    EXPECT_TRUE(narrow == wide);
  }
}

// The GDN's q, k, v convs read x, and write dx, as column blocks of one [rows, ld] matrix (one
// GEMM's output and its gradient; ld_x, ld_dx): the bits of the contiguous tensors.
TYPED_TEST(ShortConvCuda, ColumnBlocksGiveTheContiguousBits) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t B = 2, len = 300, K = 4, rows = B * len;
  const std::vector<int64_t> widths{32, 16, 48};
  std::vector<GroupConv<A>> convs = draw_group<A>(rng, B, len, widths, K);
  const std::vector<char> contiguous = run_group(convs, 0, convs.size(), B, len, K);

  const int64_t ld = 32 + 16 + 48 + 8;  // and 8 columns no conv owns
  std::vector<A> wide(size_t(rows * ld), A(std::numeric_limits<float>::quiet_NaN()));
  std::vector<int64_t> col;
  for (int64_t c = 0; GroupConv<A>& conv : convs) {
    const std::vector<A> x = conv.x.raw();
    for (int64_t r = 0; r < rows; ++r)
      std::copy(x.begin() + r * conv.ch, x.begin() + (r + 1) * conv.ch, wide.begin() + r * ld + c);
    col.push_back(c), c += conv.ch;
  }
  Dev<A> x_wide(wide.size()), dx_wide(wide.size());
  x_wide.put(wide), dx_wide.poison();
  std::vector<ShortConvForward<A>> fs;
  std::vector<ShortConvBackward<A>> bs;
  for (size_t i = 0; i < convs.size(); ++i) {
    convs[i].reset();
    fs.push_back(convs[i].forward()), bs.push_back(convs[i].backward());
    fs[i].x = bs[i].x = x_wide.p + col[i];
    bs[i].dx = dx_wide.p + col[i];
    fs[i].ld_x = bs[i].ld_x = bs[i].ld_dx = ld;
  }
  short_conv_forward_group_cuda<A>(fs.data(), int(fs.size()), B, len, K, nullptr);
  short_conv_backward_group_cuda<A>(bs.data(), int(bs.size()), B, len, K, nullptr);
  sync_ok();
  const std::vector<A> dx_all = dx_wide.raw();
  std::vector<char> blocks;
  auto add = [&](const auto& v) {
    const char* b = reinterpret_cast<const char*>(v.data());
    blocks.insert(blocks.end(), b, b + v.size() * sizeof(v[0]));
  };
  for (size_t i = 0; i < convs.size(); ++i) {
    std::vector<A> dx;
    for (int64_t r = 0; r < rows; ++r)
      dx.insert(dx.end(), dx_all.begin() + r * ld + col[i], dx_all.begin() + r * ld + col[i] + convs[i].ch);
    add(convs[i].y.raw()), add(convs[i].prefix_out.raw()), add(dx), add(convs[i].dprefix_in.raw()),
        add(convs[i].dw.raw());
  }
  EXPECT_TRUE(blocks == contiguous);
  for (int64_t r = 0; r < rows; ++r)  // the columns no conv owns are left alone
    EXPECT_TRUE(std::isnan(float(dx_all[size_t(r * ld + ld - 1)]))) << "row " << r;
}

TEST(ShortConvCudaChecks, RejectsUnsupportedShapes) {
  expect_error([] { short_conv_forward_cuda<float>(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4, 8, 9, nullptr); },
               "K = 9");
  expect_error([] { short_conv_forward_cuda<float>(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4, 12, 4, nullptr); },
               "ch = 12");
  expect_error([] { short_conv_forward_group_cuda<float>(nullptr, 5, 1, 4, 4, nullptr); }, "5 convs in a group");
}

}  // namespace
}  // namespace stateflow
