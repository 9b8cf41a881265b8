// Prefix attention kernels (prefix_attention_cuda.h): flash-attention forward, and a backward
// of three kernels (delta, dK/dV, dQ), all on mma.sync tiles from kernels/cuda/mma_tile.cuh.
// The next block's tiles load (cp.async) while one is computed; the forward's probabilities
// and dQ's score gradients stay in registers as the A operand of the following product.
// Scores live in the base-2 domain inside the kernels (exp2 of scale * log2(e) * q.k);
// lse is stored as a natural log like the CPU reference's.
#include <cmath>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/mma_tile.cuh"
#include "mixers/attention/prefix_attention_cuda.h"

namespace stateflow {

using cuda::bf16;
using cuda::Frag;
using cuda::Lay;
using cuda::Tile;

namespace {

constexpr int BM = int(kAttentionBlock);  // query rows per block
constexpr int BN = int(kAttentionBlock);  // key rows per block
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

struct Args {
  const bf16 *q, *k, *v, *o, *dout;
  const float* lse;
  float* delta;  // backward workspace, [batch, len, q_heads]
  bf16* out;     // forward: o; backward: dq
  float* lse_out;
  float *dk, *dv;
  int batch, len, offset, kv_rows, q_heads, kv_heads;
  float scale, scale_log2;

  __device__ int group() const { return q_heads / kv_heads; }
  __device__ int64_t q_row(int b, int i, int h) const { return ((int64_t(b) * len + i) * q_heads + h); }
  __device__ int64_t kv_row(int b, int j, int g) const { return ((int64_t(b) * kv_rows + j) * kv_heads + g); }
  __device__ int kv_len() const { return offset + len; }
};

// The elements one thread holds of a warp's 16-row accumulator: f(row, col, index j, element e).
template <int N, class F>
__device__ void each_index(F&& f) {
  const int l = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) f((l >> 2) + (e >> 1) * 8, j * 8 + 2 * (l & 3) + (e & 1), j, e);
}

__device__ inline float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// acc(16 x WN) += A(16 x K) B(K x WN) where A is a warp's fp32 accumulator (scores or their
// gradients): the mma.sync C layout of a 16 x K tile, packed to bf16 pairs, is the A-operand
// layout of the next product, so P never goes through shared memory. B from shared memory.
__device__ inline uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

template <int K, Lay LB, int WN, class TB>
__device__ void mma_acc_from_regs(Frag<16, WN>& acc, const Frag<16, K>& a, TB b, int n0) {
  static_assert(WN % 16 == 0, "pairs of 8-column tiles");
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    const uint32_t af[4] = {pack_bf16(a.x[0][2 * kk][0], a.x[0][2 * kk][1]),
                            pack_bf16(a.x[0][2 * kk][2], a.x[0][2 * kk][3]),
                            pack_bf16(a.x[0][2 * kk + 1][0], a.x[0][2 * kk + 1][1]),
                            pack_bf16(a.x[0][2 * kk + 1][2], a.x[0][2 * kk + 1][3])};
#pragma unroll
    for (int j = 0; j < WN / 8; j += 2) {
      uint32_t bf[4];
      cuda::load_b2<LB>(bf, b, n0 + 8 * j, 16 * kk);
      cuda::mma_bf16(acc.x[0][j], af, bf[0], bf[1]);
      cuda::mma_bf16(acc.x[0][j + 1], af, bf[2], bf[3]);
    }
  }
}

// K and V blocks of 64 rows in two buffers: block n + 1 loads while block n is computed.
template <int D>
struct KvStages {
  using RowTile = Tile<BN, D>;
  static constexpr int bytes = 4 * RowTile::bytes;
  unsigned char* base;
  __device__ RowTile k(int stage) const { return {reinterpret_cast<bf16*>(base + (2 * stage) * RowTile::bytes)}; }
  __device__ RowTile v(int stage) const { return {reinterpret_cast<bf16*>(base + (2 * stage + 1) * RowTile::bytes)}; }
  // Issues the loads of key rows [j0, j0 + 64) (rows at or past kv_len zero-filled) into `stage`.
  template <int NT>
  __device__ void load(int stage, const bf16* kg, const bf16* vg, int64_t kstride, int j0, int kv_len, int tid) const {
    const int valid = min(BN, kv_len - j0);
    cuda::load_tile_async<NT>(k(stage), kg + j0 * kstride, kstride, valid, tid);
    cuda::load_tile_async<NT>(v(stage), vg + j0 * kstride, kstride, valid, tid);
    cuda::cp_async_commit();
  }
};

