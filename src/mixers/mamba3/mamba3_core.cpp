// Mamba-3 core on the CPU (MATH.md 6.2-6.5). Every (batch, head) slice is processed on its
// own; the chunked form copies each sub-chunk's rows into contiguous tiles, one row per
// (token, rank), so the rank-R (MIMO) products are plain matrix products over L*R rows.
#include "mixers/mamba3/mamba3_core.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/gemm.h"

namespace stateflow {
namespace {

void check_dims(const Mamba3Dims& d) {
  SF_CHECK(d.batch >= 0 && d.len >= 0 && d.heads >= 0, "mamba3 core: negative size (batch ", d.batch, ", len ",
           d.len, ", heads ", d.heads, ")");
  SF_CHECK(d.rank >= 1 && d.P >= 1 && d.N >= 1, "mamba3 core: rank, P and N must be >= 1 (rank ", d.rank, ", P ",
           d.P, ", N ", d.N, ")");
  SF_CHECK(d.block >= 1, "mamba3 core: sub-chunk size block must be >= 1, got ", d.block);
}

// Index of the per-token scalar (b, t, h); rank rows of x/b/c start at that index times rank.
int64_t token_index(const Mamba3Dims& d, int64_t b, int64_t t, int64_t h) { return (b * d.len + t) * d.heads + h; }

// The edge tuple of one head in working buffers.
template <class T>
struct HeadEdge {
  std::vector<T> S, xp, bp;  // [P, N], [rank, P], [rank, N]
  explicit HeadEdge(const Mamba3Dims& d) : S(d.P * d.N), xp(d.rank * d.P), bp(d.rank * d.N) {}
};

template <class T>
void copy_or_zero(const T* src, int64_t n, T* dst) {
  if (src)
    std::copy_n(src, n, dst);
  else
    std::fill_n(dst, n, T(0));
}

template <class T>
void load_edge(const Mamba3Dims& d, const Mamba3Edge<T>& e, int64_t b, int64_t h, HeadEdge<T>& out) {
  const int64_t bh = b * d.heads + h;
  copy_or_zero(e.S ? e.S + bh * d.P * d.N : nullptr, d.P * d.N, out.S.data());
  copy_or_zero(e.x_prev ? e.x_prev + bh * d.rank * d.P : nullptr, d.rank * d.P, out.xp.data());
  copy_or_zero(e.b_prev ? e.b_prev + bh * d.rank * d.N : nullptr, d.rank * d.N, out.bp.data());
}

template <class T>
void store_edge(const Mamba3Dims& d, const HeadEdge<T>& e, int64_t b, int64_t h, const Mamba3EdgeOut<T>& out) {
  const int64_t bh = b * d.heads + h;
  std::copy(e.S.begin(), e.S.end(), out.S + bh * d.P * d.N);
  std::copy(e.xp.begin(), e.xp.end(), out.x_prev + bh * d.rank * d.P);
  std::copy(e.bp.begin(), e.bp.end(), out.b_prev + bh * d.rank * d.N);
}

// S += w * sum_r x[r] b[r]^T  (x [rank, P], b [rank, N], S [P, N])
template <class T>
void add_outer(const Mamba3Dims& d, T w, const T* x, const T* b, T* S) {
  for (int64_t r = 0; r < d.rank; ++r)
    for (int64_t p = 0; p < d.P; ++p) {
      const T xw = w * x[r * d.P + p];
      for (int64_t n = 0; n < d.N; ++n) S[p * d.N + n] += xw * b[r * d.N + n];
    }
}

// <S, sum_r x[r] b[r]^T>
template <class T>
T dot_outer(const Mamba3Dims& d, const T* S, const T* x, const T* b) {
  T acc = 0;
  for (int64_t r = 0; r < d.rank; ++r)
    for (int64_t p = 0; p < d.P; ++p) {
      T row = 0;
      for (int64_t n = 0; n < d.N; ++n) row += S[p * d.N + n] * b[r * d.N + n];
      acc += x[r * d.P + p] * row;
    }
  return acc;
}

// out[r] = w * M v[r] (M [P, N], v [rank, N], out [rank, P]);  outT: w * M^T u[r] (u [rank, P] -> [rank, N])
template <class T>
void state_times(const Mamba3Dims& d, T w, const T* M, const T* v, T* out) {
  gemm<T>(false, true, d.rank, d.P, d.N, w, v, d.N, M, d.N, T(0), out, d.P);
}
template <class T>
void state_t_times(const Mamba3Dims& d, T w, const T* M, const T* u, T* out) {
  gemm<T>(false, false, d.rank, d.N, d.P, w, u, d.P, M, d.N, T(0), out, d.N);
}

// ---------------------------------------------------------------------------------------
// token-by-token recurrence (the definition; MATH.md 6.2)
// ---------------------------------------------------------------------------------------

template <class T>
void step_scalars(T adt, T dt, T lam, T& alpha, T& beta, T& gamma) {
  alpha = std::exp(adt);
  beta = (T(1) - lam) * dt * alpha;
  gamma = lam * dt;
}

// ---------------------------------------------------------------------------------------
// chunked form: one sub-chunk ("block") of one head at a time (MATH.md 6.4, 6.5)
// ---------------------------------------------------------------------------------------

// A head's tokens [start, start+L) copied into tiles with one row per (token, rank).
template <class T>
struct Block {
  int64_t start = 0, L = 0, m = 0;  // first token, tokens, rows (L * rank)
  std::vector<T> x, b, c;           // [m, P], [m, N], [m, N]
  std::vector<T> adt, dt, lam;      // [L]
};

template <class T>
void load_block(const Mamba3Dims& d, const Mamba3CoreInputs<T>& in, int64_t b, int64_t h, int64_t start, int64_t L,
                Block<T>& blk) {
  const int64_t R = d.rank;
  blk.start = start, blk.L = L, blk.m = L * R;
  blk.x.resize(blk.m * d.P), blk.b.resize(blk.m * d.N), blk.c.resize(blk.m * d.N);
  blk.adt.resize(L), blk.dt.resize(L), blk.lam.resize(L);
  for (int64_t t = 0; t < L; ++t) {
    const int64_t i = token_index(d, b, start + t, h);
    std::copy_n(in.x + i * R * d.P, R * d.P, blk.x.data() + t * R * d.P);
    std::copy_n(in.b + i * R * d.N, R * d.N, blk.b.data() + t * R * d.N);
    std::copy_n(in.c + i * R * d.N, R * d.N, blk.c.data() + t * R * d.N);
    blk.adt[t] = in.adt[i], blk.dt[t] = in.dt[i], blk.lam[t] = in.lam[i];
  }
}

// Rows of a tile back to a [batch, len, heads, rank, width] tensor.
template <class T>
void store_rows(const Mamba3Dims& d, const T* tile, int64_t b, int64_t h, int64_t start, int64_t L, int64_t width,
                T* dst) {
  const int64_t n = d.rank * width;
  for (int64_t t = 0; t < L; ++t) std::copy_n(tile + t * n, n, dst + token_index(d, b, start + t, h) * n);
}

// The block's scalars: local cumulative log decay, the decay matrix Lam[r,s] = exp(Acum_r -
// Acum_s), the write weights w (gamma_s, plus bp_{s+1} for rows after s, since token s is
// also written by step s+1's trapezoid term) and E = Lam * w, all for s <= r.
template <class T>
struct BlockTerms {
  std::vector<T> acum, eA, bprime, gamma, Lam, w, E;  // [L] x4, [L, L] x3
  void compute(const Block<T>& blk) {
    const int64_t L = blk.L;
    acum.resize(L), eA.resize(L), bprime.resize(L), gamma.resize(L);
    T run = 0;
    for (int64_t t = 0; t < L; ++t) {
      run += blk.adt[t];
      acum[t] = run, eA[t] = std::exp(run);
      bprime[t] = (T(1) - blk.lam[t]) * blk.dt[t];
      gamma[t] = blk.lam[t] * blk.dt[t];
    }
    Lam.assign(L * L, T(0)), w.assign(L * L, T(0)), E.assign(L * L, T(0));
    for (int64_t r = 0; r < L; ++r)
      for (int64_t s = 0; s <= r; ++s) {
        Lam[r * L + s] = std::exp(acum[r] - acum[s]);
        w[r * L + s] = gamma[s] + (s < r ? bprime[s + 1] : T(0));
        E[r * L + s] = Lam[r * L + s] * w[r * L + s];
      }
  }
};

// Scratch of one head's block computations.
template <class T>
struct BlockScratch {
  BlockTerms<T> terms;
  std::vector<T> Stil, G, Mm, tmp, fb;
};

// S~ = S + bp_1 sum_r x_prev[r] b_prev[r]^T: the previous token's trapezoid term, which the
// emitted state leaves out (its weight needs this block's first dt and lam).
template <class T>
void fold_previous(const Mamba3Dims& d, const HeadEdge<T>& e, T bprime0, std::vector<T>& Stil) {
  Stil = e.S;
  add_outer(d, bprime0, e.xp.data(), e.bp.data(), Stil.data());
}

// G = C B^T over the block's rows, and the masked weights Mm = G * E[token(i), token(j)].
template <class T>
void intra_weights(const Mamba3Dims& d, const Block<T>& blk, BlockScratch<T>& ws) {
  const int64_t m = blk.m, R = d.rank, L = blk.L;
  ws.G.resize(m * m), ws.Mm.resize(m * m);
  gemm<T>(false, true, m, m, d.N, T(1), blk.c.data(), d.N, blk.b.data(), d.N, T(0), ws.G.data(), m);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < m; ++j)
      ws.Mm[i * m + j] = j / R <= i / R ? ws.G[i * m + j] * ws.terms.E[(i / R) * L + j / R] : T(0);
}

// Forward of one block: y tile [m, P]; the edge advances to the block's end.
template <class T>
void block_forward(const Mamba3Dims& d, const Block<T>& blk, T D, HeadEdge<T>& e, T* y, BlockScratch<T>& ws) {
  const int64_t m = blk.m, L = blk.L, R = d.rank, P = d.P, N = d.N;
  BlockTerms<T>& tm = ws.terms;
  tm.compute(blk);
  fold_previous(d, e, tm.bprime[0], ws.Stil);
  intra_weights(d, blk, ws);
  // intra: y = Mm x; inter: y += exp(Acum_r) c_r S~^T; skip: y += D x
  gemm<T>(false, false, m, P, m, T(1), ws.Mm.data(), m, blk.x.data(), P, T(0), y, P);
  ws.tmp.resize(m * P);
  gemm<T>(false, true, m, P, N, T(1), blk.c.data(), N, ws.Stil.data(), N, T(0), ws.tmp.data(), P);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < P; ++p) y[i * P + p] += tm.eA[i / R] * ws.tmp[i * P + p] + D * blk.x[i * P + p];
  // leaving state: exp(Acum_L) S~ + sum_s E[L,s] x_s^T b_s
  ws.fb.resize(m * N);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t n = 0; n < N; ++n) ws.fb[i * N + n] = tm.E[(L - 1) * L + i / R] * blk.b[i * N + n];
  const T eL = tm.eA[L - 1];
  for (int64_t k = 0; k < P * N; ++k) e.S[k] = eL * ws.Stil[k];
  gemm<T>(true, false, P, N, m, T(1), blk.x.data(), P, ws.fb.data(), N, T(1), e.S.data(), N);
  std::copy_n(blk.x.data() + (L - 1) * R * P, R * P, e.xp.data());
  std::copy_n(blk.b.data() + (L - 1) * R * N, R * N, e.bp.data());
}

