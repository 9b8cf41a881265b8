// RMSNorm, gated RMSNorm and L2 norm on the GPU against kernels/cpu/norms in float64 on the
// same rounded inputs, for fp32 and bf16 activations and every lane-team and vector-per-lane
// width (dims up to 4096, rows beyond the fixed team count); outputs poisoned first; dw accumulates onto
// existing values; backward runs are bitwise repeatable.
#include <gtest/gtest.h>

#include "kernels/cpu/norms.h"
#include "kernels/cuda/norms_cuda.h"
#include "cuda_test_util.h"
#include "test_util.h"

namespace stateflow {
namespace {

using namespace testing;

template <class A>
class NormsCuda : public ::testing::Test {};
using ActTypes = ::testing::Types<float, bf16>;
TYPED_TEST_SUITE(NormsCuda, ActTypes);

enum class Kind { Rms, Gated, L2 };
const char* kind_name(Kind k) { return k == Kind::Rms ? "rmsnorm" : k == Kind::Gated ? "gated_rmsnorm" : "l2norm"; }

struct Outputs {
  Vec y, rstd, dx, dz, dw;
  std::vector<float> raw_dx, raw_dz, raw_dw;  // fp32 copies of the device bits
};

template <class A>
std::vector<float> raw_f32(const Dev<A>& d) {
  std::vector<float> r;
  for (A x : d.raw()) r.push_back(float(x));
  return r;
}

// Forward, then backward with the forward's own outputs (rstd; y for l2norm).
template <class A>
Outputs run_gpu(Kind kind, const Vec& x, const Vec& z, const Vec& w, const Vec& dy, const Vec& dw0, int64_t rows,
                int64_t dim, double eps, const TokenRows& tokens = {}) {
  Dev<A> d_x(x), d_z(z), d_dy(dy), d_y(x.size()), d_dx(x.size()), d_dz(x.size());
  Dev<float> d_w(w), d_dw(dw0), d_rstd(static_cast<size_t>(rows));
  for (auto* d : {&d_y, &d_dx, &d_dz}) d->poison();
  d_rstd.poison();
  Dev<char> ws(norm_backward_workspace_bytes(rows, dim, tokens));
  if (kind == Kind::Rms) {
    rmsnorm_forward_cuda<A>(d_x.p, d_w.p, d_y.p, d_rstd.p, rows, dim, eps, nullptr);
    rmsnorm_backward_cuda<A>(d_x.p, d_w.p, d_rstd.p, d_dy.p, d_dx.p, d_dw.p, rows, dim, tokens, ws.p, nullptr);
  } else if (kind == Kind::Gated) {
    gated_rmsnorm_forward_cuda<A>(d_x.p, d_z.p, d_w.p, d_y.p, d_rstd.p, rows, dim, eps, nullptr);
    gated_rmsnorm_backward_cuda<A>(d_x.p, d_z.p, d_w.p, d_rstd.p, d_dy.p, d_dx.p, d_dz.p, d_dw.p, rows, dim, tokens,
                                   ws.p, nullptr);
  } else {
    l2norm_forward_cuda<A>(d_x.p, d_y.p, d_rstd.p, rows, dim, eps, nullptr);
    l2norm_backward_cuda<A>(d_y.p, d_rstd.p, d_dy.p, d_dx.p, rows, dim, nullptr);
  }
  sync_ok();
  return {d_y.get(), d_rstd.get(), d_dx.get(), d_dz.get(), d_dw.get(), raw_f32(d_dx), raw_f32(d_dz), d_dw.raw()};
}

// The CPU kernels in float64; l2norm's backward reads y as the GPU stored it.
Outputs run_cpu(Kind kind, const Vec& x, const Vec& z, const Vec& w, const Vec& dy, const Vec& dw0, const Vec& y_stored,
                int64_t rows, int64_t dim, double eps) {
  Outputs o{Vec(x.size()), Vec(rows), Vec(x.size()), Vec(x.size()), dw0, {}, {}, {}};
  if (kind == Kind::Rms) {
    rmsnorm_forward<double>(x.data(), w.data(), o.y.data(), o.rstd.data(), rows, dim, eps);
    rmsnorm_backward<double>(x.data(), w.data(), o.rstd.data(), dy.data(), o.dx.data(), o.dw.data(), rows, dim);
  } else if (kind == Kind::Gated) {
    gated_rmsnorm_forward<double>(x.data(), z.data(), w.data(), o.y.data(), o.rstd.data(), rows, dim, eps);
    gated_rmsnorm_backward<double>(x.data(), z.data(), w.data(), o.rstd.data(), dy.data(), o.dx.data(), o.dz.data(),
                                   o.dw.data(), rows, dim);
  } else {
    l2norm_forward<double>(x.data(), o.y.data(), o.rstd.data(), rows, dim, eps);
    l2norm_backward<double>(y_stored.data(), o.rstd.data(), dy.data(), o.dx.data(), rows, dim);
  }
  return o;
}

template <class A>
void check_kind(Kind kind, int64_t rows, int64_t dim, uint64_t seed, const TokenRows& tokens = {}) {
  SCOPED_TRACE(std::string(kind_name(kind)) + " rows " + std::to_string(rows) + " dim " + std::to_string(dim));
  Rng rng(seed);
  const double eps = 1e-5;
  const Vec x = rounded<A>(normal_vec(rng, rows * dim, 2.0)), z = rounded<A>(normal_vec(rng, rows * dim));
  const Vec dy = rounded<A>(normal_vec(rng, rows * dim));
  Vec w = normal_vec(rng, dim, 0.3);
  for (double& e : w) e = round_to<float>(1.0 + e);
  const Vec dw0 = rounded<float>(normal_vec(rng, dim));
  const Outputs gpu = run_gpu<A>(kind, x, z, w, dy, dw0, rows, dim, eps, tokens);
  const Outputs ref = run_cpu(kind, x, z, w, dy, dw0, gpu.y, rows, dim, eps);
  const double tol = tolerance<A>();
  std::vector<std::pair<const char*, std::pair<const Vec*, const Vec*>>> cmp = {
      {"y", {&gpu.y, &ref.y}}, {"rstd", {&gpu.rstd, &ref.rstd}}, {"dx", {&gpu.dx, &ref.dx}}};
  if (kind == Kind::Gated) cmp.push_back({"dz", {&gpu.dz, &ref.dz}});
  if (kind != Kind::L2) cmp.push_back({"dw", {&gpu.dw, &ref.dw}});
  for (auto& [name, pair] : cmp) {
    EXPECT_FALSE(has_nan(*pair.first)) << name << ": NaN (unwritten element)";
    const double err = rel_err(*pair.first, *pair.second);
    EXPECT_LE(err, name == std::string("rstd") ? tolerance<float>() : tol) << name << " rel err " << err;
  }
  const Outputs again = run_gpu<A>(kind, x, z, w, dy, dw0, rows, dim, eps, tokens);
  EXPECT_TRUE(bitwise_equal(gpu.raw_dx, again.raw_dx)) << "dx not repeatable";
  if (kind == Kind::Gated) EXPECT_TRUE(bitwise_equal(gpu.raw_dz, again.raw_dz)) << "dz not repeatable";
  if (kind != Kind::L2) EXPECT_TRUE(bitwise_equal(gpu.raw_dw, again.raw_dw)) << "dw not repeatable";
}

TYPED_TEST(NormsCuda, MatchCpuAtEveryWidth) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // 48, 128: teams of 8 and 16 lanes (4 and 2 rows per warp); 136: one vector per lane, lanes
  // partly idle; 520, 2048, 4096: 4, 8 and 16 vectors per lane. 37 rows: a part-filled last warp.
  for (Kind kind : {Kind::Rms, Kind::Gated, Kind::L2})
    for (int64_t dim : {48, 128, 136, 520, 2048, 4096}) check_kind<TypeParam>(kind, 37, dim, seed + uint64_t(dim));
}

TYPED_TEST(NormsCuda, ManyTokenBlocksOfSeveralSequencesAndRowsPerToken) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  // 2 sequences of 2125 tokens x 4 rows (heads): 34 token blocks each, the last one short.
  for (Kind kind : {Kind::Rms, Kind::Gated, Kind::L2}) check_kind<TypeParam>(kind, 17000, 64, seed, TokenRows{2, 4});
}