// What a forward or dQ thread block works on: 64 query rows of one head of one sequence, and
// the K/V rows of that head's group.
template <int D>
struct QueryBlock {
  int i0, h, b, rows, keys;  // keys [0, keys) are seen by some row of the block
  int64_t qstride, kstride;
  const bf16 *kg, *vg;
  __device__ explicit QueryBlock(const Args& a)
      : i0(blockIdx.x * BM), h(blockIdx.y), b(blockIdx.z), rows(min(BM, a.len - i0)), keys(a.offset + i0 + rows),
        qstride(int64_t(a.q_heads) * D), kstride(int64_t(a.kv_heads) * D),
        kg(a.k + a.kv_row(b, 0, h / a.group()) * D), vg(a.v + a.kv_row(b, 0, h / a.group()) * D) {}
  __device__ const bf16* rows_of(const bf16* x, const Args& a) const { return x + a.q_row(b, i0, h) * D; }
};

// ---- forward: one block per (64 query rows, query head, sequence); warp w owns rows 16w..16w+15.

template <int D>
__global__ void __launch_bounds__(128) forward_kernel(Args a) {
  constexpr int NT = 128;
  using RowTile = Tile<BM, D>;
  extern __shared__ __align__(16) unsigned char smem[];
  const RowTile qs{reinterpret_cast<bf16*>(smem)};
  const KvStages<D> kv{smem + RowTile::bytes};
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
  const QueryBlock<D> qb(a);
  const int i0 = qb.i0, h = qb.h, b = qb.b, keys = qb.keys;
  const int64_t kstride = qb.kstride;
  const bf16 *kg = qb.kg, *vg = qb.vg;

  cuda::load_tile_async<NT>(qs, qb.rows_of(a.q, a), qb.qstride, qb.rows, tid);
  kv.template load<NT>(0, kg, vg, kstride, 0, a.kv_len(), tid);
  Frag<16, D> acc;
  acc.fill(0.f);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int pos0 = a.offset + i0 + 16 * w;  // position of the warp's first row

  for (int j0 = 0, stage = 0; j0 < keys; j0 += BN, stage ^= 1) {
    cuda::cp_async_wait<0>();
    __syncthreads();  // this block's K, V are in; every warp is done with the other stage
    if (j0 + BN < keys) kv.template load<NT>(stage ^ 1, kg, vg, kstride, j0 + BN, a.kv_len(), tid);

    Frag<16, BN> s;
    s.fill(0.f);
    cuda::mma_acc<D, Lay::Row, Lay::Col>(s, qs, 16 * w, kv.k(stage), 0);
    float mx[2] = {m[0], m[1]};
    each_index<BN>([&](int r, int c, int j, int e) {
      float& x = s.x[0][j][e];
      x = j0 + c <= pos0 + r ? x * a.scale_log2 : -INFINITY;
      mx[e >> 1] = fmaxf(mx[e >> 1], x);
    });
    float alpha[2], rsum[2] = {0.f, 0.f};
#pragma unroll
    for (int t = 0; t < 2; ++t) mx[t] = quad_max(mx[t]), alpha[t] = exp2f(m[t] - mx[t]), m[t] = mx[t];
    // Key 0 is in the first block and every row sees it, so m is finite from the first block on.
    each_index<BN>([&](int, int, int j, int e) {
      float& x = s.x[0][j][e];
      x = exp2f(x - m[e >> 1]);
      rsum[e >> 1] += x;
    });
#pragma unroll
    for (int t = 0; t < 2; ++t) l[t] = l[t] * alpha[t] + rsum[t];
    acc.each([&](int r, int, float& x) { x *= alpha[r >= 8]; });
    mma_acc_from_regs<BN, Lay::Row>(acc, s, kv.v(stage), 0);
  }

#pragma unroll
  for (int t = 0; t < 2; ++t) l[t] = cuda::quad_sum(l[t]);
  acc.each_pair([&](int r, int c, float& x0, float& x1) {
    const int i = i0 + 16 * w + r;
    if (i < a.len) cuda::put2(a.out + a.q_row(b, i, h) * D + c, x0 / l[r >= 8], x1 / l[r >= 8]);
  });
  if ((lane & 3) == 0)
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int i = i0 + 16 * w + (lane >> 2) + 8 * t;
      if (i < a.len) a.lse_out[a.q_row(b, i, h)] = (m[t] + log2f(l[t])) * kLn2;
    }
}

