// Thread-block clusters (sm_90): mbarriers, bulk copies multicast to every block of a cluster,
// and the cluster barrier. Used by the GDN quarter sweeps' multicast copies
// (mixers/gdn/gdn_core_quarter_sweeps.cuh); one PTX instruction each.
#pragma once
#include <cstdint>

#include "kernels/cuda/mma_tile.cuh"

namespace stateflow::cuda {

// This block's rank in its cluster.
__device__ inline int cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return static_cast<int>(r);
}

// Every thread of every block of the cluster meets here (release / acquire: what a block wrote
// to shared memory before is seen by the others after).
__device__ inline void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

__device__ inline void mbar_init(uint64_t* bar, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
}
// Makes this thread's mbarrier.inits visible to the cluster's bulk copies and remote arrivals.
__device__ inline void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// One arrival that also expects `bytes` more bytes of bulk copies before the phase completes.
__device__ inline void mbar_expect_tx(uint64_t* bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// One arrival on the barrier at bar's offset in the shared memory of the cluster's block `rank`.
__device__ inline void mbar_arrive_cluster(uint64_t* bar, int rank) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_u32(bar)),
      "r"(rank)
      : "memory");
}

// Waits until the barrier's phase of the given parity (0, 1, 0, ...: its phases in order) completed.
__device__ inline void mbar_wait(uint64_t* bar, int parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// Orders this thread's earlier shared-memory stores before later bulk copies (the async proxy).
__device__ inline void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// bytes (a multiple of 16, both ends 16-byte aligned) from global memory to dst in the shared
// memory of every block of the cluster in mask, each block's barrier at bar's offset counting them.
__device__ inline void bulk_copy_multicast(void* dst, const void* src, int bytes, uint64_t* bar, uint32_t mask) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;\n" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "h"(static_cast<uint16_t>(mask))
      : "memory");
}

}  // namespace stateflow::cuda
