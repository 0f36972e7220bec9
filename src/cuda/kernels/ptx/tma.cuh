// TMA (cp.async.bulk.tensor, PTX ISA 9.7.9.25) wrappers: 2D tile loads into shared memory
// completing on an mbarrier, 2D tile stores from shared memory in bulk groups, and the
// descriptor prefetch. Coordinates are element indices, innermost dimension first.
//
// Numbers that matter (CUDA driver API, cuTensorMapEncodeTiled):
//   - box dimensions <= 256 elements each; inner box bytes a multiple of 16;
//   - with 128B swizzle the inner box is <= 128 bytes, and the shared destination must be
//     1024-byte aligned (the swizzle pattern repeats every 8 rows x 128 B);
//   - out-of-bounds elements of a load are zero-filled (OOB fill NONE) and still count
//     toward the transaction bytes; out-of-bounds elements of a store are not written.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/kernels/ptx/mbarrier.cuh"

namespace fp8proj::sm90::ptx {

// Pulls the 128-byte descriptor into the constant/descriptor cache before the first copy
// (saves one dependent global round trip on the first TMA of each CTA).
__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

__device__ __forceinline__ void tma_load_2d(void* smem_dst, const CUtensorMap* map, uint64_t* bar,
                                            int32_t c0, int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];" ::"r"(smem_addr(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1)
      : "memory");
}

// An L2 eviction policy for cp.async.bulk's .L2::cache_hint (PTX createpolicy): lines a
// load brings in are the first candidates for eviction. The GEMMs load the weight with it.
// NOTES: a model's L2 is full of dirty lines (the activations earlier kernels wrote; the
// benchmarks' L2 flush is a write too). Weight lines loaded at normal priority evict those,
// and every eviction is a DRAM write-back competing with the weight stream: on an H200 after
// a 120 MB write, TMA streams 117 MB at 3.06 TB/s, 3.35 TB/s evict-first, 3.80 TB/s from a
// clean L2 (sm90_fp8_gemm_harness --floor); the GEMMs gain 7-16% at M <= 256. An explicit
// evict_normal policy (createpolicy) cost 5-17% at large M (docs/kernels.md).
// Where 5+ M blocks read every weight tile, the 1d2d kernels load it with no policy instead
// (weight_evict_first(), sm90_fp8_heuristic.hpp): evict-first evicted tiles between their
// readers (+0.45% over 18 such points of the model shapes with K <= 4096; at 6144 x 16384,
// M = 4096, 615 -> 532 MB read from DRAM, +0.16% over the K = 16384 points; docs/kernels.md).
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// tma_load_2d with an L2 cache policy (l2_policy_evict_first()).
__device__ __forceinline__ void tma_load_2d_hint(void* smem_dst, const CUtensorMap* map, uint64_t* bar,
                                                 int32_t c0, int32_t c1, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_addr(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "l"(policy)
      : "memory");
}

__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* smem_src,
                                             int32_t c0, int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(smem_addr(smem_src)), "r"(c0), "r"(c1)
      : "memory");
}

__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until at most N committed store groups are still reading shared memory: enough to
// overwrite the staging tile, and all a CTA needs before it exits (its shared memory must
// outlive the reads; the global writes still in flight complete before the grid does, and
// the next kernel in the stream sees them). Waiting for the writes themselves before exiting
// (wait_group without .read) only put a write round trip on every kernel's tail: 0.7% on the
// geometric mean over M <= 512, up to 3% at M = 16..128 (docs/kernels.md).
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}

}  // namespace fp8proj::sm90::ptx