// ---- backward

// delta = rowsum(dout * o), one warp per (token, query head) row of D elements.
template <int D>
__global__ void delta_kernel(Args a, int64_t n_rows) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= n_rows) return;
  const int lane = threadIdx.x & 31;
  float s = 0.f;
#pragma unroll
  for (int e = lane; e < D; e += 32) s += cuda::bf(a.dout[row * D + e]) * cuda::bf(a.o[row * D + e]);
#pragma unroll
  for (int k = 16; k >= 1; k /= 2) s += __shfl_xor_sync(0xffffffffu, s, k);
  if (lane == 0) a.delta[row] = s;
}

// dK, dV of 64 key rows of one K/V head: sums over the query blocks that see them, the last
// first, and inside each over the group's query heads (one "round" each; the next round's Q,
// dO load while one is computed); continues from the fp32 values in a.dk / a.dv (the later
// chunks' shares). Warp w owns key rows 16 (w % 4).. and, at D = 256, the dK/dV column half
// w / 4 (so no warp holds more than 16 x 128 of each accumulator).
template <int D>
__global__ void __launch_bounds__(D) dkdv_kernel(Args a) {
  constexpr int NW = D / 32, NT = D, NC = NW / 4, SN = BM / NC, DC = D / NC;
  using RowTile = Tile<BM, D>;
  using PTile = Tile<BN, BM>;
  extern __shared__ __align__(16) unsigned char smem[];
  auto row_tile = [&](int i) { return RowTile{reinterpret_cast<bf16*>(smem + i * RowTile::bytes)}; };
  const RowTile ks = row_tile(0), vs = row_tile(1);
  const RowTile qs[2] = {row_tile(2), row_tile(3)}, dos[2] = {row_tile(4), row_tile(5)};
  const PTile pts{reinterpret_cast<bf16*>(smem + 6 * RowTile::bytes)};
  const PTile dss{reinterpret_cast<bf16*>(smem + 6 * RowTile::bytes + PTile::bytes)};
  float* lse2 = reinterpret_cast<float*>(smem + 6 * RowTile::bytes + 2 * PTile::bytes);  // [2][BM]
  float* dl = lse2 + 2 * BM;                                                              // [2][BM]
  const int tid = threadIdx.x, w = tid >> 5, rw = w & 3, cw = w >> 2;
  const int j0 = blockIdx.x * BN, g = blockIdx.y, b = blockIdx.z;
  const int64_t qstride = int64_t(a.q_heads) * D, kstride = int64_t(a.kv_heads) * D;
  const int valid = min(BN, a.kv_len() - j0);
  cuda::load_tile_async<NT>(ks, a.k + a.kv_row(b, j0, g) * D, kstride, valid, tid);
  cuda::load_tile_async<NT>(vs, a.v + a.kv_row(b, j0, g) * D, kstride, valid, tid);
  cuda::cp_async_commit();

  // Round r: query block last_qb - r / group, query head g * group + r % group.
  const int first_qb = max(0, j0 - a.offset) / BM, last_qb = (a.len - 1) / BM, group = a.group();
  const int rounds = (last_qb - first_qb + 1) * group;
  auto load_round = [&](int r, int stage) {
    const int i0 = (last_qb - r / group) * BM, h = g * group + r % group, rows = min(BM, a.len - i0);
    cuda::load_tile_async<NT>(qs[stage], a.q + a.q_row(b, i0, h) * D, qstride, rows, tid);
    cuda::load_tile_async<NT>(dos[stage], a.dout + a.q_row(b, i0, h) * D, qstride, rows, tid);
    cuda::cp_async_commit();
    if (tid < BM) {
      const int i = i0 + tid;
      lse2[stage * BM + tid] = i < a.len ? a.lse[a.q_row(b, i, h)] * kLog2e : 0.f;
      dl[stage * BM + tid] = i < a.len ? a.delta[a.q_row(b, i, h)] : 0.f;
    }
  };
  load_round(0, 0);

  Frag<16, DC> dk, dv;
  auto each_kv = [&](auto&& f) {  // f(key row, column in the head, &dk pair, &dv pair) for this thread's elements
    const int l = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < DC / 8; ++j)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        f(j0 + 16 * rw + (l >> 2) + 8 * hf, cw * DC + j * 8 + 2 * (l & 3), dk.x[0][j] + 2 * hf, dv.x[0][j] + 2 * hf);
  };
  each_kv([&](int j, int col, float* k2, float* v2) {
    const bool in = j < a.kv_len();
    const float2 kk = in ? *reinterpret_cast<const float2*>(a.dk + a.kv_row(b, j, g) * D + col) : float2{0.f, 0.f};
    const float2 vv = in ? *reinterpret_cast<const float2*>(a.dv + a.kv_row(b, j, g) * D + col) : float2{0.f, 0.f};
    k2[0] = kk.x, k2[1] = kk.y, v2[0] = vv.x, v2[1] = vv.y;
  });

  for (int r = 0, stage = 0; r < rounds; ++r, stage ^= 1) {
    cuda::cp_async_wait<0>();
    __syncthreads();  // round r's tiles are in; every warp is done with round r - 1's
    if (r + 1 < rounds) load_round(r + 1, stage ^ 1);
    const int i0 = (last_qb - r / group) * BM;
    const float* lse2_r = lse2 + stage * BM;
    const float* dl_r = dl + stage * BM;

    Frag<16, SN> st, dpt;  // S^T and dP^T: rows = keys, columns = queries
    st.fill(0.f), dpt.fill(0.f);
    cuda::mma_acc<D, Lay::Row, Lay::Col>(st, ks, 16 * rw, qs[stage], cw * SN);
    cuda::mma_acc<D, Lay::Row, Lay::Col>(dpt, vs, 16 * rw, dos[stage], cw * SN);
    each_index<SN>([&](int r_, int c, int j, int e) {
      const int key = j0 + 16 * rw + r_, qc = cw * SN + c, i = i0 + qc;
      const bool seen = i < a.len && key <= a.offset + i;
      const float p = seen ? exp2f(st.x[0][j][e] * a.scale_log2 - lse2_r[qc]) : 0.f;
      st.x[0][j][e] = p;
      dpt.x[0][j][e] = p * (dpt.x[0][j][e] - dl_r[qc]) * a.scale;
    });
    st.each_pair([&](int r_, int c, float& p0, float& p1) { cuda::put2(pts.at(16 * rw + r_, cw * SN + c), p0, p1); });
    dpt.each_pair([&](int r_, int c, float& d0, float& d1) { cuda::put2(dss.at(16 * rw + r_, cw * SN + c), d0, d1); });
    __syncthreads();
    cuda::mma_acc<BM, Lay::Row, Lay::Row>(dv, pts, 16 * rw, dos[stage], cw * DC);
    cuda::mma_acc<BM, Lay::Row, Lay::Row>(dk, dss, 16 * rw, qs[stage], cw * DC);
  }

  each_kv([&](int j, int col, float* k2, float* v2) {
    if (j >= a.kv_len()) return;
    *reinterpret_cast<float2*>(a.dk + a.kv_row(b, j, g) * D + col) = float2{k2[0], k2[1]};
    *reinterpret_cast<float2*>(a.dv + a.kv_row(b, j, g) * D + col) = float2{v2[0], v2[1]};
  });
}

