// Which sub-chunk a block of the per-sub-chunk stages (Pre, B1, B2) works on (GdnCudaConfig::walk,
// lever core_walk). Included by gdn_core.cu after Args, inside its anonymous namespace.
//
// The grid (sub-chunks, heads, batch) puts consecutive sub-chunks of one head on the GPU at one
// time, each block reading 64 rows of 256 bytes that lie 16 heads' rows (4 KiB) apart. The
// heads-first walk flattens (sub-chunk, head) into blockIdx.x with the head fastest, so that the
// blocks side by side read whole token rows between them (and the same sectors of g and beta).
// Only the order of the blocks changes: the same arithmetic on the same bytes.

// Sub-chunk n of head h of batch b.
struct SubChunkAt {
  int n, h, b;
};

// This block's sub-chunk: kHeadsFirst, blockIdx.x = n * H + h and blockIdx.z = b; else the grid
// (NS, H, B).
template <bool kHeadsFirst>
__device__ SubChunkAt this_sub_chunk(const Args& a) {
  if constexpr (kHeadsFirst) return {int(blockIdx.x) / a.H, int(blockIdx.x) % a.H, int(blockIdx.z)};
  return {int(blockIdx.x), int(blockIdx.y), int(blockIdx.z)};
}
