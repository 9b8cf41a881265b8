// Mamba-3 core: chunked == token recurrence (forward and backward, SISO and MIMO, blocks
// that do and don't divide the length), StateFlow split == unsplit with the carried edge
// (S, x_prev, b_prev), both backward passes == central finite differences (float64),
// float32 accuracy, nullptr edges == zeros.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "mixers/mamba3/mamba3_core.h"
#include "test_util.h"

using namespace stateflow;
using stateflow::testing::fresh_seed;
using stateflow::testing::random_vec;
using stateflow::testing::rel_err;

namespace {

enum class Algo { recurrent, chunked };

// Inputs in the names of mamba3_core.h: x, b, c, adt, dt, lam, D, then the entering edge
// S, x_prev, b_prev. Tensor i of Grads is the gradient of tensor i here.
constexpr int kNumInputs = 10;
const char* const kNames[kNumInputs] = {"x", "b", "c", "adt", "dt", "lam", "D", "S", "x_prev", "b_prev"};

template <class T>
struct Problem {
  Mamba3Dims d;
  std::vector<std::vector<T>> t;            // kNumInputs tensors
  std::vector<T> dy, dS_out, dxp_out, dbp_out;  // output gradients
};

double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }
double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

// Inputs as the layer makes them: dt = softplus, adt = -softplus * dt, lam = sigmoid, unit-scale
// b, c (B/C are RMS-normalised), non-zero entering edge and edge gradients.
Problem<double> make_problem(Rng& rng, int64_t batch, int64_t len, int64_t heads, int64_t rank, int64_t P,
                             int64_t N, int64_t block) {
  Problem<double> p;
  p.d = Mamba3Dims{batch, len, heads, rank, P, N, block};
  const int64_t tok = batch * len * heads;
  const double bscale = 1 / std::sqrt(double(N));
  p.t.resize(kNumInputs);
  p.t[0] = random_vec<double>(rng, tok * rank * P);
  p.t[1] = random_vec<double>(rng, tok * rank * N, bscale);
  p.t[2] = random_vec<double>(rng, tok * rank * N, bscale);
  p.t[3].resize(tok), p.t[4].resize(tok), p.t[5].resize(tok);
  for (int64_t i = 0; i < tok; ++i) {
    p.t[4][i] = softplus(rng.normal() - 1);
    p.t[3][i] = -softplus(rng.normal()) * p.t[4][i];
    p.t[5][i] = sigmoid(rng.normal());
  }
  p.t[6] = random_vec<double>(rng, heads);
  p.t[7] = random_vec<double>(rng, batch * heads * P * N, 0.5);
  p.t[8] = random_vec<double>(rng, batch * heads * rank * P);
  p.t[9] = random_vec<double>(rng, batch * heads * rank * N, bscale);
  p.dy = random_vec<double>(rng, tok * rank * P);
  p.dS_out = random_vec<double>(rng, batch * heads * P * N);
  p.dxp_out = random_vec<double>(rng, batch * heads * rank * P);
  p.dbp_out = random_vec<double>(rng, batch * heads * rank * N);
  return p;
}

template <class T, class U>
Problem<T> convert(const Problem<U>& p) {
  auto cv = [](const std::vector<U>& v) { return std::vector<T>(v.begin(), v.end()); };
  Problem<T> q;
  q.d = p.d;
  for (auto& v : p.t) q.t.push_back(cv(v));
  q.dy = cv(p.dy), q.dS_out = cv(p.dS_out), q.dxp_out = cv(p.dxp_out), q.dbp_out = cv(p.dbp_out);
  return q;
}

template <class T>
struct Result {
  std::vector<T> y, S, xp, bp;               // output and emitted edge
  std::vector<std::vector<T>> grads;         // kNumInputs, in kNames order
};

template <class T>
Mamba3CoreInputs<T> inputs_of(const Problem<T>& p) {
  return {p.t[0].data(), p.t[1].data(), p.t[2].data(), p.t[3].data(), p.t[4].data(), p.t[5].data(), p.t[6].data()};
}

