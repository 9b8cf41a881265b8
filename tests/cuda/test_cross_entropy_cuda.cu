// LM head + cross-entropy on the GPU against the CPU path in float64 (linear_forward, then
// cross_entropy_forward/backward, then the two backward GEMMs) on the same rounded inputs:
// several row blocks with a short last one, ignored rows, targets that are often the argmax;
// forward-only mode gives the same statistics; dx and dW are bitwise repeatable; a bad target
// makes add_loss_stats_cuda throw; chunks cut at multiples of 64 give the unsplit results bitwise.
#include <gtest/gtest.h>

#include <algorithm>

#include "kernels/cpu/gemm.h"
#include "kernels/cuda/cross_entropy_cuda.h"
#include "kernels/cuda/weight_grad_cuda.h"
#include "cuda_test_util.h"
#include "test_util.h"

namespace stateflow {
namespace {

using namespace testing;

template <class A>
class LmHeadCrossEntropyCuda : public ::testing::Test {};
using ActTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(LmHeadCrossEntropyCuda, ActTypes);

struct Problem {
  int64_t batch = 2, len = 150, rows = 300, dim = 64, vocab = 520;
  Vec x, W, logits;
  std::vector<int32_t> targets;
  int64_t near_ties = 0;  // rows whose top two logits are too close for the GPU's precision to order
};

template <class A>
Problem make_problem(Rng& rng, int64_t len = 150) {
  Problem p;
  p.len = len, p.rows = p.batch * len;
  p.x = rounded<A>(normal_vec(rng, p.rows * p.dim));
  p.W = rounded<A>(normal_vec(rng, p.dim * p.vocab, 0.3));
  p.logits.resize(p.rows * p.vocab);
  linear_forward<double>(p.x.data(), p.W.data(), p.logits.data(), p.rows, p.dim, p.vocab);
  const double tie_gap = std::is_same_v<A, float> ? 1e-4 : 1e-2;
  for (int64_t r = 0; r < p.rows; ++r) {
    const double* l = p.logits.data() + r * p.vocab;
    std::vector<double> row(l, l + p.vocab);
    const int64_t arg = std::max_element(row.begin(), row.end()) - row.begin();
    std::nth_element(row.begin(), row.begin() + 1, row.end(), std::greater<double>());
    p.near_ties += row[0] - row[1] < tie_gap;
    const double u = rng.uniform();  // half the targets are the argmax, some rows are ignored
    p.targets.push_back(u < 0.1 ? -1 : u < 0.55 ? int32_t(arg) : int32_t(rng.below(uint64_t(p.vocab))));
  }
  return p;
}

template <class A>
struct GpuResult {
  LossStats stats;
  std::vector<A> dx;
  std::vector<float> dW;
};

// running: the statistics the call adds into, token block by token block (may be null).
template <class A>
GpuResult<A> run_gpu(const Problem& p, const Vec& dW0, float scale, int64_t block_tokens, bool train,
                     LossStats* running = nullptr) {
  CublasGemm g;
  Dev<A> x(p.x), W(p.W), dx(size_t(p.rows * p.dim));
  Dev<float> dW(dW0);
  Dev<int32_t> t = upload_ids(p.targets);
  Dev<char> ws(lm_head_cross_entropy_workspace_bytes<A>(p.batch, block_tokens, p.vocab));
  Dev<LossStatsCuda> stats(size_t(loss_stats_blocks(p.batch, p.len)));
  dx.poison();
  lm_head_cross_entropy_cuda<A>(g, x.p, W.p, t.p, p.batch, p.len, p.dim, p.vocab, scale, block_tokens,
                                train ? dx.p : nullptr, train ? dW.p : nullptr, stats.p, ws.p);
  GpuResult<A> r{add_loss_stats_cuda(stats.p, p.batch, p.len, p.vocab, nullptr, running), dx.raw(), dW.raw()};
  sync_ok();
  return r;
}

// Tokens [t0, t1) of every sequence of p, as a problem of its own (a chunk).
Problem chunk_of(const Problem& p, int64_t t0, int64_t t1) {
  Problem c = p;
  c.len = t1 - t0, c.rows = p.batch * c.len;
  c.x.clear(), c.targets.clear(), c.logits.clear();
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r = b * p.len + t;
      c.x.insert(c.x.end(), p.x.begin() + r * p.dim, p.x.begin() + (r + 1) * p.dim);
      c.targets.push_back(p.targets[size_t(r)]);
    }
  return c;
}

TYPED_TEST(LmHeadCrossEntropyCuda, MatchesTheCpuPath) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const Problem p = make_problem<A>(rng);
  const Vec dW0 = rounded<float>(normal_vec(rng, p.dim * p.vocab));
  const LossStats ref = cross_entropy_forward<double>(p.logits.data(), p.targets.data(), p.rows, p.vocab);
  const float scale = float(1.0 / double(ref.counted));
  Vec dlogits(p.rows * p.vocab), dx(p.rows * p.dim), dW = dW0;
  cross_entropy_backward<double>(p.logits.data(), p.targets.data(), scale, dlogits.data(), p.rows, p.vocab);
  linear_backward_weight<double>(p.x.data(), dlogits.data(), dW.data(), p.rows, p.dim, p.vocab);
  linear_backward_data<double>(dlogits.data(), p.W.data(), dx.data(), p.rows, p.dim, p.vocab);

