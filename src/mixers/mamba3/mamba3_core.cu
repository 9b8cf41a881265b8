// Mamba-3 chunk core on the GPU: contrib / scan / out forward, contrib / reverse scan / fold /
// grads backward (see mamba3_core_cuda.h for the contract and the plan).
//
// Per (batch, head) and sub-chunk n of Lc = 64 / R tokens, rows i = one per (token, rank),
// ti = i / R its token, local positions with the padded tail loaded as zeros (adt = dt = lam
// = 0, an exact no-op: no decay, no write weight):
//   acum_t = adt_1 + ... + adt_t,  gam_t = lam_t dt_t,  bp_t = (1 - lam_t) dt_t
//   E(t, s) = exp(acum_t - acum_s) (gam_s + bp_{s+1} if s < t, gam_t if s = t), 0 if s > t
//   f_i = E(Lc - 1, ti)                             (weight of row i in the leaving state)
//   contrib: U_n = (diag(f) X)^T B   [P x N],  e_L = exp(acum_{Lc-1})
//   scan:    S~_0 = S_in + bp_1 x_prev b_prev^T;  S_out_n = e_L S~_n + U_n;
//            S~_{n+1} = S_out_n + bp_1(n+1) sum_r xl_r bl_r^T  (xl, bl: sub-chunk n's last token)
//   out:     Y = (C B^T ⊙ E) X + diag(exp(acum)) C S~^T + D X
// Backward, with dSo_n the gradient of S_out_n (dS_out for the last sub-chunk):
//   contrib: V_n = (diag(exp(acum)) dY)^T C;   reverse scan: dS~_n = e_L dSo_n + V_n,
//            dSo_{n-1} = dS~_n (stored in place of V_n)
//   fold:    at each sub-chunk entry, d bp_1 = <dS~_n, sum_r xl_r bl_r^T>,
//            dxl_r = bp_1 dS~_n bl_r, dbl_r = bp_1 dS~_n^T xl_r (to the edge for n = 0)
//   grads:   every per-token gradient of the sub-chunk (comments below).
// Workspace (per batch x head, NS sub-chunks, PN = P * N):
//   Ust  fp32 [NS][PN]  U_n, then V_n, then dS~_n      eL fp32 [NS]
//   Sb   bf16 [NS][PN]  S~_n (the operand of out / grads)
//   Fx, Fb, Fd fp32 [NS][R*P], [NS][R*N], [NS]         the fold's gradients
//   dDpart fp32 [batch][token blocks * R][heads]       per-sub-chunk partials of dD
#include "mixers/mamba3/mamba3_core_cuda.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/mma_tile.cuh"
#include "kernels/cuda/reduce_cuda.h"

namespace stateflow {
namespace {

using cuda::bf;
using cuda::bf16;
using cuda::Frag;
using cuda::Lay;
using cuda::mma_acc;
using cuda::put2;
using cuda::row_dot;
using cuda::Tile;
using cuda::tile_at;
using cuda::warp_sum;

constexpr int M = 64;             // rows per sub-chunk
constexpr int P = 64, N = 128;    // head sizes this build supports
constexpr int PN = P * N;
constexpr int MAX_RANK = 4;
constexpr int LDE = M + 1;        // row stride of fp32 M x M scratch

struct Args {
  int B, T, H, R, Lc, NS, NSpad;
  const bf16 *x, *b, *c, *dy;
  const float *adt, *dt, *lam, *D;
  const float *S_in, *xp_in, *bp_in;     // forward edge in
  const float *dS_out, *dxp_out, *dbp_out;  // gradient of the emitted edge
  bf16* y;
  float *S_out, *xp_out, *bp_out;
  bf16 *dx, *db, *dc;
  float *dadt, *ddt, *dlam;
  float *dS_in, *dxp_in, *dbp_in;
  float *Ust, *eL, *Fx, *Fb, *Fd, *dDpart;
  bf16* Sb;