template <class T>
Result<T> run(Algo algo, const Problem<T>& p, bool backward = true) {
  const Mamba3Dims& d = p.d;
  Result<T> r;
  r.y.resize(p.dy.size()), r.S.resize(p.dS_out.size()), r.xp.resize(p.dxp_out.size()), r.bp.resize(p.dbp_out.size());
  const auto in = inputs_of(p);
  const Mamba3Edge<T> edge{p.t[7].data(), p.t[8].data(), p.t[9].data()};
  const Mamba3EdgeOut<T> out{r.S.data(), r.xp.data(), r.bp.data()};
  if (algo == Algo::recurrent)
    mamba3_recurrent_forward(d, in, edge, r.y.data(), out);
  else
    mamba3_chunk_forward(d, in, edge, r.y.data(), out);
  if (!backward) return r;
  r.grads.resize(kNumInputs);
  for (int i = 0; i < kNumInputs; ++i) r.grads[i].assign(p.t[i].size(), T(-7));  // overwritten, never added to
  auto& g = r.grads;
  const Mamba3CoreGrads<T> cg{g[0].data(), g[1].data(), g[2].data(), g[3].data(),
                              g[4].data(), g[5].data(), g[6].data()};
  const Mamba3Edge<T> dedge_out{p.dS_out.data(), p.dxp_out.data(), p.dbp_out.data()};
  const Mamba3EdgeOut<T> dedge_in{g[7].data(), g[8].data(), g[9].data()};
  if (algo == Algo::recurrent)
    mamba3_recurrent_backward(d, in, edge, p.dy.data(), dedge_out, cg, dedge_in);
  else
    mamba3_chunk_backward(d, in, edge, p.dy.data(), dedge_out, cg, dedge_in);
  return r;
}

// Runs a problem as consecutive pieces of the sequence (each piece a separate call, the edge
// handed forward and its gradient backward), and stitches the results together.
Result<double> run_pieces(Algo algo, const Problem<double>& p, const std::vector<int64_t>& pieces) {
  const Mamba3Dims& d = p.d;
  const int64_t B = d.batch, H = d.heads, R = d.rank;
  const int64_t per_tok[kNumInputs] = {R * d.P, R * d.N, R * d.N, 1, 1, 1};
  auto slice = [&](const std::vector<double>& v, int64_t w, int64_t off, int64_t len) {
    std::vector<double> out;
    for (int64_t b = 0; b < B; ++b)
      out.insert(out.end(), v.begin() + ((b * d.len + off) * H) * w, v.begin() + ((b * d.len + off + len) * H) * w);
    return out;
  };
  auto place = [&](std::vector<double>& v, const std::vector<double>& piece, int64_t w, int64_t off, int64_t len) {
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(piece.begin() + b * len * H * w, len * H * w, v.begin() + ((b * d.len + off) * H) * w);
  };
  std::vector<Problem<double>> parts;
  int64_t off = 0;
  for (int64_t len : pieces) {
    Problem<double> q = p;
    q.d.len = len;
    for (int i = 0; i < 6; ++i) q.t[i] = slice(p.t[i], per_tok[i], off, len);
    q.dy = slice(p.dy, R * d.P, off, len);
    parts.push_back(q);
    off += len;
  }
  // forward: each piece starts from the previous piece's emitted edge
  Result<double> all;
  all.y.resize(p.dy.size());
  for (size_t k = 0, o = 0; k < parts.size(); o += pieces[k], ++k) {
    if (k) parts[k].t[7] = all.S, parts[k].t[8] = all.xp, parts[k].t[9] = all.bp;
    Result<double> r = run(algo, parts[k], false);
    place(all.y, r.y, R * d.P, int64_t(o), pieces[k]);
    all.S = r.S, all.xp = r.xp, all.bp = r.bp;
  }
  // backward: the last piece gets the edge gradient of the whole run, each other piece the
  // entering-edge gradient of the piece after it
  all.grads.resize(kNumInputs);
  for (int i = 0; i < kNumInputs; ++i) all.grads[i].assign(p.t[i].size(), 0.0);
  std::vector<double> dS = p.dS_out, dxp = p.dxp_out, dbp = p.dbp_out;
  off = d.len;
  for (size_t k = parts.size(); k-- > 0;) {
    off -= pieces[k];
    parts[k].dS_out = dS, parts[k].dxp_out = dxp, parts[k].dbp_out = dbp;
    Result<double> r = run(algo, parts[k]);
    for (int i = 0; i < 6; ++i) place(all.grads[i], r.grads[i], per_tok[i], off, pieces[k]);
    for (size_t j = 0; j < r.grads[6].size(); ++j) all.grads[6][j] += r.grads[6][j];
    dS = r.grads[7], dxp = r.grads[8], dbp = r.grads[9];
  }
  all.grads[7] = dS, all.grads[8] = dxp, all.grads[9] = dbp;
  return all;
}

