// Which sub-chunk a block of the per-sub-chunk stages (Pre, B1, B2) works on, and the L2 prefetch
// of a later block's inputs (GdnCudaConfig::walk, lever core_walk). Included by gdn_core.cu after
// Args, inside its anonymous namespace.
//
// The earlier launch is a grid (sub-chunks, heads, batch): the blocks on the GPU at one time are
// consecutive sub-chunks of one head, and each reads 64 rows of 256 bytes that lie 16 heads'
// rows (4 KiB) apart. The heads-first walk flattens (sub-chunk, head) into blockIdx.x with the
// head fastest, so the blocks side by side read whole 4 KiB token rows between them (and the
// same sectors of g and beta). And since these stages wait for their loads before any work (a
// block's loads are not overlapped with its own work), each block asks L2 to fetch the rows of the
// block `ahead` positions later -- about a wave of resident blocks -- so that block's copies find
// them there. Only the block order and the L2 changes: the same arithmetic on the same bytes.

// Sub-chunk n of head h of batch b.
struct SubChunkAt {
  int n, h, b;
};

// Block x of a heads-first grid (blockIdx.x = n * H + h, blockIdx.z = b).
__device__ inline SubChunkAt heads_first_at(const Args& a, int x) { return {x / a.H, x % a.H, int(blockIdx.z)}; }

// This block's sub-chunk: kHeadsFirst, the heads-first grid, else the grid (NS, H, B).
template <bool kHeadsFirst>
__device__ SubChunkAt this_sub_chunk(const Args& a) {
  if constexpr (kHeadsFirst) return heads_first_at(a, int(blockIdx.x));
  return {int(blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
}

__device__ inline void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

// The rows a sub-chunk's block reads from the [B, T, H, 128] bf16 tensors x0, x1 (and x2 when NX
// = 3), its g and beta when kDecays, and its C x C T (a.Tm) when kT: asked of L2 by the 256
// threads, one 128-byte line of a tensor's rows (two a row, 2 C a tensor) or one g or beta value
// each per step. (The tensors are picked by comparisons, not by indexing an array: that would put
// the array on the stack.)
template <int NX, bool kDecays, bool kT>
__device__ void prefetch_sub_chunk(const Args& a, SubChunkAt s, const bf16* x0, const bf16* x1, const bf16* x2,
                                   int tid) {
  const int t0 = s.n * C, nv = min(C, a.T - t0);
  const int64_t r0 = a.tok(s.b, t0, s.h);
#pragma unroll
  for (int j = 0; j < (NX * 2 * C + 255) / 256; ++j) {
    const int i = tid + 256 * j, x = i / (2 * C), row = (i % (2 * C)) / 2, half = i % 2;
    const bf16* base = x == 0 ? x0 : x == 1 ? x1 : x2;
    if (i < NX * 2 * C && row < nv) prefetch_l2(base + (r0 + int64_t(row) * a.H) * 128 + half * 64);
  }
  if constexpr (kDecays) {
    if (tid < nv) prefetch_l2(a.g + r0 + int64_t(tid) * a.H);
    else if (tid >= C && tid - C < nv) prefetch_l2(a.beta + r0 + int64_t(tid - C) * a.H);
  }
  if constexpr (kT) {  // C x C bf16: 64 lines
    if (tid >= 2 * C && tid < 3 * C) prefetch_l2(a.Tm + a.ws_sub(s.b, s.h, s.n) * C * C + (tid - 2 * C) * 64);
  }
}

// The block `ahead` positions after this one in a heads-first grid, if there is one (same batch).
__device__ inline bool block_ahead(const Args& a, int ahead, SubChunkAt& s) {
  const int x = int(blockIdx.x) + ahead;
  if (ahead <= 0 || x >= int(gridDim.x)) return false;
  s = heads_first_at(a, x);
  return true;
}