// Gradient tiles of one block.
template <class T>
struct BlockGrads {
  std::vector<T> x, b, c;       // [m, P], [m, N], [m, N]
  std::vector<T> adt, dt, lam;  // [L]
  T D = 0;
};

// Backward of one block. `e` is the edge that entered the block; `de` holds the gradient of
// the edge the block emitted and is replaced by the gradient of the edge that entered it.
template <class T>
void block_backward(const Mamba3Dims& d, const Block<T>& blk, T D, const HeadEdge<T>& e, const T* dy,
                    HeadEdge<T>& de, BlockGrads<T>& g, BlockScratch<T>& ws) {
  const int64_t m = blk.m, L = blk.L, R = d.rank, P = d.P, N = d.N;
  BlockTerms<T>& tm = ws.terms;
  tm.compute(blk);
  fold_previous(d, e, tm.bprime[0], ws.Stil);
  intra_weights(d, blk, ws);

  g.x.assign(m * P, T(0)), g.b.assign(m * N, T(0)), g.c.assign(m * N, T(0));
  g.D = 0;
  for (int64_t k = 0; k < m * P; ++k) g.x[k] = D * dy[k], g.D += dy[k] * blk.x[k];
  // the emitted x_prev, b_prev are the last token's x and b
  for (int64_t k = 0; k < R * P; ++k) g.x[(L - 1) * R * P + k] += de.xp[k];
  for (int64_t k = 0; k < R * N; ++k) g.b[(L - 1) * R * N + k] += de.bp[k];
  std::vector<T> dE(L * L, T(0)), dAcum(L, T(0));

  // intra: y_i = sum_j G[i,j] E[ti,tj] x_j
  std::vector<T> dM(m * m), dGm(m * m);
  gemm<T>(false, true, m, m, P, T(1), dy, P, blk.x.data(), P, T(0), dM.data(), m);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < m; ++j) {
      const int64_t ti = i / R, tj = j / R;
      if (tj > ti) {
        dGm[i * m + j] = 0;
        continue;
      }
      dE[ti * L + tj] += dM[i * m + j] * ws.G[i * m + j];
      dGm[i * m + j] = dM[i * m + j] * tm.E[ti * L + tj];
    }
  gemm<T>(false, false, m, N, m, T(1), dGm.data(), m, blk.b.data(), N, T(1), g.c.data(), N);
  gemm<T>(true, false, m, N, m, T(1), dGm.data(), m, blk.c.data(), N, T(1), g.b.data(), N);
  gemm<T>(true, false, m, P, m, T(1), ws.Mm.data(), m, dy, P, T(1), g.x.data(), P);

  // inter: y_i += exp(Acum_ti) c_i S~^T
  ws.tmp.resize(m * P);
  gemm<T>(false, true, m, P, N, T(1), blk.c.data(), N, ws.Stil.data(), N, T(0), ws.tmp.data(), P);
  std::vector<T> dys(m * P), dStil(P * N);
  for (int64_t i = 0; i < m; ++i) {
    T acc = 0;
    for (int64_t p = 0; p < P; ++p) {
      acc += dy[i * P + p] * ws.tmp[i * P + p];
      dys[i * P + p] = tm.eA[i / R] * dy[i * P + p];
    }
    dAcum[i / R] += tm.eA[i / R] * acc;
  }
  gemm<T>(true, false, P, N, m, T(1), dys.data(), P, blk.c.data(), N, T(0), dStil.data(), N);
  gemm<T>(false, false, m, N, P, T(1), dys.data(), P, ws.Stil.data(), N, T(1), g.c.data(), N);

  // leaving state: S_out = exp(Acum_L) S~ + sum_j E[L,tj] x_j^T b_j
  const T eL = tm.eA[L - 1];
  T dot_out = 0;
  for (int64_t k = 0; k < P * N; ++k) {
    dot_out += de.S[k] * ws.Stil[k];
    dStil[k] += eL * de.S[k];
  }
  dAcum[L - 1] += eL * dot_out;
  std::vector<T> q(m * std::max(P, N));
  gemm<T>(false, true, m, P, N, T(1), blk.b.data(), N, de.S.data(), N, T(0), q.data(), P);  // dS_out b_j
  for (int64_t i = 0; i < m; ++i) {
    const T f = tm.E[(L - 1) * L + i / R];
    T acc = 0;
    for (int64_t p = 0; p < P; ++p) {
      acc += blk.x[i * P + p] * q[i * P + p];
      g.x[i * P + p] += f * q[i * P + p];
    }
    dE[(L - 1) * L + i / R] += acc;
  }
  gemm<T>(false, false, m, N, P, T(1), blk.x.data(), P, de.S.data(), N, T(0), q.data(), N);  // dS_out^T x_j
  for (int64_t i = 0; i < m; ++i)
    for (int64_t n = 0; n < N; ++n) g.b[i * N + n] += tm.E[(L - 1) * L + i / R] * q[i * N + n];

  // E = Lam * w, Lam[r,s] = exp(Acum_r - Acum_s), w[r,s] = gamma_s + bp_{s+1} (s < r)
  std::vector<T> dgamma(L, T(0)), dbprime(L, T(0));
  for (int64_t r = 0; r < L; ++r)
    for (int64_t s = 0; s <= r; ++s) {
      const T dLam_Lam = dE[r * L + s] * tm.w[r * L + s] * tm.Lam[r * L + s];
      const T dw = dE[r * L + s] * tm.Lam[r * L + s];
      dAcum[r] += dLam_Lam, dAcum[s] -= dLam_Lam;
      dgamma[s] += dw;
      if (s < r) dbprime[s + 1] += dw;
    }

  // fold of the previous token: S~ = S + bp_1 x_prev^T b_prev
  dbprime[0] += dot_outer(d, dStil.data(), e.xp.data(), e.bp.data());
  state_t_times(d, tm.bprime[0], dStil.data(), e.xp.data(), de.bp.data());
  state_times(d, tm.bprime[0], dStil.data(), e.bp.data(), de.xp.data());
  de.S = dStil;

  // per-token scalars: Acum is a cumulative sum of adt
  g.adt.resize(L), g.dt.resize(L), g.lam.resize(L);
  T suffix = 0;
  for (int64_t t = L - 1; t >= 0; --t) {
    suffix += dAcum[t];
    g.adt[t] = suffix;
    g.lam[t] = (dgamma[t] - dbprime[t]) * blk.dt[t];
    g.dt[t] = dgamma[t] * blk.lam[t] + dbprime[t] * (T(1) - blk.lam[t]);
  }
}