template <class T, class U>
double worst_forward(const Result<T>& a, const Result<U>& ref) {
  return std::max({rel_err(a.y, ref.y), rel_err(a.S, ref.S), rel_err(a.xp, ref.xp), rel_err(a.bp, ref.bp)});
}

template <class T, class U>
void expect_grads_close(const Result<T>& a, const Result<U>& ref, double tol, const std::string& what) {
  for (int i = 0; i < kNumInputs; ++i)
    EXPECT_LE(rel_err(a.grads[i], ref.grads[i]), tol) << what << ": d" << kNames[i];
}

struct Shape {
  int64_t rank, P, N;
};

}  // namespace

TEST(Mamba3Core, ChunkedEqualsRecurrentSisoAndMimo) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (Shape s : {Shape{1, 3, 6}, Shape{2, 4, 6}, Shape{4, 3, 5}}) {
    Problem<double> p = make_problem(rng, 2, 37, 2, s.rank, s.P, s.N, 8);
    Result<double> rec = run(Algo::recurrent, p);
    for (int64_t block : {1, 2, 5, 8, 16, 64}) {
      p.d.block = block;
      Result<double> ch = run(Algo::chunked, p);
      const std::string what = "rank " + std::to_string(s.rank) + " block " + std::to_string(block);
      EXPECT_LE(worst_forward(ch, rec), 1e-12) << what;
      expect_grads_close(ch, rec, 1e-11, what);
    }
  }
}

TEST(Mamba3Core, SplitWithCarriedEdgeEqualsUnsplit) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int64_t rank : {1, 2}) {
    Problem<double> p = make_problem(rng, 2, 29, 2, rank, 3, 6, 8);
    for (Algo algo : {Algo::recurrent, Algo::chunked}) {
      Result<double> whole = run(algo, p);
      for (auto pieces : std::vector<std::vector<int64_t>>{
               {16, 13}, {1, 1, 1, 26}, {2, 2, 2, 2, 21}, {5, 1, 1, 12, 10}, std::vector<int64_t>(29, 1)}) {
        Result<double> split = run_pieces(algo, p, pieces);
        const std::string what = std::string(algo == Algo::chunked ? "chunked" : "recurrent") + " rank " +
                                 std::to_string(rank) + ", " + std::to_string(pieces.size()) + " pieces";
        EXPECT_LE(worst_forward(split, whole), 1e-12) << what;
        expect_grads_close(split, whole, 1e-11, what);
      }
    }
  }
}

TEST(Mamba3Core, BackwardMatchesFiniteDifferences) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int64_t rank : {1, 3}) {
    Problem<double> p = make_problem(rng, 2, 13, 2, rank, 3, 4, 5);
    for (Algo algo : {Algo::recurrent, Algo::chunked}) {
      Result<double> r = run(algo, p);
      // L = <y, dy> + <emitted edge, its gradient>
      auto loss = [&]() {
        Result<double> f = run(algo, p, false);
        double l = 0;
        for (size_t i = 0; i < f.y.size(); ++i) l += f.y[i] * p.dy[i];
        for (size_t i = 0; i < f.S.size(); ++i) l += f.S[i] * p.dS_out[i];
        for (size_t i = 0; i < f.xp.size(); ++i) l += f.xp[i] * p.dxp_out[i];
        for (size_t i = 0; i < f.bp.size(); ++i) l += f.bp[i] * p.dbp_out[i];
        return l;
      };
      for (int i = 0; i < kNumInputs; ++i) {
        // Errors relative to at least a tenth of the gradient's norm: a random direction nearly
        // orthogonal to the gradient would otherwise turn rounding into a large relative error.
        double norm2 = 0;
        for (double g : r.grads[i]) norm2 += g * g;
        const double err = stateflow::testing::fd_directional(loss, {&p.t[i]}, {&r.grads[i]}, rng, 2, 1e-5,
                                                              0.1 * std::sqrt(norm2));
        // Rounding and truncation measured up to 3.4e-7 on this bound's scale (seed
        // 5045123381189730333); a 1 % wrong gradient gives above 1e-4 (FiniteDifferencesFlagAWrongGradient).
        EXPECT_LE(err, 1e-6) << (algo == Algo::chunked ? "chunked" : "recurrent") << " rank " << rank << " d"
                             << kNames[i];
      }
    }
  }
}