  __device__ int64_t tok(int b_, int t, int h) const { return (int64_t(b_) * T + t) * H + h; }
  __device__ int64_t bh(int b_, int h) const { return int64_t(b_) * H + h; }
  __device__ int64_t sub(int b_, int h, int n) const { return bh(b_, h) * NS + n; }
};

// Rows of sub-chunk n of (b, h) from a [B, T, H, R, W] tensor; rows past the end are zeros.
template <class TT>
__device__ void load_rows_async(const Args& a, TT tile, const bf16* g, int b, int h, int n, int tid) {
  constexpr int W = TT::cols, chunks = W / 8;
  for (int i = tid; i < M * chunks; i += 256) {
    const int row = i / chunks, col = (i % chunks) * 8, t = n * a.Lc + row / a.R;
    const bool ok = t < a.T;
    const bf16* src = ok ? g + (a.tok(b, t, h) * a.R + row % a.R) * W + col : g;
    cuda::cp_async16(tile.at(row, col), src, ok);
  }
}

// The trapezoid weight (1 - lam) dt, written out so every kernel rounds it the same way.
__device__ float trap_weight(float lam, float dt) { return __fmul_rn(__fsub_rn(1.f, lam), dt); }

// The previous token's trapezoid term of one state entry, s + bp1 * sum_r xv[r] bv[r], in one
// fixed order of fp32 operations whether the previous token is inside the call or is its edge.
template <int R>
__device__ float outer_entry(const float* xv, const float* bv) {
  float outer = 0.f;
#pragma unroll
  for (int r = 0; r < R; ++r) outer = __fmaf_rn(xv[r], bv[r], outer);
  return outer;
}
__device__ float fold_entry(float s, float bp1, float outer) { return __fmaf_rn(bp1, outer, s); }

// A sub-chunk's per-token scalars in shared memory (Lc entries each).
struct Scalars {
  float acum[M], eA[M], gam[M], bp[M], dt[M], lam[M];
  // E(t, s) of the header.
  __device__ float E(int t, int s) const {
    if (s > t) return 0.f;
    const float w = s < t ? gam[s] + bp[s + 1] : gam[t];
    return expf(acum[t] - acum[s]) * w;
  }
};

// Fills sc for sub-chunk n; ends with __syncthreads (256 threads).
__device__ void load_scalars(const Args& a, int b, int h, int n, Scalars& sc, int tid) {
  if (tid < a.Lc) {
    const int t = n * a.Lc + tid;
    const bool ok = t < a.T;
    const int64_t i = ok ? a.tok(b, t, h) : 0;
    const float adt = ok ? a.adt[i] : 0.f, dt = ok ? a.dt[i] : 0.f, lam = ok ? a.lam[i] : 0.f;
    sc.acum[tid] = adt, sc.dt[tid] = dt, sc.lam[tid] = lam;
    sc.gam[tid] = __fmul_rn(lam, dt);
    sc.bp[tid] = trap_weight(lam, dt);
  }
  __syncthreads();
  if (tid == 0) {
    float s = 0.f;
    for (int t = 0; t < a.Lc; ++t) sc.acum[t] = s = __fadd_rn(s, sc.acum[t]);
  }
  __syncthreads();
  if (tid < a.Lc) sc.eA[tid] = expf(sc.acum[tid]);
  __syncthreads();
}

// Sum over the 256 threads of a block in a fixed order; every thread gets the result.
__device__ float block_sum(float v, float* red, int tid) {
  red[tid] = v;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if (tid < s) red[tid] += red[tid + s];
    __syncthreads();
  }
  const float r = red[0];
  __syncthreads();
  return r;
}

// ---------------------------------------------------------------------------------------
// contrib: one block per (sub-chunk, head, batch), 8 warps in a 4 (P) x 2 (N) grid.
//   forward (DY = false): Ust[n] = (diag(f) X)^T B, eL[n] = exp(acum_{Lc-1})
//   backward (DY = true): Ust[n] = (diag(exp(acum)) dY)^T C
// ---------------------------------------------------------------------------------------
struct ContribSmem {
  static constexpr int L = 0;
  static constexpr int Rt = L + Tile<M, P>::bytes;
  static constexpr int sc = Rt + Tile<M, N>::bytes;
  static constexpr int bytes = sc + sizeof(Scalars);
};

template <bool DY>
__global__ void __launch_bounds__(256) contrib_kernel(Args a) {
  using S = ContribSmem;
  extern __shared__ __align__(128) char sm[];
  const int n = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int wm = (tid >> 5) & 3, wn = tid >> 7;
  auto Ls = tile_at<Tile<M, P>>(sm, S::L);
  auto Rs = tile_at<Tile<M, N>>(sm, S::Rt);
  Scalars& sc = *reinterpret_cast<Scalars*>(sm + S::sc);
  load_rows_async(a, Ls, DY ? a.dy : a.x, b, h, n, tid);
  load_rows_async(a, Rs, DY ? a.c : a.b, b, h, n, tid);
  cuda::cp_async_commit();
  load_scalars(a, b, h, n, sc, tid);
  cuda::cp_async_wait_all();
  __syncthreads();
  for (int i = tid; i < M * P / 2; i += 256) {
    const int r = i / (P / 2), c = 2 * (i % (P / 2)), t = r / a.R;
    const float w = DY ? sc.eA[t] : sc.E(a.Lc - 1, t);
    bf16* p = Ls.at(r, c);
    put2(p, w * bf(p[0]), w * bf(p[1]));
  }
  __syncthreads();
  Frag<16, N / 2> acc;
  acc.fill(0.f);
  mma_acc<M, Lay::Col, Lay::Row>(acc, Ls, wm * 16, Rs, wn * N / 2);
  float* dst = a.Ust + a.sub(b, h, n) * PN;
  acc.each_pair([&](int r, int c, float& x0, float& x1) {
    *reinterpret_cast<float2*>(dst + (wm * 16 + r) * N + wn * N / 2 + c) = make_float2(x0, x1);
  });
  if (!DY && tid == 0) a.eL[a.sub(b, h, n)] = sc.eA[a.Lc - 1];
}

// ---------------------------------------------------------------------------------------
// Scans: one thread per state entry (p, col) of one (batch, head), walking the sub-chunks.
// ---------------------------------------------------------------------------------------

// Sub-chunks a scan thread loads ahead: the loads of a batch are issued together, so the walk
// waits on memory once per batch rather than once per sub-chunk.
constexpr int SCAN_BATCH = 8;

// outer_entry of state entry (p, col) for token t of (b, h), from the bf16 inputs.
template <int R>
__device__ float token_outer(const Args& a, int b, int t, int h, int p, int col) {
  const int64_t i = a.tok(b, t, h) * R;
  float xv[R], bv[R];
#pragma unroll
  for (int r = 0; r < R; ++r) xv[r] = bf(a.x[(i + r) * P + p]), bv[r] = bf(a.b[(i + r) * N + col]);
  return outer_entry<R>(xv, bv);
}

template <int R>
__global__ void __launch_bounds__(256) forward_scan_kernel(Args a) {
  const int h = blockIdx.y, b = blockIdx.z, e = blockIdx.x * 256 + threadIdx.x, p = e / N, col = e % N;
  const int64_t bh = a.bh(b, h), sub0 = bh * a.NS;
  float xv[R], bv[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    xv[r] = a.xp_in ? a.xp_in[(bh * R + r) * P + p] : 0.f;
    bv[r] = a.bp_in ? a.bp_in[(bh * R + r) * N + col] : 0.f;
  }
  const int64_t i0 = a.tok(b, 0, h);
  float s = fold_entry(a.S_in ? a.S_in[bh * PN + e] : 0.f, trap_weight(a.lam[i0], a.dt[i0]), outer_entry<R>(xv, bv));
  float s_out = 0.f;
  for (int n0 = 0; n0 < a.NS; n0 += SCAN_BATCH) {
    float u[SCAN_BATCH], el[SCAN_BATCH], bp[SCAN_BATCH], outer[SCAN_BATCH];
#pragma unroll
    for (int k = 0; k < SCAN_BATCH; ++k) {
      const int n = n0 + k;
      u[k] = el[k] = bp[k] = outer[k] = 0.f;
      if (n < a.NS) u[k] = a.Ust[(sub0 + n) * PN + e], el[k] = a.eL[sub0 + n];
      if (n + 1 < a.NS) {
        const int t = (n + 1) * a.Lc;
        const int64_t i = a.tok(b, t, h);
        bp[k] = trap_weight(a.lam[i], a.dt[i]);
        outer[k] = token_outer<R>(a, b, t - 1, h, p, col);
      }
    }
#pragma unroll
    for (int k = 0; k < SCAN_BATCH; ++k) {
      const int n = n0 + k;
      if (n >= a.NS) break;
      a.Sb[(sub0 + n) * PN + e] = __float2bfloat16(s);
      s_out = __fmaf_rn(el[k], s, u[k]);
      if (n + 1 < a.NS) s = fold_entry(s_out, bp[k], outer[k]);
    }
  }
  if (a.S_out) a.S_out[bh * PN + e] = s_out;
  if (a.xp_out && blockIdx.x == 0) {  // the emitted x_prev, b_prev: the last token's rows
    const int64_t i = a.tok(b, a.T - 1, h) * R;
    for (int k = threadIdx.x; k < R * P; k += 256) a.xp_out[bh * R * P + k] = bf(a.x[i * P + k]);
    for (int k = threadIdx.x; k < R * N; k += 256) a.bp_out[bh * R * N + k] = bf(a.b[i * N + k]);
  }
}

__global__ void __launch_bounds__(256) backward_scan_kernel(Args a) {
  const int h = blockIdx.y, b = blockIdx.z, e = blockIdx.x * 256 + threadIdx.x;
  const int64_t bh = a.bh(b, h), sub0 = bh * a.NS;
  float d = a.dS_out ? a.dS_out[bh * PN + e] : 0.f;
  for (int n0 = a.NS - 1; n0 >= 0; n0 -= SCAN_BATCH) {  // n0, n0 - 1, ... down to 0
    float v[SCAN_BATCH], el[SCAN_BATCH];
#pragma unroll
    for (int k = 0; k < SCAN_BATCH; ++k) {
      const int n = n0 - k;
      v[k] = n >= 0 ? a.Ust[(sub0 + n) * PN + e] : 0.f;
      el[k] = n >= 0 ? a.eL[sub0 + n] : 0.f;
    }
#pragma unroll
    for (int k = 0; k < SCAN_BATCH; ++k) {
      const int n = n0 - k;
      if (n < 0) break;
      d = __fmaf_rn(el[k], d, v[k]);
      a.Ust[(sub0 + n) * PN + e] = d;
    }
  }
  a.dS_in[bh * PN + e] = d;
}

// ---------------------------------------------------------------------------------------
// fold: the gradient of the trapezoid term folded in at the entry of sub-chunk n, from
// dS~_n; one block per (sub-chunk, head, batch).
// ---------------------------------------------------------------------------------------
struct FoldSmem {
  static constexpr int dS = 0;  // fp32 [P][N]
  static constexpr int xl = dS + PN * 4;
  static constexpr int bl = xl + MAX_RANK * P * 4;
  static constexpr int u = bl + MAX_RANK * N * 4;
  static constexpr int bytes = u + MAX_RANK * P * 4;
};

__global__ void __launch_bounds__(256) fold_kernel(Args a) {
  using S = FoldSmem;
  extern __shared__ __align__(128) char sm[];
  const int n = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x, R = a.R;
  const int warp = tid >> 5, lane = tid & 31;
  const int64_t bh = a.bh(b, h), sub = a.sub(b, h, n);
  float *dS = reinterpret_cast<float*>(sm + S::dS), *xl = reinterpret_cast<float*>(sm + S::xl);
  float *bl = reinterpret_cast<float*>(sm + S::bl), *u = reinterpret_cast<float*>(sm + S::u);
  cuda::load_floats_async<256>(dS, a.Ust + sub * PN, PN, tid);
  cuda::cp_async_commit();
  const int t0 = n * a.Lc;
  if (n > 0) {
    const int64_t i = a.tok(b, t0 - 1, h) * R;
    for (int k = tid; k < R * P; k += 256) xl[k] = bf(a.x[i * P + k]);
    for (int k = tid; k < R * N; k += 256) bl[k] = bf(a.b[i * N + k]);
  } else {
    for (int k = tid; k < R * P; k += 256) xl[k] = a.xp_in ? a.xp_in[bh * R * P + k] : 0.f;
    for (int k = tid; k < R * N; k += 256) bl[k] = a.bp_in ? a.bp_in[bh * R * N + k] : 0.f;
  }
  const int64_t it0 = a.tok(b, t0, h);
  const float bp1 = trap_weight(a.lam[it0], a.dt[it0]);
  cuda::cp_async_wait_all();
  __syncthreads();
  float* fx = n > 0 ? a.Fx + sub * R * P : a.dxp_in + bh * R * P;
  float* fb = n > 0 ? a.Fb + sub * R * N : a.dbp_in + bh * R * N;
  for (int k = warp; k < R * P; k += 8) {  // u_r[p] = dS~[p, :] . bl_r, one warp per (r, p)
    const int r = k / P, p = k % P;
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < N / 32; ++j) s += dS[p * N + lane + 32 * j] * bl[r * N + lane + 32 * j];
    s = warp_sum(s);
    if (lane == 0) u[k] = s, fx[k] = bp1 * s;
  }
  for (int k = tid; k < R * N; k += 256) {  // dbl_r[c] = bp1 dS~[:, c] . xl_r
    const int r = k / N, c = k % N;
    float s = 0.f;
    for (int p = 0; p < P; ++p) s += dS[p * N + c] * xl[r * P + p];
    fb[k] = bp1 * s;
  }
  __syncthreads();
  if (warp == 0) {  // d bp_1 = sum_r xl_r . u_r
    float s = 0.f;
    for (int k = lane; k < R * P; k += 32) s += xl[k] * u[k];
    s = warp_sum(s);
    if (lane == 0) a.Fd[sub] = s;
  }
}