template <class T>
void zero_grads(const Mamba3Dims& d, const Mamba3CoreGrads<T>& g) {
  const int64_t tokens = d.batch * d.len * d.heads;
  std::fill_n(g.x, tokens * d.rank * d.P, T(0));
  std::fill_n(g.b, tokens * d.rank * d.N, T(0));
  std::fill_n(g.c, tokens * d.rank * d.N, T(0));
  std::fill_n(g.adt, tokens, T(0));
  std::fill_n(g.dt, tokens, T(0));
  std::fill_n(g.lam, tokens, T(0));
  std::fill_n(g.D, d.heads, T(0));
}

}  // namespace

template <class T>
void mamba3_recurrent_forward(const Mamba3Dims& d, const Mamba3CoreInputs<T>& in, const Mamba3Edge<T>& edge_in,
                              T* y, const Mamba3EdgeOut<T>& edge_out) {
  check_dims(d);
  const int64_t R = d.rank, P = d.P, N = d.N;
  HeadEdge<T> e(d);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      load_edge(d, edge_in, b, h, e);
      for (int64_t t = 0; t < d.len; ++t) {
        const int64_t i = token_index(d, b, t, h);
        const T* xt = in.x + i * R * P;
        const T* bt = in.b + i * R * N;
        T alpha, beta, gamma;
        step_scalars(in.adt[i], in.dt[i], in.lam[i], alpha, beta, gamma);
        for (T& s : e.S) s *= alpha;
        add_outer(d, beta, e.xp.data(), e.bp.data(), e.S.data());
        add_outer(d, gamma, xt, bt, e.S.data());
        T* yt = y + i * R * P;
        state_times(d, T(1), e.S.data(), in.c + i * R * N, yt);
        for (int64_t k = 0; k < R * P; ++k) yt[k] += in.D[h] * xt[k];
        std::copy_n(xt, R * P, e.xp.data());
        std::copy_n(bt, R * N, e.bp.data());
      }
      store_edge(d, e, b, h, edge_out);
    }
}

