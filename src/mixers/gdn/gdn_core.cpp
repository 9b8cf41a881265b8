// Gated DeltaNet core on the CPU (MATH.md sections 2-4). Every (batch, head) slice is
// processed on its own; the chunkwise algorithm copies each sub-chunk's rows into
// contiguous tiles so a sub-chunk is computed identically whatever its absolute position
// (which makes C-aligned StateFlow splits bitwise equal to unsplit runs).
#include "mixers/gdn/gdn_core.h"

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__SSE2__)
#include <pmmintrin.h>
#endif

#include "core/error.h"
#include "kernels/cpu/gemm.h"

namespace stateflow {
namespace {

// ---------------------------------------------------------------------------------------
// helpers
// ---------------------------------------------------------------------------------------

// BLAS call overhead (~150 ns) dominates only tiny products: measured with OpenBLAS 0.3.21,
// the plain loop wins below ~500 multiply-adds and loses 2-10x above. The choice depends
// only on the shape, so results stay deterministic.
constexpr int64_t kBlasMinMacs = 512;

template <class T>
void tile_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
               int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M * N * K >= kBlasMinMacs)
    gemm<T>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  else
    gemm_reference<T>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// A strongly decaying head drives exp(G_r - G_c), and products of such factors, into float
// denormals, which cost tens of cycles per operation on x86 (measured: the float32 chunk
// kernels ran 20-30% slower with the oracle's gate init at dk = 64, C = 64). They carry
// nothing above 1e-38, so the chunk kernels flush them to zero while they run.
class FlushDenormalsScope {
 public:
#if defined(__SSE2__)
  FlushDenormalsScope() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | _MM_FLUSH_ZERO_MASK | _MM_DENORMALS_ZERO_MASK); }
  ~FlushDenormalsScope() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#endif
};

template <class T>
T dot(const T* a, const T* b, int64_t n) {
  T acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

void check_dims(const GdnDims& d) {
  SF_CHECK(d.batch >= 0 && d.len >= 0 && d.heads >= 0, "gdn core: negative size (batch ", d.batch, ", len ", d.len,
           ", heads ", d.heads, ")");
  SF_CHECK(d.dk >= 1 && d.dv >= 1, "gdn core: head sizes must be >= 1 (dk ", d.dk, ", dv ", d.dv, ")");
  SF_CHECK(d.block >= 1, "gdn core: sub-chunk size block must be >= 1, got ", d.block);
}

// Offset of row (b, t, h) in a [batch, len, heads, width] tensor.
int64_t row_offset(const GdnDims& d, int64_t b, int64_t t, int64_t h, int64_t width) {
  return ((b * d.len + t) * d.heads + h) * width;
}

// Copy rows [start, start+n) of head (b, h) into a contiguous n x width tile, and back.
template <class T>
void load_rows(const GdnDims& d, const T* src, int64_t b, int64_t h, int64_t start, int64_t n, int64_t width,
               T* tile) {
  for (int64_t r = 0; r < n; ++r) std::copy_n(src + row_offset(d, b, start + r, h, width), width, tile + r * width);
}

template <class T>
void store_rows(const GdnDims& d, const T* tile, int64_t b, int64_t h, int64_t start, int64_t n, int64_t width,
                T* dst) {
  for (int64_t r = 0; r < n; ++r) std::copy_n(tile + r * width, width, dst + row_offset(d, b, start + r, h, width));
}

// The state of head (b, h), or zeros when the caller passed nullptr.
template <class T>
void load_state(const GdnDims& d, const T* S, int64_t b, int64_t h, T* out) {
  const int64_t n = d.dv * d.dk;
  if (S)
    std::copy_n(S + (b * d.heads + h) * n, n, out);
  else
    std::fill_n(out, n, T(0));
}

template <class T>
T* state_at(const GdnDims& d, T* S, int64_t b, int64_t h) {
  return S + (b * d.heads + h) * d.dv * d.dk;
}

// ---------------------------------------------------------------------------------------
// token-by-token recurrence (the definition; MATH.md section 2)
// ---------------------------------------------------------------------------------------

// One step: S <- exp(g) S (I - beta k k^T) + beta v k^T, in the step form
// S' = exp(g) S, u = beta (v - S' k), S <- S' + u k^T.
template <class T>
void recurrent_step(const GdnDims& d, const T* k, const T* v, T beta, T g, T* S) {
  const T decay = std::exp(g);
  for (int64_t i = 0; i < d.dv * d.dk; ++i) S[i] *= decay;
  for (int64_t i = 0; i < d.dv; ++i) {
    const T u = beta * (v[i] - dot(S + i * d.dk, k, d.dk));
    for (int64_t j = 0; j < d.dk; ++j) S[i * d.dk + j] += u * k[j];
  }
}

}  // namespace