// ---------------------------------------------------------------------------------------
// out: one block per (sub-chunk, head, batch), 8 warps in a 4 x 2 grid over the 64 x 64 tile.
// ---------------------------------------------------------------------------------------
struct OutSmem {
  static constexpr int X = 0;
  static constexpr int Bt = X + Tile<M, P>::bytes;
  static constexpr int Ct = Bt + Tile<M, N>::bytes;
  static constexpr int St = Ct + Tile<M, N>::bytes;
  static constexpr int Mm = St + Tile<P, N>::bytes;
  static constexpr int sc = Mm + Tile<M, M>::bytes;
  static constexpr int bytes = sc + sizeof(Scalars);
};

__global__ void __launch_bounds__(256) out_kernel(Args a) {
  using S = OutSmem;
  extern __shared__ __align__(128) char sm[];
  const int n = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x, R = a.R;
  const int wm = (tid >> 5) & 3, wn = tid >> 7;
  auto Xs = tile_at<Tile<M, P>>(sm, S::X);
  auto Bs = tile_at<Tile<M, N>>(sm, S::Bt), Cs = tile_at<Tile<M, N>>(sm, S::Ct);
  auto Ss = tile_at<Tile<P, N>>(sm, S::St);
  auto Mm = tile_at<Tile<M, M>>(sm, S::Mm);
  Scalars& sc = *reinterpret_cast<Scalars*>(sm + S::sc);
  load_rows_async(a, Xs, a.x, b, h, n, tid);
  load_rows_async(a, Bs, a.b, b, h, n, tid);
  load_rows_async(a, Cs, a.c, b, h, n, tid);
  cuda::load_tile_async<256>(Ss, a.Sb + a.sub(b, h, n) * PN, N, P, tid);
  cuda::cp_async_commit();
  load_scalars(a, b, h, n, sc, tid);
  cuda::cp_async_wait_all();
  __syncthreads();
  {
    Frag<16, 32> g;  // C B^T, masked and weighted
    g.fill(0.f);
    mma_acc<N, Lay::Row, Lay::Col>(g, Cs, wm * 16, Bs, wn * 32);
    g.each([&](int r, int c, float& x) {
      r += wm * 16, c += wn * 32;
      *Mm.at(r, c) = __float2bfloat16(x * sc.E(r / R, c / R));
    });
  }
  Frag<16, 32> o;  // inter: exp(acum) C S~^T, then intra
  o.fill(0.f);
  mma_acc<N, Lay::Row, Lay::Col>(o, Cs, wm * 16, Ss, wn * 32);
  o.each([&](int r, int, float& x) { x *= sc.eA[(wm * 16 + r) / R]; });
  __syncthreads();
  mma_acc<M, Lay::Row, Lay::Row>(o, Mm, wm * 16, Xs, wn * 32);
  const float D = a.D[h];
  o.each_pair([&](int r, int c, float& x0, float& x1) {
    r += wm * 16, c += wn * 32;
    const int t = n * a.Lc + r / R;
    if (t >= a.T) return;
    const bf16* xp = Xs.at(r, c);
    put2(a.y + (a.tok(b, t, h) * R + r % R) * P + c, x0 + D * bf(xp[0]), x1 + D * bf(xp[1]));
  });
}