template <class T>
void mamba3_recurrent_backward(const Mamba3Dims& d, const Mamba3CoreInputs<T>& in, const Mamba3Edge<T>& edge_in,
                               const T* dy, const Mamba3Edge<T>& dedge_out, const Mamba3CoreGrads<T>& g,
                               const Mamba3EdgeOut<T>& dedge_in) {
  check_dims(d);
  zero_grads(d, g);
  const int64_t R = d.rank, P = d.P, N = d.N, ns = P * N;
  HeadEdge<T> e(d), de(d);
  std::vector<T> states((d.len + 1) * ns), tmp(R * std::max(P, N));
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      // states[t] = state before token t
      load_edge(d, edge_in, b, h, e);
      std::copy(e.S.begin(), e.S.end(), states.begin());
      for (int64_t t = 0; t < d.len; ++t) {
        const int64_t i = token_index(d, b, t, h);
        const T* xp = t ? in.x + (i - d.heads) * R * P : e.xp.data();
        const T* bp = t ? in.b + (i - d.heads) * R * N : e.bp.data();
        T alpha, beta, gamma;
        step_scalars(in.adt[i], in.dt[i], in.lam[i], alpha, beta, gamma);
        T* S = states.data() + (t + 1) * ns;
        for (int64_t k = 0; k < ns; ++k) S[k] = alpha * S[k - ns];
        add_outer(d, beta, xp, bp, S);
        add_outer(d, gamma, in.x + i * R * P, in.b + i * R * N, S);
      }
      load_edge(d, dedge_out, b, h, de);
      if (d.len > 0) {
        const int64_t last = token_index(d, b, d.len - 1, h);
        for (int64_t k = 0; k < R * P; ++k) g.x[last * R * P + k] += de.xp[k];
        for (int64_t k = 0; k < R * N; ++k) g.b[last * R * N + k] += de.bp[k];
        std::fill(de.xp.begin(), de.xp.end(), T(0));
        std::fill(de.bp.begin(), de.bp.end(), T(0));
      }
      std::vector<T>& dS = de.S;
      for (int64_t t = d.len - 1; t >= 0; --t) {
        const int64_t i = token_index(d, b, t, h);
        const T* xt = in.x + i * R * P;
        const T* bt = in.b + i * R * N;
        const T* ct = in.c + i * R * N;
        const T* dyt = dy + i * R * P;
        const T* xp = t ? in.x + (i - d.heads) * R * P : e.xp.data();
        const T* bp = t ? in.b + (i - d.heads) * R * N : e.bp.data();
        T* dxp = t ? g.x + (i - d.heads) * R * P : de.xp.data();
        T* dbp = t ? g.b + (i - d.heads) * R * N : de.bp.data();
        T alpha, beta, gamma;
        step_scalars(in.adt[i], in.dt[i], in.lam[i], alpha, beta, gamma);
        // y_t[r] = S_t c_t[r] + D x_t[r]
        add_outer(d, T(1), dyt, ct, dS.data());
        state_t_times(d, T(1), states.data() + (t + 1) * ns, dyt, g.c + i * R * N);
        for (int64_t k = 0; k < R * P; ++k) g.x[i * R * P + k] += in.D[h] * dyt[k], g.D[h] += dyt[k] * xt[k];
        // S_t = alpha S_{t-1} + beta x_prev b_prev^T + gamma x_t b_t^T
        state_times(d, gamma, dS.data(), bt, tmp.data());
        for (int64_t k = 0; k < R * P; ++k) g.x[i * R * P + k] += tmp[k];
        state_t_times(d, gamma, dS.data(), xt, tmp.data());
        for (int64_t k = 0; k < R * N; ++k) g.b[i * R * N + k] += tmp[k];
        state_times(d, beta, dS.data(), bp, tmp.data());
        for (int64_t k = 0; k < R * P; ++k) dxp[k] += tmp[k];
        state_t_times(d, beta, dS.data(), xp, tmp.data());
        for (int64_t k = 0; k < R * N; ++k) dbp[k] += tmp[k];
        const T dgamma = dot_outer(d, dS.data(), xt, bt);
        const T dbeta = dot_outer(d, dS.data(), xp, bp);
        T dalpha = dbeta * (T(1) - in.lam[i]) * in.dt[i];
        for (int64_t k = 0; k < ns; ++k) dalpha += dS[k] * states[t * ns + k];
        g.lam[i] = dgamma * in.dt[i] - dbeta * in.dt[i] * alpha;
        g.dt[i] = dgamma * in.lam[i] + dbeta * (T(1) - in.lam[i]) * alpha;
        g.adt[i] = dalpha * alpha;
        for (T& s : dS) s *= alpha;
      }
      store_edge(d, de, b, h, dedge_in);
    }
}