template <class T>
void gdn_recurrent_forward(const GdnDims& d, const T* q, const T* k, const T* v, const T* beta, const T* g,
                           const T* S_in, T* o, T* S_out) {
  check_dims(d);
  std::vector<T> S(d.dv * d.dk);
  const T scale = T(d.scale);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      load_state(d, S_in, b, h, S.data());
      for (int64_t t = 0; t < d.len; ++t) {
        const int64_t s_idx = row_offset(d, b, t, h, 1);
        recurrent_step(d, k + row_offset(d, b, t, h, d.dk), v + row_offset(d, b, t, h, d.dv), beta[s_idx], g[s_idx],
                       S.data());
        const T* qt = q + row_offset(d, b, t, h, d.dk);
        T* ot = o + row_offset(d, b, t, h, d.dv);
        for (int64_t i = 0; i < d.dv; ++i) ot[i] = scale * dot(S.data() + i * d.dk, qt, d.dk);
      }
      std::copy(S.begin(), S.end(), state_at(d, S_out, b, h));
    }
}

template <class T>
void gdn_recurrent_backward(const GdnDims& d, const T* q, const T* k, const T* v, const T* beta, const T* g,
                            const T* S_in, const T* dO, const T* dS_out, T* dq, T* dk, T* dv, T* dbeta, T* dg,
                            T* dS_in) {
  check_dims(d);
  const int64_t ns = d.dv * d.dk;
  const T scale = T(d.scale);
  std::vector<T> states((d.len + 1) * ns);  // states[t] = state before token t
  std::vector<T> dS(ns), Sd(ns), du(d.dv), resid(d.dv), u(d.dv);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      load_state(d, S_in, b, h, states.data());
      for (int64_t t = 0; t < d.len; ++t) {
        std::copy_n(states.data() + t * ns, ns, states.data() + (t + 1) * ns);
        const int64_t s_idx = row_offset(d, b, t, h, 1);
        recurrent_step(d, k + row_offset(d, b, t, h, d.dk), v + row_offset(d, b, t, h, d.dv), beta[s_idx], g[s_idx],
                       states.data() + (t + 1) * ns);
      }
      load_state(d, dS_out, b, h, dS.data());
      for (int64_t t = d.len - 1; t >= 0; --t) {
        const int64_t s_idx = row_offset(d, b, t, h, 1);
        const T* qt = q + row_offset(d, b, t, h, d.dk);
        const T* kt = k + row_offset(d, b, t, h, d.dk);
        const T* vt = v + row_offset(d, b, t, h, d.dv);
        const T* dOt = dO + row_offset(d, b, t, h, d.dv);
        T* dqt = dq + row_offset(d, b, t, h, d.dk);
        T* dkt = dk + row_offset(d, b, t, h, d.dk);
        T* dvt = dv + row_offset(d, b, t, h, d.dv);
        const T bt = beta[s_idx], decay = std::exp(g[s_idx]);
        const T* S_prev = states.data() + t * ns;
        const T* S_next = states.data() + (t + 1) * ns;
        // Sd = decayed state S', resid = v - S' k, u = beta resid
        for (int64_t i = 0; i < ns; ++i) Sd[i] = decay * S_prev[i];
        for (int64_t i = 0; i < d.dv; ++i) {
          resid[i] = vt[i] - dot(Sd.data() + i * d.dk, kt, d.dk);
          u[i] = bt * resid[i];
        }
        // o_t = s S_t q_t
        for (int64_t i = 0; i < d.dv; ++i)
          for (int64_t j = 0; j < d.dk; ++j) dS[i * d.dk + j] += scale * dOt[i] * qt[j];
        for (int64_t j = 0; j < d.dk; ++j) {
          T acc = 0;
          for (int64_t i = 0; i < d.dv; ++i) acc += S_next[i * d.dk + j] * dOt[i];
          dqt[j] = scale * acc;
        }
        // S_t = S' + u k^T
        T dbeta_t = 0;
        for (int64_t i = 0; i < d.dv; ++i) {
          du[i] = dot(dS.data() + i * d.dk, kt, d.dk);
          dvt[i] = bt * du[i];
          dbeta_t += du[i] * resid[i];
        }
        dbeta[s_idx] = dbeta_t;
        for (int64_t j = 0; j < d.dk; ++j) {
          T acc = 0;
          for (int64_t i = 0; i < d.dv; ++i) acc += dS[i * d.dk + j] * u[i] - bt * Sd[i * d.dk + j] * du[i];
          dkt[j] = acc;
        }
        // u = beta (v - S' k) feeds back into S'; then S' = exp(g) S_{t-1}
        T dg_t = 0;
        for (int64_t i = 0; i < d.dv; ++i)
          for (int64_t j = 0; j < d.dk; ++j) {
            T& x = dS[i * d.dk + j];
            x -= bt * du[i] * kt[j];
            dg_t += x * Sd[i * d.dk + j];
            x *= decay;
          }
        dg[s_idx] = dg_t;
      }
      std::copy(dS.begin(), dS.end(), state_at(d, dS_in, b, h));
    }
}