// ---------------------------------------------------------------------------------------
// grads: every per-token gradient of one sub-chunk; one block per (sub-chunk, head, batch).
// Given S~ (Sb) and dSo (the gradient of the state the sub-chunk emitted):
//   dX = diag(f) B dSo^T + (C B^T ⊙ E)^T dY + D dY      (+ the fold's dxl on the last token)
//   dB = diag(f) X dSo + dGm^T C,  dGm = (dY X^T) ⊙ E   (+ the fold's dbl on the last token)
//   dC = diag(exp(acum)) dY S~ + dGm B
//   dE(t, s) = sum over the rank rows of (dY X^T) ⊙ (C B^T), plus on row Lc-1 the leaving
//   state's x_s . (dSo b_s); dacum gets exp(acum_t) c . (dY S~) per row and e_L <dSo, S~>;
//   E's scalars then go to adt (suffix sums), dt and lam.
// Shared memory stays under half an SM's (two blocks per SM): the fp32 dE scratch lives in
// the dSo tile's place until dE has been used, and dSo is loaded after that.
// ---------------------------------------------------------------------------------------
struct GradSmem {
  static constexpr int X = 0;
  static constexpr int dY = X + Tile<M, P>::bytes;
  static constexpr int Bt = dY + Tile<M, P>::bytes;
  static constexpr int Ct = Bt + Tile<M, N>::bytes;
  static constexpr int St = Ct + Tile<M, N>::bytes;
  static constexpr int dSt = St + Tile<P, N>::bytes;  // first the fp32 [M][LDE] dE scratch
  static constexpr int Mm = dSt + Tile<P, N>::bytes;
  static constexpr int dGm = Mm + Tile<M, M>::bytes;
  static constexpr int rows = dGm + Tile<M, M>::bytes;  // fp32 rowX[2][M], rowC[2][M]
  static constexpr int tokv = rows + 4 * M * 4;         // fp32 plus, minus, dgam, dbpn [M]
  static constexpr int red = tokv + 4 * M * 4;          // fp32 [256]
  static constexpr int sc = red + 256 * 4;
  static constexpr int bytes = sc + sizeof(Scalars);
  static_assert(M * LDE * 4 <= Tile<P, N>::bytes, "dE scratch must fit in the dSo tile");
};

