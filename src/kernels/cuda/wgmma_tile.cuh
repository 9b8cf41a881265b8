// Warpgroup tensor-core products (wgmma, sm_90a) on bf16 tiles in shared memory, for kernels
// written against mma_tile.cuh's warp-level products: a warpgroup (4 consecutive warps) issues one
// wgmma for all 64 rows of an operand, and each warp receives rows 16 w .. 16 w + 15 (w = warp % 4)
// in exactly the register layout of a Frag<16, WN> (the m16n8 accumulator repeated over n). So a
// kernel whose warps w of a group hold Frag<16, WN> rows 16 w.. swaps mma_acc for wgmma_acc and
// keeps its epilogues. Both operands are read by the tensor cores straight from shared memory
// through descriptors: no ldmatrix, no fragment registers, one instruction per 64 x WN x 16.
//
// The operands live in CoreTile: 8 x 8 blocks of 128 contiguous bytes ("core matrices", the
// no-swizzle layout wgmma reads), block (r / 8, c / 8) at block index (r / 8) (COLS / 8) + c / 8.
// One tile serves as a K-major operand (rows are M or N, columns K) and as an M/N-major one (rows
// K): only the descriptor's two strides differ. ldmatrix and plain element accesses work on it too.
//
// Only sm_90a machine code holds the wgmma instructions (built for another target, a product
// traps): host code picks a kernel using them only in a build with sm_90a code
// (STATEFLOW_CUDA_SM90A, set by CMake) on a compute capability 9.x device, as
// gdn_cuda_wgmma_available() does.
#pragma once
#include "kernels/cuda/mma_tile.cuh"

namespace stateflow::cuda {

template <int ROWS, int COLS>
struct CoreTile {
  static_assert(ROWS % 8 == 0 && COLS % 8 == 0, "core-matrix tiles are made of 8 x 8 blocks");
  static constexpr int rows = ROWS, cols = COLS;
  static constexpr int bytes = ROWS * COLS * 2;
  static constexpr int row_block_bytes = COLS * 16;  // one row of 8 x 8 blocks
  bf16* p;
  __device__ bf16* at(int r, int c) const { return p + (r >> 3) * (COLS * 8) + (c >> 3) * 64 + (r & 7) * 8 + (c & 7); }
};

// Tile t seen from its column c0 on (c0 a multiple of 8): the operand of a product over those columns.
template <int R, int CC>
__device__ CoreTile<R, CC> columns_from(CoreTile<R, CC> t, int c0) {
  return CoreTile<R, CC>{t.p + (c0 >> 3) * 64};
}

// Rows [0, n_valid) of a core-matrix tile from global memory (row r at g + r * gstride, 16-byte
// aligned), zeros below; NT threads. Consecutive threads take consecutive rows of one 8-row
// block, so a warp fills whole 128-byte blocks (no bank conflicts) and reads 64-byte row pieces.
template <int NT, int R, int CC>
__device__ void load_tile_async(CoreTile<R, CC> t, const bf16* g, int64_t gstride, int n_valid, int tid) {
  constexpr int chunks = CC / 8;
  for (int i = tid; i < R * chunks; i += NT) {
    const int r = (i & 7) + ((i >> 3) / chunks) * 8, c = ((i >> 3) % chunks) * 8;
    const bool ok = r < n_valid;
    cp_async16(t.at(r, c), ok ? g + r * gstride + c : g, ok);
  }
}

// TileCopy (mma_tile.cuh) for core-matrix tiles: consecutive threads take consecutive rows of one
// 8-row block, so a warp fills whole 128-byte blocks (no bank conflicts) and reads 64-byte row
// pieces; the offsets are computed once per thread.
template <int NT, int R, int CC>
struct TileCopy<NT, CoreTile<R, CC>> {
  static constexpr int chunks = CC / 8, step = NT / chunks, per_thread = R / step;
  static_assert(NT % (8 * chunks) == 0 && R % step == 0, "the threads must split the tile into whole 8-row blocks");
  int r0, c0;
  __device__ explicit TileCopy(int tid) : r0((tid & 7) + (tid >> 3) / chunks * 8), c0((tid >> 3) % chunks * 8) {}
  // Rows [0, n_valid) of the tile from g (row r at g + r * gstride, 16-byte aligned), zeros below.
  __device__ void operator()(CoreTile<R, CC> tile, const bf16* g, int64_t gstride, int n_valid = R) const {
    const bf16* src = g + r0 * gstride + c0;
    bf16* dst = tile.at(r0, c0);
#pragma unroll
    for (int i = 0; i < per_thread; ++i) {  // step rows are step / 8 whole rows of blocks
      const bool ok = r0 + i * step < n_valid;
      cp_async16(dst + i * step * CC, ok ? src + i * step * gstride : g, ok);
    }
  }
};

// Makes this thread's ordinary shared-memory writes (stores, finished cp.async copies) visible to
// the tensor cores' reads, which go through the async proxy; a barrier must follow.
__device__ inline void fence_for_wgmma() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// No-swizzle shared-memory descriptor: start address, leading (K-direction) and stride
// (M/N-direction) byte offsets between 8 x 8 core matrices, each in 16-byte units.
__device__ inline uint64_t wgmma_desc(const bf16* p, uint32_t k_stride, uint32_t mn_stride) {
  return uint64_t((smem_u32(p) & 0x3FFFF) >> 4) | uint64_t(k_stride >> 4) << 16 | uint64_t(mn_stride >> 4) << 32;
}

// acc(64 x WN, this warp's rows) += A(64 x 16) B(16 x WN); TA, TB: 1 = M/N-major (transposed) operand.
template <int TA, int TB>
__device__ void wgmma_m64n64(float (&d)[8][4], uint64_t da, uint64_t db) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB));
#else
  __trap();