namespace {

// ---------------------------------------------------------------------------------------
// chunkwise WY algorithm (MATH.md section 3): one sub-chunk of L <= C tokens
// ---------------------------------------------------------------------------------------

// Everything the forward computes for one sub-chunk; the backward keeps one per sub-chunk.
// Row-major tiles; L x L matrices use row stride L.
template <class T>
struct SubChunk {
  int64_t start = 0, L = 0;
  std::vector<T> q, k, v, beta;      // the sub-chunk's inputs
  std::vector<T> G, gamma, e;        // G_r = g_1+..+g_r, gamma_r = exp(G_r), e_r = exp(G_L - G_r)
  std::vector<T> Gam, KK, A, Tinv;   // Gam[r,c] = exp(G_r - G_c) (c <= r), K K^T, A, (I + A)^-1
  std::vector<T> P;                  // s (Q K^T) ⊙ Gam, causal incl. diagonal (Out's state-free part)
  std::vector<T> Kb, Vb, W, U, Ke;   // diag(beta gamma) K, diag(beta) V, T Kb, T Vb, diag(e) K
  std::vector<T> Vn, S;              // V_new, and the state entering the sub-chunk (dv x dk)

  SubChunk(const GdnDims& d, int64_t C)
      : q(C * d.dk), k(C * d.dk), v(C * d.dv), beta(C), G(C), gamma(C), e(C), Gam(C * C), KK(C * C), A(C * C),
        Tinv(C * C), P(C * C), Kb(C * d.dk), Vb(C * d.dv), W(C * d.dk), U(C * d.dv), Ke(C * d.dk), Vn(C * d.dv),
        S(d.dv * d.dk) {}
};

template <class T>
void load_sub_chunk(const GdnDims& d, int64_t b, int64_t h, int64_t start, int64_t L, const T* q, const T* k,
                    const T* v, const T* beta, const T* g, SubChunk<T>& s) {
  s.start = start;
  s.L = L;
  load_rows(d, q, b, h, start, L, d.dk, s.q.data());
  load_rows(d, k, b, h, start, L, d.dk, s.k.data());
  load_rows(d, v, b, h, start, L, d.dv, s.v.data());
  load_rows(d, beta, b, h, start, L, int64_t(1), s.beta.data());
  load_rows(d, g, b, h, start, L, int64_t(1), s.G.data());  // cumsum'd in place by stage_pre
}

// T = (I + A)^-1 for strictly lower A, by forward substitution:
// row r of T = e_r^T - sum_{c<r} A[r,c] (row c of T).
template <class T>
void unit_lower_inverse(const T* A, int64_t L, T* Tinv) {
  std::fill_n(Tinv, L * L, T(0));
  for (int64_t r = 0; r < L; ++r) {
    T* row = Tinv + r * L;
    row[r] = 1;
    for (int64_t c = 0; c < r; ++c) {
      const T a = A[r * L + c];
      for (int64_t j = 0; j <= c; ++j) row[j] -= a * Tinv[c * L + j];
    }
  }
}

// Pre: everything that needs no state (decays, A, T, W, U, and Out's score matrix P).
template <class T>
void stage_pre(const GdnDims& d, SubChunk<T>& s) {
  const int64_t L = s.L, dk = d.dk, dv = d.dv;
  for (int64_t r = 1; r < L; ++r) s.G[r] += s.G[r - 1];
  for (int64_t r = 0; r < L; ++r) {
    s.gamma[r] = std::exp(s.G[r]);
    s.e[r] = std::exp(s.G[L - 1] - s.G[r]);
    // only the lower triangle: G_r - G_c <= 0 there, so exp never overflows
    for (int64_t c = 0; c < L; ++c) s.Gam[r * L + c] = c <= r ? std::exp(s.G[r] - s.G[c]) : T(0);
  }
  tile_gemm<T>(false, true, L, L, dk, 1, s.k.data(), dk, s.k.data(), dk, 0, s.KK.data(), L);
  for (int64_t r = 0; r < L; ++r)
    for (int64_t c = 0; c < L; ++c) s.A[r * L + c] = c < r ? s.beta[r] * s.KK[r * L + c] * s.Gam[r * L + c] : T(0);
  unit_lower_inverse(s.A.data(), L, s.Tinv.data());
  for (int64_t r = 0; r < L; ++r) {
    const T kb = s.beta[r] * s.gamma[r];
    for (int64_t j = 0; j < dk; ++j) {
      s.Kb[r * dk + j] = kb * s.k[r * dk + j];
      s.Ke[r * dk + j] = s.e[r] * s.k[r * dk + j];
    }
    for (int64_t j = 0; j < dv; ++j) s.Vb[r * dv + j] = s.beta[r] * s.v[r * dv + j];
  }
  tile_gemm<T>(false, false, L, dk, L, 1, s.Tinv.data(), L, s.Kb.data(), dk, 0, s.W.data(), dk);
  tile_gemm<T>(false, false, L, dv, L, 1, s.Tinv.data(), L, s.Vb.data(), dv, 0, s.U.data(), dv);
  tile_gemm<T>(false, true, L, L, dk, 1, s.q.data(), dk, s.k.data(), dk, 0, s.P.data(), L);
  const T scale = T(d.scale);
  for (int64_t r = 0; r < L; ++r)
    for (int64_t c = 0; c < L; ++c) s.P[r * L + c] = c <= r ? scale * s.P[r * L + c] * s.Gam[r * L + c] : T(0);
}

// ST: from the entering state s.S, V_new = U - W S^T and the leaving state
// S_leave = gamma_L S + V_new^T diag(e) K.
template <class T>
void stage_st(const GdnDims& d, SubChunk<T>& s, T* S_leave) {
  const int64_t L = s.L, dk = d.dk, dv = d.dv;
  std::copy_n(s.U.data(), L * dv, s.Vn.data());
  tile_gemm<T>(false, true, L, dv, dk, -1, s.W.data(), dk, s.S.data(), dk, 1, s.Vn.data(), dv);
  const T gamma_L = s.gamma[L - 1];
  for (int64_t i = 0; i < dv * dk; ++i) S_leave[i] = gamma_L * s.S[i];
  tile_gemm<T>(true, false, dv, dk, L, 1, s.Vn.data(), dv, s.Ke.data(), dk, 1, S_leave, dk);
}

// Out: O = s diag(gamma) Q S^T + P V_new  (L x dv).
template <class T>
void stage_out(const GdnDims& d, const SubChunk<T>& s, T* O) {
  const int64_t L = s.L, dk = d.dk, dv = d.dv;
  tile_gemm<T>(false, true, L, dv, dk, 1, s.q.data(), dk, s.S.data(), dk, 0, O, dv);
  for (int64_t r = 0; r < L; ++r)
    for (int64_t j = 0; j < dv; ++j) O[r * dv + j] *= T(d.scale) * s.gamma[r];
  tile_gemm<T>(false, false, L, dv, L, 1, s.P.data(), L, s.Vn.data(), dv, 1, O, dv);
}

// ---------------------------------------------------------------------------------------
// chunkwise backward (MATH.md section 4)
// ---------------------------------------------------------------------------------------

// Per-sub-chunk gradients that cross stage boundaries.
template <class T>
struct SubChunkGrad {
  std::vector<T> dO;       // L x dv
  std::vector<T> dVn;      // L x dv: B2's state-free part, completed by B3
  std::vector<T> dS_from_out;  // dv x dk: s (diag(gamma) dO)^T Q, what Out sends to the entering state
  std::vector<T> dSe;      // dv x dk: gradient of the state leaving the sub-chunk
  SubChunkGrad(const GdnDims& d, int64_t C) : dO(C * d.dv), dVn(C * d.dv), dS_from_out(d.dv * d.dk), dSe(d.dv * d.dk) {}
};

// Scratch of B4 (one sub-chunk at a time); dq, dk, dv, dbeta, dg are its results.
template <class T>
struct LocalGradScratch {
  std::vector<T> dq, dk, dv, dbeta, dG, dg;
  std::vector<T> dPG, dT, TtdT, dA, X;   // L x L
  std::vector<T> VdSe, dW, dKb, dOg;     // L x dk, L x dk, L x dk, L x dv
  LocalGradScratch(const GdnDims& d, int64_t C)
      : dq(C * d.dk), dk(C * d.dk), dv(C * d.dv), dbeta(C), dG(C), dg(C), dPG(C * C), dT(C * C), TtdT(C * C),
        dA(C * C), X(C * C), VdSe(C * d.dk), dW(C * d.dk), dKb(C * d.dk), dOg(C * d.dv) {}
};

// B2: the parts of the sub-chunk's gradients that need neither state nor dS:
// dV_new_loc = P^T dO, and Out's contribution to the entering state's gradient.
template <class T>
void stage_bwd_local_dvnew(const GdnDims& d, const SubChunk<T>& s, SubChunkGrad<T>& gr, LocalGradScratch<T>& ws) {
  const int64_t L = s.L, dk = d.dk, dv = d.dv;
  tile_gemm<T>(true, false, L, dv, L, 1, s.P.data(), L, gr.dO.data(), dv, 0, gr.dVn.data(), dv);
  for (int64_t r = 0; r < L; ++r)
    for (int64_t j = 0; j < dv; ++j) ws.dOg[r * dv + j] = T(d.scale) * s.gamma[r] * gr.dO[r * dv + j];
  tile_gemm<T>(true, false, dv, dk, L, 1, ws.dOg.data(), dv, s.q.data(), dk, 0, gr.dS_from_out.data(), dk);
}

// B3 for one sub-chunk: dS (gradient of the leaving state) -> gradient of the entering state.
// The dS-dependent part of dV_new must be added before dS is updated.
template <class T>
void stage_bwd_st(const GdnDims& d, const SubChunk<T>& s, SubChunkGrad<T>& gr, T* dS) {
  const int64_t L = s.L, dk = d.dk, dv = d.dv;
  std::copy_n(dS, dv * dk, gr.dSe.data());
  tile_gemm<T>(false, true, L, dv, dk, 1, s.Ke.data(), dk, dS, dk, 1, gr.dVn.data(), dv);
  const T gamma_L = s.gamma[L - 1];
  for (int64_t i = 0; i < dv * dk; ++i) dS[i] = gamma_L * dS[i] + gr.dS_from_out[i];
  tile_gemm<T>(true, false, dv, dk, L, -1, gr.dVn.data(), dv, s.W.data(), dk, 1, dS, dk);
}

// B4: all per-token gradients of one sub-chunk, given its entering state, the gradient of
// its leaving state and dV_new. dG is the gradient of the local cumsum G; dg its reverse cumsum.
template <class T>
void stage_bwd_local(const GdnDims& d, const SubChunk<T>& s, const SubChunkGrad<T>& gr, LocalGradScratch<T>& ws) {
  const int64_t L = s.L, dk = d.dk, dv = d.dv;
  const T scale = T(d.scale);
  const T* dO = gr.dO.data();
  T* dq = ws.dq.data();
  T* dkk = ws.dk.data();
  T* dG = ws.dG.data();

  // Out, inter-chunk term O1 = s diag(gamma) Q S^T: dq = s diag(gamma) dO S, dG_r = dO_r.O1_r = dq_r.q_r
  tile_gemm<T>(false, false, L, dk, dv, 1, dO, dv, s.S.data(), dk, 0, dq, dk);
  for (int64_t r = 0; r < L; ++r) {
    for (int64_t j = 0; j < dk; ++j) dq[r * dk + j] *= scale * s.gamma[r];
    dG[r] = dot(dq + r * dk, s.q.data() + r * dk, dk);
  }

  // Out, intra-chunk term P V_new with P = s (Q K^T) ⊙ Gam: dP = dO V_new^T (causal part)
  T* dPG = ws.dPG.data();
  tile_gemm<T>(false, true, L, L, dv, 1, dO, dv, s.Vn.data(), dv, 0, dPG, L);
  for (int64_t r = 0; r < L; ++r)
    for (int64_t c = 0; c < L; ++c) {
      T& x = dPG[r * L + c];
      if (c > r) {
        x = 0;
        continue;
      }
      const T dPP = x * s.P[r * L + c];
      dG[r] += dPP;
      dG[c] -= dPP;
      x *= scale * s.Gam[r * L + c];
    }
  tile_gemm<T>(false, false, L, dk, L, 1, dPG, L, s.k.data(), dk, 1, dq, dk);
  tile_gemm<T>(true, false, L, dk, L, 1, dPG, L, s.q.data(), dk, 0, dkk, dk);

  // state write S_leave = gamma_L S + V_new^T diag(e) K
  tile_gemm<T>(false, false, L, dk, dv, 1, s.Vn.data(), dv, gr.dSe.data(), dk, 0, ws.VdSe.data(), dk);
  T m_sum = 0;
  for (int64_t c = 0; c < L; ++c) {
    const T* row = ws.VdSe.data() + c * dk;
    const T m = s.e[c] * dot(row, s.k.data() + c * dk, dk);
    for (int64_t j = 0; j < dk; ++j) dkk[c * dk + j] += s.e[c] * row[j];
    dG[c] -= m;
    m_sum += m;
  }
  dG[L - 1] += s.gamma[L - 1] * dot(gr.dSe.data(), s.S.data(), dv * dk) + m_sum;

  // V_new = U - W S^T: dU = dV_new, dW = -dV_new S
  tile_gemm<T>(false, false, L, dk, dv, -1, gr.dVn.data(), dv, s.S.data(), dk, 0, ws.dW.data(), dk);

  // W = T Kb, U = T Vb: dT = dW Kb^T + dU Vb^T, dKb = T^T dW, dVb = T^T dU
  tile_gemm<T>(false, true, L, L, dk, 1, ws.dW.data(), dk, s.Kb.data(), dk, 0, ws.dT.data(), L);
  tile_gemm<T>(false, true, L, L, dv, 1, gr.dVn.data(), dv, s.Vb.data(), dv, 1, ws.dT.data(), L);
  tile_gemm<T>(true, false, L, dk, L, 1, s.Tinv.data(), L, ws.dW.data(), dk, 0, ws.dKb.data(), dk);
  T* dVb = ws.dv.data();  // becomes dv = diag(beta) dVb below
  tile_gemm<T>(true, false, L, dv, L, 1, s.Tinv.data(), L, gr.dVn.data(), dv, 0, dVb, dv);
  for (int64_t r = 0; r < L; ++r) {
    const T* dKb_r = ws.dKb.data() + r * dk;
    const T bg = s.beta[r] * s.gamma[r];
    const T t_kb = dot(dKb_r, s.k.data() + r * dk, dk);
    for (int64_t j = 0; j < dk; ++j) dkk[r * dk + j] += bg * dKb_r[j];
    ws.dbeta[r] = s.gamma[r] * t_kb + dot(dVb + r * dv, s.v.data() + r * dv, dv);
    dG[r] += bg * t_kb;
    for (int64_t j = 0; j < dv; ++j) dVb[r * dv + j] *= s.beta[r];
  }

  // T = (I + A)^-1: dA = strictly_lower(-T^T dT T^T)
  tile_gemm<T>(true, false, L, L, L, 1, s.Tinv.data(), L, ws.dT.data(), L, 0, ws.TtdT.data(), L);
  tile_gemm<T>(false, true, L, L, L, -1, ws.TtdT.data(), L, s.Tinv.data(), L, 0, ws.dA.data(), L);

  // A[r,c] = beta_r (k_r.k_c) Gam[r,c] for c < r
  T* X = ws.X.data();
  for (int64_t r = 0; r < L; ++r)
    for (int64_t c = 0; c < L; ++c) {
      if (c >= r) {
        X[r * L + c] = 0;
        continue;
      }
      const T dA = ws.dA[r * L + c];
      const T dAA = dA * s.A[r * L + c];
      dG[r] += dAA;
      dG[c] -= dAA;
      ws.dbeta[r] += dA * s.KK[r * L + c] * s.Gam[r * L + c];
      X[r * L + c] = dA * s.Gam[r * L + c] * s.beta[r];
    }
  tile_gemm<T>(false, false, L, dk, L, 1, X, L, s.k.data(), dk, 1, dkk, dk);
  tile_gemm<T>(true, false, L, dk, L, 1, X, L, s.k.data(), dk, 1, dkk, dk);

  // G = local cumsum(g)  ->  dg = reverse cumsum of dG
  T acc = 0;
  for (int64_t r = L - 1; r >= 0; --r) ws.dg[r] = acc += dG[r];
}

// Sub-chunks start at the chunk's first token; the last one may be short.
int64_t sub_chunk_count(const GdnDims& d) { return (d.len + d.block - 1) / d.block; }
int64_t sub_chunk_len(const GdnDims& d, int64_t n) { return std::min(d.block, d.len - n * d.block); }

}  // namespace

