// B2 in less shared memory (GdnCudaConfig::b2 = kB2Lean, lever b2_lean): dV_new_local = P^T dO with
// P = s (Q K^T) ⊙ Gam, bitwise dvloc_kernel's. Included by gdn_core.cu after dvloc_kernel and
// gdn_core_pre.cuh (store_block), inside its anonymous namespace.
//
// dvloc_kernel holds Q, K, dO and P (60 KiB: three blocks per SM) and waits for all of its loads
// before its first product. B2 moves 64 KiB a sub-chunk and does little arithmetic, so what it
// needs is bytes in flight. Here:
// - P goes where Q was (Q is dead once Q K^T is formed), and the warps' store tiles after it:
//   51 KiB, four blocks per SM (registers held to 64 a thread to match);
// - dO is a second copy group: Q K^T runs while it lands;
// - the products skip what is zero by the causal mask: the 16 x 32 blocks of Q K^T above the
//   diagonal (two of eight warps), and the K steps c < 16 wm of P^T dO (P^T is upper triangular),
//   so each accumulator adds the same products in the same order minus exact zeros;
// - dV_new_local leaves through each warp's 16 x 16 staging tile, a 16-byte store per lane
//   (store_block), instead of 4-byte stores of accumulator pairs.

struct DvlocLeanSmem {
  static constexpr int q = 0;  // Q, then P and the staging tiles
  static constexpr int k = q + Tile<C, DK>::bytes;
  static constexpr int dO = k + Tile<C, DK>::bytes;
  static constexpr int G = dO + Tile<C, DV>::bytes;
  static constexpr int bytes = G + C * 4;
  static constexpr int P = q;
  static constexpr int stage = P + Tile<C, C>::bytes;
  static_assert(stage + 8 * Tile<PB, PB>::bytes <= k, "P and the staging tiles fit where Q was");
};

__global__ void __launch_bounds__(256, 4) dvloc_lean_kernel(Args a) {
  using S = DvlocLeanSmem;
  extern __shared__ __align__(128) char sm[];
  const int n = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x, warp = tid >> 5;
  const int wm = warp & 3, wn = warp >> 2;
  const int t0 = n * C, nv = min(C, a.T - t0);
  const int64_t r0 = a.tok(b, t0, h), ws0 = a.ws_row(b, h, n);
  auto Qs = tile_at<Tile<C, DK>>(sm, S::q), Ks = tile_at<Tile<C, DK>>(sm, S::k);
  auto dOs = tile_at<Tile<C, DV>>(sm, S::dO);
  auto Ps = tile_at<Tile<C, C>>(sm, S::P);
  float* G = reinterpret_cast<float*>(sm + S::G);
  const BlockCopy<Tile<C, DK>, true> copy_rows(tid);  // DV = DK: one plan for q, k and dO
  copy_rows(Qs, a.q + r0 * DK, int64_t(a.H) * DK, nv);
  copy_rows(Ks, a.k + r0 * DK, int64_t(a.H) * DK, nv);
  cuda::load_floats_async<256>(G, a.G + ws0, C, tid);
  cuda::cp_async_commit();
  copy_rows(dOs, a.dO + r0 * DV, int64_t(a.H) * DV, nv);
  cuda::cp_async_commit();
  cuda::cp_async_wait<1>();
  __syncthreads();
  {
    Frag<16, 32> qk;
    qk.fill(0.f);
    if (32 * wn <= 16 * wm + 15) mma_acc<DK, Lay::Row, Lay::Col>(qk, Qs, wm * 16, Ks, wn * 32);
    __syncthreads();  // every warp is done with Q before P overwrites it
    store_P(qk, Ps, G, a.scale, wm, wn);
  }
  cuda::cp_async_wait<0>();
  __syncthreads();
  // Rows 16 wm.. of P^T dO, columns 64 wn..: P^T[r][c] = P[c][r] is zero for c < r, so the K steps
  // start at block wm (mma_acc's order of steps and n-tiles otherwise).
  Frag<16, DV / 2> d;
  d.fill(0.f);
#pragma unroll
  for (int kb = 0; kb < C / 16; ++kb) {
    if (kb < wm) continue;
    uint32_t af[4];
    cuda::load_a<Lay::Col>(af, Ps, wm * 16, 16 * kb);
#pragma unroll
    for (int j = 0; j < DV / 2 / 8; j += 2) {
      uint32_t bf[4];
      cuda::load_b2<Lay::Row>(bf, dOs, wn * DV / 2 + 8 * j, 16 * kb);
      mma_bf16(d.x[0][j], af, bf[0], bf[1]);
      mma_bf16(d.x[0][j + 1], af, bf[2], bf[3]);
    }
  }
  const auto stage = tile_at<Tile<PB, PB>>(sm, S::stage + warp * Tile<PB, PB>::bytes);
#pragma unroll
  for (int q = 0; q < DV / 2 / PB; ++q) {
    Frag<PB, PB> part;
#pragma unroll
    for (int e = 0; e < 4; ++e) part.x[0][0][e] = d.x[0][2 * q][e], part.x[0][1][e] = d.x[0][2 * q + 1][e];
    store_block(part, stage, a.dVn + ws0 * DV, wm * 16, wn * DV / 2 + PB * q);
  }
}