TEST(Mamba3Core, FiniteDifferencesFlagAWrongGradient) {
  Rng rng(fresh_seed());
  Problem<double> p = make_problem(rng, 1, 9, 1, 1, 3, 4, 4);
  Result<double> r = run(Algo::chunked, p);
  auto loss = [&]() {
    Result<double> f = run(Algo::chunked, p, false);
    double l = 0;
    for (size_t i = 0; i < f.y.size(); ++i) l += f.y[i] * p.dy[i];
    return l;
  };
  std::vector<double> wrong = r.grads[5];  // dlam without the edge gradients: still one-sided, and off
  for (double& v : wrong) v *= 1.01;
  EXPECT_GT(stateflow::testing::fd_directional(loss, {&p.t[5]}, {&wrong}, rng, 2), 1e-4);
}

TEST(Mamba3Core, Float32TracksFloat64) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  Problem<double> p = make_problem(rng, 1, 100, 2, 2, 16, 16, 16);
  Result<double> ref = run(Algo::recurrent, p);
  Problem<float> pf = convert<float>(p);
  for (Algo algo : {Algo::recurrent, Algo::chunked}) {
    Result<float> r = run(algo, pf);
    EXPECT_LE(worst_forward(r, ref), 1e-4);
    expect_grads_close(r, ref, 1e-3, "float32");
  }
}

TEST(Mamba3Core, NullEdgesAreZeros) {
  Rng rng(fresh_seed());
  Problem<double> p = make_problem(rng, 2, 11, 2, 2, 3, 4, 4);
  for (int i = 7; i < kNumInputs; ++i) std::fill(p.t[i].begin(), p.t[i].end(), 0.0);
  std::fill(p.dS_out.begin(), p.dS_out.end(), 0.0);
  std::fill(p.dxp_out.begin(), p.dxp_out.end(), 0.0);
  std::fill(p.dbp_out.begin(), p.dbp_out.end(), 0.0);
  Result<double> zeros = run(Algo::chunked, p);
  Result<double> r;
  r.y.resize(p.dy.size()), r.S.resize(p.dS_out.size()), r.xp.resize(p.dxp_out.size()), r.bp.resize(p.dbp_out.size());
  r.grads.resize(kNumInputs);
  for (int i = 0; i < kNumInputs; ++i) r.grads[i].resize(p.t[i].size());
  auto& g = r.grads;
  const auto in = inputs_of(p);
  mamba3_chunk_forward(p.d, in, Mamba3Edge<double>{}, r.y.data(), {r.S.data(), r.xp.data(), r.bp.data()});
  mamba3_chunk_backward(p.d, in, Mamba3Edge<double>{}, p.dy.data(), Mamba3Edge<double>{},
                        {g[0].data(), g[1].data(), g[2].data(), g[3].data(), g[4].data(), g[5].data(), g[6].data()},
                        {g[7].data(), g[8].data(), g[9].data()});
  EXPECT_EQ(worst_forward(r, zeros), 0.0);
  expect_grads_close(r, zeros, 0.0, "null edges");
}

TEST(Mamba3Core, BadSizesAreErrors) {
  Problem<double> p;
  p.d = Mamba3Dims{1, 4, 1, 0, 3, 4, 8};
  std::vector<double> buf(64);
  Mamba3CoreInputs<double> in{buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), buf.data()};
  stateflow::testing::expect_error(
      [&] { mamba3_chunk_forward(p.d, in, {}, buf.data(), {buf.data(), buf.data(), buf.data()}); }, "rank");
  p.d.rank = 1, p.d.block = 0;
  stateflow::testing::expect_error(
      [&] { mamba3_chunk_forward(p.d, in, {}, buf.data(), {buf.data(), buf.data(), buf.data()}); }, "block");
}