__global__ void __launch_bounds__(256, 2) grads_kernel(Args a) {
  using S = GradSmem;
  extern __shared__ __align__(128) char sm[];
  const int n = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x, R = a.R, Lc = a.Lc;
  const int wm = (tid >> 5) & 3, wn = tid >> 7, m0 = wm * 16;
  const int64_t bh = a.bh(b, h), sub = a.sub(b, h, n);
  const int nv = min(Lc, a.T - n * Lc);  // valid tokens
  auto Xs = tile_at<Tile<M, P>>(sm, S::X), dYs = tile_at<Tile<M, P>>(sm, S::dY);
  auto Bs = tile_at<Tile<M, N>>(sm, S::Bt), Cs = tile_at<Tile<M, N>>(sm, S::Ct);
  auto Ss = tile_at<Tile<P, N>>(sm, S::St), dSs = tile_at<Tile<P, N>>(sm, S::dSt);
  auto Mm = tile_at<Tile<M, M>>(sm, S::Mm), dGm = tile_at<Tile<M, M>>(sm, S::dGm);
  float* dEf = reinterpret_cast<float*>(sm + S::dSt);
  float *rowX = reinterpret_cast<float*>(sm + S::rows), *rowC = rowX + 2 * M;
  float *plus = reinterpret_cast<float*>(sm + S::tokv), *minus = plus + M, *dgam = minus + M, *dbpn = dgam + M;
  float* red = reinterpret_cast<float*>(sm + S::red);
  Scalars& sc = *reinterpret_cast<Scalars*>(sm + S::sc);

  load_rows_async(a, Xs, a.x, b, h, n, tid);
  load_rows_async(a, dYs, a.dy, b, h, n, tid);
  load_rows_async(a, Bs, a.b, b, h, n, tid);
  load_rows_async(a, Cs, a.c, b, h, n, tid);
  cuda::load_tile_async<256>(Ss, a.Sb + sub * PN, N, P, tid);
  cuda::cp_async_commit();
  load_scalars(a, b, h, n, sc, tid);
  cuda::cp_async_wait_all();
  __syncthreads();

  {  // G = C B^T and dM = dY X^T: Mm, dGm (bf16) and their product per row pair (fp32)
    Frag<16, 32> g, dm;
    g.fill(0.f), dm.fill(0.f);
    mma_acc<N, Lay::Row, Lay::Col>(g, Cs, m0, Bs, wn * 32);
    mma_acc<P, Lay::Row, Lay::Col>(dm, dYs, m0, Xs, wn * 32);
    const int l = tid & 31;
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = m0 + (l >> 2) + (e >> 1) * 8, c = wn * 32 + j * 8 + 2 * (l & 3) + (e & 1);
        const float gv = g.x[0][j][e], dv = dm.x[0][j][e], E = sc.E(r / R, c / R);
        *Mm.at(r, c) = __float2bfloat16(gv * E);
        *dGm.at(r, c) = __float2bfloat16(dv * E);
        dEf[r * LDE + c] = c / R <= r / R ? dv * gv : 0.f;
      }
  }
  __syncthreads();
  // What the intra-chunk part of dE gives the scalars: E(t, s) = exp(acum_t - acum_s) w(t, s).
  auto dE_intra = [&](int t, int s) {
    float v = 0.f;
    for (int ri = 0; ri < R; ++ri)
      for (int rj = 0; rj < R; ++rj) v += dEf[(t * R + ri) * LDE + s * R + rj];
    return v;
  };
  if (tid < Lc) {  // row t: acum_t
    const int t = tid;
    float p = 0.f;
    for (int s = 0; s <= t; ++s) p += dE_intra(t, s) * sc.E(t, s);
    plus[t] = p;
  } else if (tid >= 128 && tid < 128 + Lc) {  // column s: acum_s, gam_s, bp_{s+1}
    const int s = tid - 128;
    float m = 0.f, dg = 0.f, db = 0.f;
    for (int t = s; t < Lc; ++t) {
      const float d = dE_intra(t, s) * expf(sc.acum[t] - sc.acum[s]);
      m += d * (s < t ? sc.gam[s] + sc.bp[s + 1] : sc.gam[t]);
      dg += d;
      if (t > s) db += d;
    }
    minus[s] = m, dgam[s] = dg, dbpn[s] = db;
  }
  __syncthreads();  // dEf is dead: its space becomes the dSo tile

  // dSo to bf16, and <dSo, S~> (fp32 dSo, bf16 S~); the loads are issued before any use
  const float* dso = n + 1 < a.NS ? a.Ust + (sub + 1) * PN : (a.dS_out ? a.dS_out + bh * PN : nullptr);
  constexpr int kVec = PN / 4 / 256;
  float4 v[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k)
    v[k] = dso ? reinterpret_cast<const float4*>(dso)[tid + 256 * k] : make_float4(0.f, 0.f, 0.f, 0.f);
  float dot = 0.f;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int i = 4 * (tid + 256 * k), r = i / N, c = i % N;
    const bf16* s = Ss.at(r, c);
    dot += v[k].x * bf(s[0]) + v[k].y * bf(s[1]) + v[k].z * bf(s[2]) + v[k].w * bf(s[3]);
    put2(dSs.at(r, c), v[k].x, v[k].y);
    put2(dSs.at(r, c + 2), v[k].z, v[k].w);
  }
  dot = block_sum(dot, red, tid);  // also the barrier after dSs

  const float D = a.D[h];
  auto leaving = [&](int r) { return sc.E(Lc - 1, r / R); };
  auto is_last = [&](int r) { return r / R == nv - 1; };
  {  // dX
    Frag<16, 32> q;
    q.fill(0.f);
    mma_acc<N, Lay::Row, Lay::Col>(q, Bs, m0, dSs, wn * 32);  // B dSo^T
    row_dot(q, Xs, m0, wn * 32, rowX + wn * M);
    q.each([&](int r, int, float& x) { x *= leaving(m0 + r); });
    mma_acc<M, Lay::Col, Lay::Row>(q, Mm, m0, dYs, wn * 32);
    const float* fx = n + 1 < a.NS ? a.Fx + (sub + 1) * R * P : a.dxp_out ? a.dxp_out + bh * R * P : nullptr;
    q.each_pair([&](int r, int c, float& x0, float& x1) {
      r += m0, c += wn * 32;
      const int t = n * Lc + r / R;
      if (t >= a.T) return;
      const bf16* d = dYs.at(r, c);
      float v0 = x0 + D * bf(d[0]), v1 = x1 + D * bf(d[1]);
      if (fx && is_last(r)) v0 += fx[(r % R) * P + c], v1 += fx[(r % R) * P + c + 1];
      put2(a.dx + (a.tok(b, t, h) * R + r % R) * P + c, v0, v1);
    });
  }
  {  // dB
    Frag<16, N / 2> q;
    q.fill(0.f);
    mma_acc<P, Lay::Row, Lay::Row>(q, Xs, m0, dSs, wn * N / 2);  // X dSo
    q.each([&](int r, int, float& x) { x *= leaving(m0 + r); });
    mma_acc<M, Lay::Col, Lay::Row>(q, dGm, m0, Cs, wn * N / 2);
    const float* fb = n + 1 < a.NS ? a.Fb + (sub + 1) * R * N : a.dbp_out ? a.dbp_out + bh * R * N : nullptr;
    q.each_pair([&](int r, int c, float& x0, float& x1) {
      r += m0, c += wn * N / 2;
      const int t = n * Lc + r / R;
      if (t >= a.T) return;
      if (fb && is_last(r)) x0 += fb[(r % R) * N + c], x1 += fb[(r % R) * N + c + 1];
      put2(a.db + (a.tok(b, t, h) * R + r % R) * N + c, x0, x1);
    });
  }
  {  // dC
    Frag<16, N / 2> q;
    q.fill(0.f);
    mma_acc<P, Lay::Row, Lay::Row>(q, dYs, m0, Ss, wn * N / 2);  // dY S~
    row_dot(q, Cs, m0, wn * N / 2, rowC + wn * M);
    q.each([&](int r, int, float& x) { x *= sc.eA[(m0 + r) / R]; });
    mma_acc<M, Lay::Row, Lay::Row>(q, dGm, m0, Bs, wn * N / 2);
    q.each_pair([&](int r, int c, float& x0, float& x1) {
      r += m0, c += wn * N / 2;
      const int t = n * Lc + r / R;
      if (t < a.T) put2(a.dc + (a.tok(b, t, h) * R + r % R) * N + c, x0, x1);
    });
  }
  {  // dD partial: sum of dy x over the valid rows (padded rows are zeros)
    float s = 0.f;
    for (int i = tid; i < M * P; i += 256) s += bf(*dYs.at(i / P, i % P)) * bf(*Xs.at(i / P, i % P));
    s = block_sum(s, red, tid);  // also the barrier after rowX, rowC
    if (tid == 0) a.dDpart[(int64_t(b) * a.NSpad + n) * a.H + h] = s;
  }

  // The rest of dE and dacum: the leaving state's row Lc-1 of dE (rowX), the inter-chunk
  // term per row (rowC), and e_L <dSo, S~>.
  if (tid < Lc) {
    const int s = tid;
    float dEl = 0.f, inter = 0.f;
    for (int r = 0; r < R; ++r) dEl += rowX[s * R + r] + rowX[M + s * R + r], inter += rowC[s * R + r] + rowC[M + s * R + r];
    const float d = dEl * expf(sc.acum[Lc - 1] - sc.acum[s]);
    const float dw = d * (s < Lc - 1 ? sc.gam[s] + sc.bp[s + 1] : sc.gam[s]);
    minus[s] += dw, dgam[s] += d;
    if (s < Lc - 1) dbpn[s] += d;
    plus[s] += sc.eA[s] * inter;
    red[s] = dw;
  }
  __syncthreads();
  if (tid == 0) {  // plus[Lc-1] gets row Lc-1's sum; then suffix sums of dacum into red
    float p = sc.eA[Lc - 1] * dot;
    for (int s = 0; s < Lc; ++s) p += red[s];
    plus[Lc - 1] += p;
    float suffix = 0.f;
    for (int t = Lc - 1; t >= 0; --t) red[t] = suffix += plus[t] - minus[t];
  }
  __syncthreads();
  if (tid < nv) {  // acum is a cumulative sum of adt; bp_t = (1 - lam) dt, gam_t = lam dt
    const int t = tid;
    const float dbp = t == 0 ? a.Fd[sub] : dbpn[t - 1];
    const int64_t i = a.tok(b, n * Lc + t, h);
    a.dadt[i] = red[t];
    a.dlam[i] = (dgam[t] - dbp) * sc.dt[t];
    a.ddt[i] = dgam[t] * sc.lam[t] + dbp * (1.f - sc.lam[t]);
  }
}