template <class T>
void gdn_chunk_forward(const GdnDims& d, const T* q, const T* k, const T* v, const T* beta, const T* g,
                       const T* S_in, T* o, T* S_out) {
  check_dims(d);
  FlushDenormalsScope flush_denormals;
  const int64_t C = std::min(d.block, std::max<int64_t>(d.len, 1));  // no tile larger than the chunk
  SubChunk<T> s(d, C);
  std::vector<T> state(d.dv * d.dk), O(C * d.dv);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      load_state(d, S_in, b, h, state.data());
      for (int64_t n = 0; n < sub_chunk_count(d); ++n) {
        load_sub_chunk(d, b, h, n * d.block, sub_chunk_len(d, n), q, k, v, beta, g, s);
        stage_pre(d, s);
        std::copy(state.begin(), state.end(), s.S.begin());
        stage_st(d, s, state.data());
        stage_out(d, s, O.data());
        store_rows(d, O.data(), b, h, s.start, s.L, d.dv, o);
      }
      std::copy(state.begin(), state.end(), state_at(d, S_out, b, h));
    }
}

template <class T>
void gdn_chunk_backward(const GdnDims& d, const T* q, const T* k, const T* v, const T* beta, const T* g,
                        const T* S_in, const T* dO, const T* dS_out, T* dq, T* dk, T* dv, T* dbeta, T* dg,
                        T* dS_in) {
  check_dims(d);
  FlushDenormalsScope flush_denormals;
  const int64_t C = std::min(d.block, std::max<int64_t>(d.len, 1));
  const int64_t n_sub = sub_chunk_count(d);
  std::vector<SubChunk<T>> subs(n_sub, SubChunk<T>(d, C));
  std::vector<SubChunkGrad<T>> grads(n_sub, SubChunkGrad<T>(d, C));
  LocalGradScratch<T> ws(d, C);
  std::vector<T> state(d.dv * d.dk);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      // B1: recompute Pre and the forward ST sweep (entering states, V_new)
      load_state(d, S_in, b, h, state.data());
      for (int64_t n = 0; n < n_sub; ++n) {
        SubChunk<T>& s = subs[n];
        load_sub_chunk(d, b, h, n * d.block, sub_chunk_len(d, n), q, k, v, beta, g, s);
        stage_pre(d, s);
        std::copy(state.begin(), state.end(), s.S.begin());
        stage_st(d, s, state.data());
      }
      // B2: state-free parts of dV_new and of the entering-state gradients
      for (int64_t n = 0; n < n_sub; ++n) {
        load_rows(d, dO, b, h, subs[n].start, subs[n].L, d.dv, grads[n].dO.data());
        stage_bwd_local_dvnew(d, subs[n], grads[n], ws);
      }
      // B3: the reverse sequential sweep, dS_out -> dS_in
      load_state(d, dS_out, b, h, state.data());
      for (int64_t n = n_sub - 1; n >= 0; --n) stage_bwd_st(d, subs[n], grads[n], state.data());
      std::copy(state.begin(), state.end(), state_at(d, dS_in, b, h));
      // B4: everything else, local to each sub-chunk
      for (int64_t n = 0; n < n_sub; ++n) {
        const SubChunk<T>& s = subs[n];
        stage_bwd_local(d, s, grads[n], ws);
        store_rows(d, ws.dq.data(), b, h, s.start, s.L, d.dk, dq);
        store_rows(d, ws.dk.data(), b, h, s.start, s.L, d.dk, dk);
        store_rows(d, ws.dv.data(), b, h, s.start, s.L, d.dv, dv);
        store_rows(d, ws.dbeta.data(), b, h, s.start, s.L, int64_t(1), dbeta);
        store_rows(d, ws.dg.data(), b, h, s.start, s.L, int64_t(1), dg);
      }
    }
}

#define SF_INSTANTIATE(T)                                                                                           \
  template void gdn_recurrent_forward<T>(const GdnDims&, const T*, const T*, const T*, const T*, const T*,         \
                                         const T*, T*, T*);                                                        \
  template void gdn_recurrent_backward<T>(const GdnDims&, const T*, const T*, const T*, const T*, const T*,        \
                                          const T*, const T*, const T*, T*, T*, T*, T*, T*, T*);                   \
  template void gdn_chunk_forward<T>(const GdnDims&, const T*, const T*, const T*, const T*, const T*, const T*,   \
                                     T*, T*);                                                                      \
  template void gdn_chunk_backward<T>(const GdnDims&, const T*, const T*, const T*, const T*, const T*, const T*,  \
                                      const T*, const T*, T*, T*, T*, T*, T*, T*);
SF_INSTANTIATE(float)
SF_INSTANTIATE(double)
#undef SF_INSTANTIATE

}  // namespace stateflow