template <class T>
void mamba3_chunk_forward(const Mamba3Dims& d, const Mamba3CoreInputs<T>& in, const Mamba3Edge<T>& edge_in, T* y,
                          const Mamba3EdgeOut<T>& edge_out) {
  check_dims(d);
  const int64_t P = d.P;
  HeadEdge<T> e(d);
  Block<T> blk;
  BlockScratch<T> ws;
  std::vector<T> ytile;
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      load_edge(d, edge_in, b, h, e);
      for (int64_t start = 0; start < d.len; start += d.block) {
        load_block(d, in, b, h, start, std::min(d.block, d.len - start), blk);
        ytile.resize(blk.m * P);
        block_forward(d, blk, in.D[h], e, ytile.data(), ws);
        store_rows(d, ytile.data(), b, h, start, blk.L, P, y);
      }
      store_edge(d, e, b, h, edge_out);
    }
}

template <class T>
void mamba3_chunk_backward(const Mamba3Dims& d, const Mamba3CoreInputs<T>& in, const Mamba3Edge<T>& edge_in,
                           const T* dy, const Mamba3Edge<T>& dedge_out, const Mamba3CoreGrads<T>& g,
                           const Mamba3EdgeOut<T>& dedge_in) {
  check_dims(d);
  zero_grads(d, g);
  const int64_t R = d.rank, P = d.P, n_blocks = (d.len + d.block - 1) / d.block;
  Block<T> blk;
  BlockScratch<T> ws;
  BlockGrads<T> bg;
  std::vector<T> ytile, dytile;
  std::vector<HeadEdge<T>> entering(n_blocks, HeadEdge<T>(d));
  HeadEdge<T> de(d);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      // recompute the edge entering every block, then sweep the blocks in reverse
      HeadEdge<T> e(d);
      load_edge(d, edge_in, b, h, e);
      for (int64_t n = 0; n < n_blocks; ++n) {
        entering[n] = e;
        load_block(d, in, b, h, n * d.block, std::min(d.block, d.len - n * d.block), blk);
        ytile.resize(blk.m * P);
        block_forward(d, blk, in.D[h], e, ytile.data(), ws);
      }
      load_edge(d, dedge_out, b, h, de);
      for (int64_t n = n_blocks - 1; n >= 0; --n) {
        const int64_t start = n * d.block;
        load_block(d, in, b, h, start, std::min(d.block, d.len - start), blk);
        dytile.resize(blk.m * P);
        for (int64_t t = 0; t < blk.L; ++t)
          std::copy_n(dy + token_index(d, b, start + t, h) * R * P, R * P, dytile.data() + t * R * P);
        block_backward(d, blk, in.D[h], entering[n], dytile.data(), de, bg, ws);
        store_rows(d, bg.x.data(), b, h, start, blk.L, P, g.x);
        store_rows(d, bg.b.data(), b, h, start, blk.L, d.N, g.b);
        store_rows(d, bg.c.data(), b, h, start, blk.L, d.N, g.c);
        for (int64_t t = 0; t < blk.L; ++t) {
          const int64_t i = token_index(d, b, start + t, h);
          g.adt[i] = bg.adt[t], g.dt[i] = bg.dt[t], g.lam[i] = bg.lam[t];
        }
        g.D[h] += bg.D;
      }
      store_edge(d, de, b, h, dedge_in);
    }
}