// ---------------------------------------------------------------------------------------
// host side
// ---------------------------------------------------------------------------------------

struct Layout {
  int64_t NS, NSpad, Lc;
  size_t ust, sb, eL, fx, fb, fd, dd, bytes;
};

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

Layout layout_of(const Mamba3Dims& d) {
  SF_CHECK(d.P == P && d.N == N, "Mamba-3 CUDA core supports P = 64, N = 128 only (got P = ", d.P, ", N = ", d.N,
           "); run other sizes on the CPU");
  SF_CHECK(d.rank == 1 || d.rank == 2 || d.rank == 4, "Mamba-3 CUDA core supports rank 1, 2 or 4 (got ", d.rank,
           "); run other ranks on the CPU");
  SF_CHECK(d.batch >= 1 && d.heads >= 1 && d.len >= 1, "Mamba-3 CUDA core: empty problem (batch = ", d.batch,
           ", heads = ", d.heads, ", len = ", d.len, ")");
  SF_CHECK(d.batch <= 65535 && d.heads <= 65535 && d.len < (int64_t(1) << 30),
           "Mamba-3 CUDA core: batch and heads must be <= 65535 and len < 2^30");
  Layout l{};
  l.Lc = M / d.rank;
  l.NS = (d.len + l.Lc - 1) / l.Lc;
  l.NSpad = token_blocks(d.len) * d.rank;
  const size_t bh = size_t(d.batch * d.heads), subs = bh * size_t(l.NS);
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += align256(bytes);
    return at;
  };
  l.ust = take(subs * PN * 4);
  l.sb = take(subs * PN * 2);
  l.eL = take(subs * 4);
  l.fx = take(subs * d.rank * P * 4);
  l.fb = take(subs * d.rank * N * 4);
  l.fd = take(subs * 4);
  l.dd = take(size_t(d.batch) * l.NSpad * d.heads * 4);
  l.bytes = off;
  return l;
}

