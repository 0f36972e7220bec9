// Thread-block clusters (PTX ISA 9.7.12.3, 9.7.9.25): the pieces a 2-CTA cluster needs to
// share one operand through TMA multicast: the CTA's rank in its cluster, the cluster-wide
// barrier, the multicast tile load, and an mbarrier arrival on the peer CTA's barrier.
//
// Protocol (sm90_fp8_gemm_1d2d.cuh with kCluster = 2): both CTAs keep their stage s at the
// same shared offset. Each producer loads half of the shared tile and multicasts it to both
// CTAs (mask 0b11); the bytes complete_tx on the full[s] barrier at the same offset in each
// destination CTA. A producer may refill stage s only when the consumers of *both* CTAs have
// released it, so empty[s] counts the arrivals of both CTAs' consumer warps.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/kernels/ptx/mbarrier.cuh"

namespace fp8proj::sm90::ptx {

__device__ __forceinline__ uint32_t cluster_cta_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// Every thread of every CTA in the cluster arrives; release/acquire order the barrier
// initialisation (and, at exit, the last remote arrivals) across the cluster. Not .aligned:
// callers reach it right after warp-divergent code (the single producer thread).
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

// One arrival on the mbarrier at the same shared offset as `bar`, in CTA `cta` of the cluster.
// Default semantics (.release at .cta scope), as CUTLASS's ClusterBarrier::arrive: the
// arriving warp's only accesses to the stage were WGMMA reads, already complete
// (wgmma.wait_group), and the peer's refill is ordered by the barrier itself. Spelling it
// `.release.cluster` costs a MEMBAR.ALL.GPU per arrival in SASS (MEMBAR.ALL.CTA; MEMBAR.ALL.GPU;
// ERRBAR; CGAERRBAR before the SYNCS.ARRIVE) -- measured on the H200 at half the
// throughput of the same kernel without a cluster.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t cta) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}" ::"r"(smem_addr(bar)),
      "r"(cta)
      : "memory");
}

// TMA 2D tile load written to the same shared offset in every CTA of cta_mask, each copy
// completing its bytes on the mbarrier at `bar`'s offset in that CTA.
__device__ __forceinline__ void tma_load_2d_multicast(void* smem_dst, const CUtensorMap* map, uint64_t* bar,
                                                      int32_t c0, int32_t c1, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      " [%0], [%1, {%4, %5}], [%2], %3;" ::"r"(smem_addr(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "h"(cta_mask), "r"(c0), "r"(c1)
      : "memory");
}

// tma_load_2d_multicast with an L2 cache policy (tma.cuh: l2_policy_evict_first()).
__device__ __forceinline__ void tma_load_2d_multicast_hint(void* smem_dst, const CUtensorMap* map, uint64_t* bar,
                                                           int32_t c0, int32_t c1, uint16_t cta_mask,
                                                           uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      ".L2::cache_hint [%0], [%1, {%4, %5}], [%2], %3, %6;" ::"r"(smem_addr(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "h"(cta_mask), "r"(c0), "r"(c1), "l"(policy)
      : "memory");
}

}  // namespace fp8proj::sm90::ptx