  const int64_t block_tokens = 64;  // per sequence: blocks of 64 + 64 + 22
  const GpuResult<A> gpu = run_gpu<A>(p, dW0, scale, block_tokens, true);
  EXPECT_EQ(gpu.stats.counted, ref.counted);
  EXPECT_LE(std::abs(gpu.stats.correct - ref.correct), p.near_ties) << "correct " << gpu.stats.correct << " vs "
                                                                    << ref.correct;
  EXPECT_GT(ref.correct, p.rows / 3) << "the test should exercise the argmax";
  const double loss_err = std::abs(gpu.stats.loss_sum - ref.loss_sum) / std::abs(ref.loss_sum);
  EXPECT_LE(loss_err, tolerance<A>()) << "loss " << gpu.stats.loss_sum << " vs " << ref.loss_sum;
  Vec dx_gpu, dW_gpu(gpu.dW.begin(), gpu.dW.end());
  for (A v : gpu.dx) dx_gpu.push_back(double(float(v)));
  EXPECT_FALSE(has_nan(dx_gpu)) << "dx: NaN (unwritten element)";
  EXPECT_LE(rel_err(dx_gpu, dx), tolerance<A>()) << "dx rel err " << rel_err(dx_gpu, dx);
  EXPECT_LE(rel_err(dW_gpu, dW), tolerance<A>()) << "dW rel err " << rel_err(dW_gpu, dW);

  const GpuResult<A> again = run_gpu<A>(p, dW0, scale, block_tokens, true);
  EXPECT_TRUE(bitwise_equal(again.dx, gpu.dx)) << "dx not repeatable";
  EXPECT_TRUE(bitwise_equal(again.dW, gpu.dW)) << "dW not repeatable";
  EXPECT_EQ(again.stats.loss_sum, gpu.stats.loss_sum);

  const GpuResult<A> eval = run_gpu<A>(p, dW0, scale, block_tokens, false);
  EXPECT_EQ(eval.stats.loss_sum, gpu.stats.loss_sum) << "forward-only mode must give the same loss";
  EXPECT_EQ(eval.stats.correct, gpu.stats.correct);
  EXPECT_TRUE(bitwise_equal(eval.dW, std::vector<float>(dW0.begin(), dW0.end()))) << "eval must not touch dW";
}