#endif
}

template <int TA, int TB>
__device__ void wgmma_m64n32(float (&d)[4][4], uint64_t da, uint64_t db) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, %19, %20;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(da), "l"(db), "r"(1), "n"(TA), "n"(TB));
#else
  __trap();
#endif
}

__device__ inline void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until every product this warpgroup issued is in its accumulators and has read its operands.
__device__ inline void wgmma_wait() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}

// Starts acc += A[0:64, 0:K] * B[0:K, n0 : n0 + WN] for the calling warpgroup (every one of its
// 128 threads calls it with the same operands; warp w receives rows 16 w ..) and returns before
// it is done: acc and the operands' shared memory stay untouched until wgmma_wait(). Orientations
// as in mma_acc: Lay::Row A is K-major, Lay::Col A M-major; Lay::Row B N-major, Lay::Col B K-major.
template <int K, Lay LA, Lay LB, int WN, class TA, class TB>
__device__ void wgmma_issue(Frag<16, WN>& acc, TA a, TB b, int n0) {
  static_assert(K % 16 == 0 && (WN == 32 || WN == 64), "wgmma takes K a multiple of 16 and WN 32 or 64");
  static_assert((LA == Lay::Row ? TA::rows : TA::cols) == 64, "A must have 64 rows (K-major) or 64 columns (M-major)");
  constexpr int ta = LA == Lay::Col, tb = LB == Lay::Row;
  // K-major: the next core matrix along K is the next block of the row (128 bytes), along M/N
  // the next row of blocks; M/N-major the other way round. A 16-wide K step is two along K.
  constexpr uint32_t a_k = ta ? TA::row_block_bytes : 128, a_mn = ta ? 128 : TA::row_block_bytes;
  constexpr uint32_t b_k = tb ? TB::row_block_bytes : 128, b_mn = tb ? 128 : TB::row_block_bytes;
  const uint64_t da = wgmma_desc(a.p, a_k, a_mn), db = wgmma_desc(tb ? b.at(0, n0) : b.at(n0, 0), b_k, b_mn);
  wgmma_fence();
#pragma unroll
  for (int k = 0; k < K / 16; ++k) {  // the descriptors' start address counts 16-byte units
    if constexpr (WN == 64)
      wgmma_m64n64<ta, tb>(acc.x[0], da + k * (2 * a_k >> 4), db + k * (2 * b_k >> 4));
    else
      wgmma_m64n32<ta, tb>(acc.x[0], da + k * (2 * a_k >> 4), db + k * (2 * b_k >> 4));
  }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}

// wgmma_issue, then wgmma_wait: returns with the products (and any issued before) in acc.
template <int K, Lay LA, Lay LB, int WN, class TA, class TB>
__device__ void wgmma_acc(Frag<16, WN>& acc, TA a, TB b, int n0) {
  wgmma_issue<K, LA, LB>(acc, a, b, n0);
  wgmma_wait();
}

}  // namespace stateflow::cuda