// dw over chunks of the sequences cut at multiples of 64 tokens, run last chunk first, is the
// unsplit run's bitwise (dx too: it is per row).
TYPED_TEST(NormsCuda, ChunksAtMultiplesOf64GiveTheUnsplitDwBitwise) {
  SKIP_WITHOUT_GPU();
  using A = TypeParam;
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t batch = 2, len = 512, heads = 3, dim = 128, eps_rows = batch * len * heads;
  const Vec x = normal_vec(rng, eps_rows * dim), z = normal_vec(rng, eps_rows * dim), dy = normal_vec(rng, eps_rows * dim);
  const Vec w = normal_vec(rng, dim), dw0 = normal_vec(rng, dim);
  // Rows of tokens [t0, t1) of every sequence.
  auto rows_of = [&](const Vec& v, int64_t t0, int64_t t1) {
    Vec out;
    for (int64_t b = 0; b < batch; ++b)
      out.insert(out.end(), v.begin() + ((b * len + t0) * heads) * dim, v.begin() + ((b * len + t1) * heads) * dim);
    return out;
  };
  for (Kind kind : {Kind::Rms, Kind::Gated}) {
    SCOPED_TRACE(kind_name(kind));
    const Outputs whole = run_gpu<A>(kind, x, z, w, dy, dw0, eps_rows, dim, 1e-5, TokenRows{batch, heads});
    for (const std::vector<int64_t>& cuts : {std::vector<int64_t>{0, 256, len}, std::vector<int64_t>{0, 128, 448, len}}) {
      Vec dw = dw0;
      for (size_t c = cuts.size() - 1; c-- > 0;) {
        const int64_t t0 = cuts[c], t1 = cuts[c + 1], n = batch * (t1 - t0) * heads;
        const Outputs part = run_gpu<A>(kind, rows_of(x, t0, t1), rows_of(z, t0, t1), w, rows_of(dy, t0, t1), dw, n,
                                        dim, 1e-5, TokenRows{batch, heads});
        dw.assign(part.raw_dw.begin(), part.raw_dw.end());
      }
      EXPECT_TRUE(bitwise_equal(std::vector<float>(dw.begin(), dw.end()), whole.raw_dw))
          << "dw, " << cuts.size() - 1 << " chunks";
    }
  }
}

TEST(NormsCudaChecks, RejectsUnsupportedWidths) {
  EXPECT_THROW(rmsnorm_forward_cuda<float>(nullptr, nullptr, nullptr, nullptr, 4, 12, 1e-5, nullptr), Error);
  EXPECT_THROW(l2norm_forward_cuda<float>(nullptr, nullptr, nullptr, 4, 8192, 1e-5, nullptr), Error);
}

}  // namespace
}  // namespace stateflow