Args make_args(const Mamba3Dims& d, const Layout& l, const Mamba3CudaInputs& in, const Mamba3Edge<float>& edge_in,
               void* workspace) {
  SF_CHECK(workspace != nullptr, "Mamba-3 CUDA core: workspace is null; allocate mamba3_cuda_workspace_bytes(dims) bytes");
  SF_CHECK(in.x && in.b && in.c && in.adt && in.dt && in.lam && in.D, "Mamba-3 CUDA core: an input pointer is null");
  for (const void* p : {(const void*)in.x, (const void*)in.b, (const void*)in.c})
    check_aligned16(p, "Mamba-3 CUDA core", "x, b and c");
  Args a{};
  a.B = int(d.batch), a.T = int(d.len), a.H = int(d.heads), a.R = int(d.rank);
  a.Lc = int(l.Lc), a.NS = int(l.NS), a.NSpad = int(l.NSpad);
  a.x = in.x, a.b = in.b, a.c = in.c, a.adt = in.adt, a.dt = in.dt, a.lam = in.lam, a.D = in.D;
  a.S_in = edge_in.S, a.xp_in = edge_in.x_prev, a.bp_in = edge_in.b_prev;
  char* w = static_cast<char*>(workspace);
  a.Ust = reinterpret_cast<float*>(w + l.ust);
  a.Sb = reinterpret_cast<bf16*>(w + l.sb);
  a.eL = reinterpret_cast<float*>(w + l.eL);
  a.Fx = reinterpret_cast<float*>(w + l.fx);
  a.Fb = reinterpret_cast<float*>(w + l.fb);
  a.Fd = reinterpret_cast<float*>(w + l.fd);
  a.dDpart = reinterpret_cast<float*>(w + l.dd);
  return a;
}