// dQ of 64 query rows of one head: like the forward, over key blocks from key 0 up.
template <int D>
__global__ void __launch_bounds__(128) dq_kernel(Args a) {
  constexpr int NT = 128;
  using RowTile = Tile<BM, D>;
  extern __shared__ __align__(16) unsigned char smem[];
  const RowTile qs{reinterpret_cast<bf16*>(smem)};
  const RowTile dos{reinterpret_cast<bf16*>(smem + RowTile::bytes)};
  const KvStages<D> kv{smem + 2 * RowTile::bytes};
  const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31;
  const QueryBlock<D> qb(a);
  const int i0 = qb.i0, h = qb.h, b = qb.b, keys = qb.keys;
  const int64_t kstride = qb.kstride;
  const bf16 *kg = qb.kg, *vg = qb.vg;
  cuda::load_tile_async<NT>(qs, qb.rows_of(a.q, a), qb.qstride, qb.rows, tid);
  cuda::load_tile_async<NT>(dos, qb.rows_of(a.dout, a), qb.qstride, qb.rows, tid);
  kv.template load<NT>(0, kg, vg, kstride, 0, a.kv_len(), tid);
  float lse2[2], dl[2];
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    const int i = i0 + 16 * w + (lane >> 2) + 8 * t;
    lse2[t] = i < a.len ? a.lse[a.q_row(b, i, h)] * kLog2e : 0.f;
    dl[t] = i < a.len ? a.delta[a.q_row(b, i, h)] : 0.f;
  }
  const int pos0 = a.offset + i0 + 16 * w;
  Frag<16, D> dq;
  dq.fill(0.f);

  for (int j0 = 0, stage = 0; j0 < keys; j0 += BN, stage ^= 1) {
    cuda::cp_async_wait<0>();
    __syncthreads();
    if (j0 + BN < keys) kv.template load<NT>(stage ^ 1, kg, vg, kstride, j0 + BN, a.kv_len(), tid);

    Frag<16, BN> s, dp;
    s.fill(0.f), dp.fill(0.f);
    cuda::mma_acc<D, Lay::Row, Lay::Col>(s, qs, 16 * w, kv.k(stage), 0);
    cuda::mma_acc<D, Lay::Row, Lay::Col>(dp, dos, 16 * w, kv.v(stage), 0);
    each_index<BN>([&](int r, int c, int j, int e) {  // s <- dS, scaled
      const float p = j0 + c <= pos0 + r ? exp2f(s.x[0][j][e] * a.scale_log2 - lse2[e >> 1]) : 0.f;
      s.x[0][j][e] = p * (dp.x[0][j][e] - dl[e >> 1]) * a.scale;
    });
    mma_acc_from_regs<BN, Lay::Row>(dq, s, kv.k(stage), 0);
  }
  dq.each_pair([&](int r, int c, float& x0, float& x1) {
    const int i = i0 + 16 * w + r;
    if (i < a.len) cuda::put2(a.out + a.q_row(b, i, h) * D + c, x0, x1);
  });
}

