// Ordering primitives that are not mbarriers: the generic->async proxy fence and named
// barriers for a subset of the CTA's warps.
#pragma once

#include <cstdint>

namespace fp8proj::sm90::ptx {

// Shared memory written with ordinary stores (st.shared, stmatrix) and read next by the
// async proxy (TMA store, WGMMA) needs this fence in every writing thread, before the
// barrier that hands the data over.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// bar.sync with an id and a thread count: synchronises only the consumer warpgroups
// (128 or 256 threads) while the producer warpgroup runs ahead. Id 0 is __syncthreads();
// the kernels use ids >= 1. The thread count must be a multiple of 32.
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t num_threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(num_threads) : "memory");
}

}  // namespace fp8proj::sm90::ptx