// Launches one stage; with cfg.stage_ms, times it (synchronising) into stage_ms[slot].
class Stages {
 public:
  Stages(cudaStream_t s, float* ms) : stream_(s), ms_(ms) {}
  template <class K>
  void run(int slot, K kernel, dim3 grid, int smem, const Args& a, const char* name) {
    if (ms_) {
      cuda_check(cudaEventCreate(&t0_), "cudaEventCreate"), cuda_check(cudaEventCreate(&t1_), "cudaEventCreate");
      cuda_check(cudaEventRecord(t0_, stream_), "cudaEventRecord");
    }
    if (smem > 48 * 1024)
      cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), name);
    kernel<<<grid, 256, smem, stream_>>>(a);
    cuda_check_launch(name);
    if (ms_) {
      cuda_check(cudaEventRecord(t1_, stream_), "cudaEventRecord");
      cuda_check(cudaEventSynchronize(t1_), name);
      cuda_check(cudaEventElapsedTime(&ms_[slot], t0_, t1_), "cudaEventElapsedTime");
      cudaEventDestroy(t0_), cudaEventDestroy(t1_);
    }
  }

 private:
  cudaStream_t stream_;
  float* ms_;
  cudaEvent_t t0_{}, t1_{};
};

// contrib + scan of the forward pass (the backward recomputes them).
void state_pass(Stages& st, const Args& a, int slot) {
  const dim3 subs(a.NS, a.H, a.B), entries(PN / 256, a.H, a.B);
  st.run(slot, contrib_kernel<false>, subs, ContribSmem::bytes, a, "mamba3 contrib");
  auto scan = a.R == 1 ? forward_scan_kernel<1> : a.R == 2 ? forward_scan_kernel<2> : forward_scan_kernel<4>;
  st.run(slot + 1, scan, entries, 0, a, "mamba3 forward scan");
}

}  // namespace

size_t mamba3_cuda_workspace_bytes(const Mamba3Dims& d) { return layout_of(d).bytes; }

void mamba3_chunk_forward_cuda(const Mamba3Dims& d, const Mamba3CudaInputs& in, const Mamba3Edge<float>& edge_in,
                               bf16* y, const Mamba3EdgeOut<float>& edge_out, void* workspace, cudaStream_t stream,
                               const Mamba3CudaConfig& cfg) {
  const Layout l = layout_of(d);
  Args a = make_args(d, l, in, edge_in, workspace);
  SF_CHECK(y && edge_out.S && edge_out.x_prev && edge_out.b_prev, "Mamba-3 CUDA forward: y and every edge output are required");
  check_aligned16(y, "Mamba-3 CUDA forward", "y");
  a.y = y, a.S_out = edge_out.S, a.xp_out = edge_out.x_prev, a.bp_out = edge_out.b_prev;
  Stages st(stream, cfg.stage_ms);
  state_pass(st, a, 0);
  st.run(2, out_kernel, dim3(a.NS, a.H, a.B), OutSmem::bytes, a, "mamba3 out");
}

void mamba3_chunk_backward_cuda(const Mamba3Dims& d, const Mamba3CudaInputs& in, const Mamba3Edge<float>& edge_in,
                                const bf16* dy, const Mamba3Edge<float>& dedge_out, const Mamba3CudaGrads& g,
                                const Mamba3EdgeOut<float>& dedge_in, void* workspace, cudaStream_t stream,
                                const Mamba3CudaConfig& cfg) {
  const Layout l = layout_of(d);
  Args a = make_args(d, l, in, edge_in, workspace);
  SF_CHECK(dy && g.x && g.b && g.c && g.adt && g.dt && g.lam && g.D,
           "Mamba-3 CUDA backward: dy and every gradient output are required");
  SF_CHECK(dedge_in.S && dedge_in.x_prev && dedge_in.b_prev, "Mamba-3 CUDA backward: every edge gradient output is required");
  for (const void* p : {(const void*)dy, (const void*)g.x, (const void*)g.b, (const void*)g.c})
    check_aligned16(p, "Mamba-3 CUDA backward", "dy, dx, db and dc");
  a.dy = dy, a.dS_out = dedge_out.S, a.dxp_out = dedge_out.x_prev, a.dbp_out = dedge_out.b_prev;
  a.dx = g.x, a.db = g.b, a.dc = g.c, a.dadt = g.adt, a.ddt = g.dt, a.dlam = g.lam;
  a.dS_in = dedge_in.S, a.dxp_in = dedge_in.x_prev, a.dbp_in = dedge_in.b_prev;
  Stages st(stream, cfg.stage_ms);
  const dim3 subs(a.NS, a.H, a.B), entries(PN / 256, a.H, a.B);
  state_pass(st, a, 0);  // S~_n into Sb (the emitted edge is not written again)
  st.run(2, contrib_kernel<true>, subs, ContribSmem::bytes, a, "mamba3 contrib of dy");
  st.run(3, backward_scan_kernel, entries, 0, a, "mamba3 reverse scan");
  st.run(4, fold_kernel, subs, FoldSmem::bytes, a, "mamba3 fold gradient");
  cuda_check(cudaMemsetAsync(a.dDpart, 0, size_t(a.B) * a.NSpad * a.H * 4, stream), "mamba3 dD partials");
  st.run(5, grads_kernel, subs, GradSmem::bytes, a, "mamba3 grads");
  add_token_block_partials_cuda(a.dDpart, a.B, token_blocks(d.len), token_blocks(d.len), d.rank, d.heads, g.D, stream);
}

}  // namespace stateflow