template <int D>
constexpr int forward_smem() {
  return Tile<BM, D>::bytes + KvStages<D>::bytes;
}
template <int D>
constexpr int dq_smem() {
  return 2 * Tile<BM, D>::bytes + KvStages<D>::bytes;
}
template <int D>
constexpr int dkdv_smem() {
  return 6 * Tile<BM, D>::bytes + 2 * Tile<BN, BM>::bytes + 4 * BM * int(sizeof(float));
}

template <class Kernel>
void launch(Kernel kernel, dim3 grid, int threads, int smem, cudaStream_t stream, const Args& a, const char* what) {
  cuda_check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
             "raising the shared-memory limit of the attention kernels");
  kernel<<<grid, threads, smem, stream>>>(a);
  cuda_check_launch(what);
}

Args make_args(const AttentionDims& d) {
  check_attention_dims_cuda(d);
  Args a{};
  a.batch = int(d.batch), a.len = int(d.len), a.offset = int(d.offset), a.kv_rows = int(d.kv_rows);
  a.q_heads = int(d.q_heads), a.kv_heads = int(d.kv_heads);
  a.scale = float(d.scale), a.scale_log2 = float(d.scale * 1.4426950408889634);
  return a;
}

int64_t blocks_of(int64_t n) { return (n + kAttentionBlock - 1) / kAttentionBlock; }