// A sequence cut into chunks at multiples of 64, the forward run first chunk first and the
// backward last chunk first (the training schedule), gives the unsplit run's loss statistics
// and dx bitwise, whatever the block size; dW is bitwise too where the cuts and the blocks are
// multiples of kWeightGradTokens (its steps), and otherwise within fp32 rounding.
TYPED_TEST(LmHeadCrossEntropyCuda, ChunksAreBitwiseTheWholeRun) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t S = kWeightGradTokens;
  struct Case {
    int64_t len, whole_block, chunk_block;
    std::vector<int64_t> cuts;
    bool dW_bitwise;
  };
  for (const Case& k : {Case{150, 128, 64, {0, 64, 150}, false}, Case{150, 128, 64, {0, 128, 150}, false},
                        Case{2 * S + 100, S, S, {0, S, 2 * S + 100}, true}}) {
    SCOPED_TRACE("len " + std::to_string(k.len) + ", cut at " + std::to_string(k.cuts[1]));
    const Problem p = make_problem<A>(rng, k.len);
    const Vec dW0 = rounded<float>(normal_vec(rng, p.dim * p.vocab));
    const float scale = 1.f / float(p.rows);
    LossStats whole_stats;
    const GpuResult<A> whole = run_gpu<A>(p, dW0, scale, k.whole_block, true, &whole_stats);
    LossStats running;
    std::vector<Problem> chunks;
    for (size_t c = 0; c + 1 < k.cuts.size(); ++c) {
      chunks.push_back(chunk_of(p, k.cuts[c], k.cuts[c + 1]));
      run_gpu<A>(chunks.back(), dW0, scale, k.chunk_block, false, &running);  // forward: statistics in token order
    }
    EXPECT_EQ(running.loss_sum, whole_stats.loss_sum) << "loss";
    EXPECT_EQ(running.correct, whole_stats.correct);
    Vec dW = dW0;
    std::vector<std::vector<A>> dx(chunks.size());
    for (size_t c = chunks.size(); c-- > 0;) {  // backward: last chunk first, dW carried
      const GpuResult<A> r = run_gpu<A>(chunks[c], dW, scale, k.chunk_block, true);
      dW.assign(r.dW.begin(), r.dW.end());
      dx[c] = r.dx;
    }
    const std::vector<float> dW_f(dW.begin(), dW.end());
    if (k.dW_bitwise)
      EXPECT_TRUE(bitwise_equal(dW_f, whole.dW)) << "dW";
    else
      EXPECT_LE(rel_err(dW, Vec(whole.dW.begin(), whole.dW.end())), 1e-5) << "dW";
    for (int64_t b = 0; b < p.batch; ++b)
      for (size_t c = 0; c < chunks.size(); ++c) {
        const int64_t n = chunks[c].len, off = (b * p.len + k.cuts[c]) * p.dim;
        const std::vector<A> want(whole.dx.begin() + off, whole.dx.begin() + off + n * p.dim);
        EXPECT_TRUE(bitwise_equal(std::vector<A>(dx[c].begin() + b * n * p.dim, dx[c].begin() + (b + 1) * n * p.dim),
                                  want))
            << "dx of sequence " << b << ", chunk " << c;
      }
  }
}

TEST(LmHeadCrossEntropyCudaChecks, BadTargetThrowsOnFetch) {
  SKIP_WITHOUT_GPU();
  const int64_t rows = 4, dim = 8, vocab = 16;
  CublasGemm g;
  Dev<float> x(Vec(rows * dim, 0.5)), W(Vec(dim * vocab, 0.25));
  Dev<int32_t> t = upload_ids({1, 16, -1, 3});
  Dev<char> ws(lm_head_cross_entropy_workspace_bytes<float>(1, 64, vocab));
  Dev<LossStatsCuda> stats(size_t(loss_stats_blocks(1, rows)));
  lm_head_cross_entropy_cuda<float>(g, x.p, W.p, t.p, 1, rows, dim, vocab, 1.f, 64, nullptr, nullptr, stats.p, ws.p);
  expect_error([&] { add_loss_stats_cuda(stats.p, 1, rows, vocab, nullptr, nullptr); }, "outside [0, 16)");
}

}  // namespace
}  // namespace stateflow