#define SF_INSTANTIATE(T)                                                                                        \
  template void mamba3_recurrent_forward<T>(const Mamba3Dims&, const Mamba3CoreInputs<T>&, const Mamba3Edge<T>&, \
                                            T*, const Mamba3EdgeOut<T>&);                                        \
  template void mamba3_recurrent_backward<T>(const Mamba3Dims&, const Mamba3CoreInputs<T>&,                     \
                                             const Mamba3Edge<T>&, const T*, const Mamba3Edge<T>&,              \
                                             const Mamba3CoreGrads<T>&, const Mamba3EdgeOut<T>&);                \
  template void mamba3_chunk_forward<T>(const Mamba3Dims&, const Mamba3CoreInputs<T>&, const Mamba3Edge<T>&, T*, \
                                        const Mamba3EdgeOut<T>&);                                                \
  template void mamba3_chunk_backward<T>(const Mamba3Dims&, const Mamba3CoreInputs<T>&, const Mamba3Edge<T>&,   \
                                         const T*, const Mamba3Edge<T>&, const Mamba3CoreGrads<T>&,              \
                                         const Mamba3EdgeOut<T>&);
SF_INSTANTIATE(float)
SF_INSTANTIATE(double)
#undef SF_INSTANTIATE

}  // namespace stateflow