template <int D>
void forward_d(const AttentionDims& d, const Args& a, cudaStream_t st) {
  launch(forward_kernel<D>, dim3(unsigned(blocks_of(d.len)), unsigned(d.q_heads), unsigned(d.batch)), 128,
         forward_smem<D>(), st, a, "attention forward kernel");
}

template <int D>
void backward_d(const AttentionDims& d, const Args& a, cudaStream_t st) {
  const int64_t rows = d.batch * d.len * d.q_heads;
  delta_kernel<D><<<unsigned((rows + 7) / 8), 256, 0, st>>>(a, rows);
  cuda_check_launch("attention delta kernel");
  launch(dkdv_kernel<D>, dim3(unsigned(blocks_of(d.offset + d.len)), unsigned(d.kv_heads), unsigned(d.batch)), D,
         dkdv_smem<D>(), st, a, "attention dK/dV kernel");
  launch(dq_kernel<D>, dim3(unsigned(blocks_of(d.len)), unsigned(d.q_heads), unsigned(d.batch)), 128, dq_smem<D>(),
         st, a, "attention dQ kernel");
}

}  // namespace

void check_attention_dims_cuda(const AttentionDims& d) {
  check_attention_dims(d);
  SF_CHECK(d.head_dim == 128 || d.head_dim == 256, "attention: head_dim ", d.head_dim,
           " has no GPU kernel (supported on the GPU: 128 and 256); use one of those or run on the CPU");
  SF_CHECK(d.kv_rows * d.batch * d.kv_heads < (int64_t(1) << 31) && d.len * d.batch * d.q_heads < (int64_t(1) << 31),
           "attention: ", d.batch, " sequences of ", d.kv_rows, " rows are too many for the GPU kernels' 32-bit row "
           "indices; use smaller microbatches");
  SF_CHECK(d.len <= int64_t(65535) * kAttentionBlock && d.q_heads <= 65535 && d.batch <= 65535,
           "attention: chunk of ", d.len, " tokens x ", d.q_heads, " heads x batch ", d.batch,
           " exceeds the GPU launch grid; use shorter chunks or smaller microbatches");
}

size_t prefix_attention_kernels_workspace_bytes(const AttentionDims& d) {
  return size_t(d.batch * d.len * d.q_heads) * sizeof(float);
}

void prefix_attention_forward_kernels(const AttentionDims& d, const bf16* q, const bf16* k, const bf16* v, bf16* o,
                                     float* lse, cudaStream_t stream) {
  Args a = make_args(d);
  a.q = q, a.k = k, a.v = v, a.out = o, a.lse_out = lse;
  if (d.head_dim == 128) forward_d<128>(d, a, stream);
  else forward_d<256>(d, a, stream);
}

void prefix_attention_backward_kernels(const AttentionDims& d, const bf16* q, const bf16* k, const bf16* v,
                                    const bf16* o, const float* lse, const bf16* dout, bf16* dq, float* dk,
                                    float* dv, void* workspace, cudaStream_t stream) {
  Args a = make_args(d);
  a.q = q, a.k = k, a.v = v, a.o = o, a.lse = lse, a.dout = dout, a.out = dq, a.dk = dk, a.dv = dv;
  a.delta = static_cast<float*>(workspace);
  if (d.head_dim == 128) backward_d<128>(d, a, stream);
  else backward_d<256>(d, a, stream);
}

}  // namespace stateflow
