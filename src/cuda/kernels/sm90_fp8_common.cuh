// Pieces shared by the sm90_fp8_block kernels: the pipeline set-up, the TMA swizzle as an
// address function and the compile-time dispatch of a tile's offset inside its 128-column
// scale block.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "cuda/kernels/ptx/mbarrier.cuh"
#include "cuda/kernels/ptx/tma.cuh"

namespace fp8proj::sm90::kernels {

// Run by the one thread that becomes the producer, before the CTA-wide (or cluster-wide)
// barrier: traps unless the dynamic shared memory starts on a 1024-byte boundary (the swizzle
// patterns are functions of the shared address), prefetches the four TMA descriptors and
// initialises the kStages full/empty mbarrier pairs -- full: one arrival (the producer's
// expect_tx); empty: `empty_arrivals` (lane 0 of every consumer warp that reads the stage).
template <int kStages>
__device__ __forceinline__ void init_tma_pipeline(const uint8_t* smem, const CUtensorMap* tmap_a,
                                                  const CUtensorMap* tmap_sfa, const CUtensorMap* tmap_b,
                                                  const CUtensorMap* tmap_d, uint64_t* full, uint64_t* empty,
                                                  uint32_t empty_arrivals) {
  if (ptx::smem_addr(smem) % 1024 != 0) __trap();
  ptx::prefetch_tensormap(tmap_a);
  ptx::prefetch_tensormap(tmap_sfa);
  ptx::prefetch_tensormap(tmap_b);
  ptx::prefetch_tensormap(tmap_d);
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    ptx::mbarrier_init(full + s, 1);
    ptx::mbarrier_init(empty + s, empty_arrivals);
  }
  ptx::mbarrier_init_fence();
}

// Byte offset of a 16-byte chunk inside a tile that TMA reads/writes with a
// kSwizzleBytes-wide swizzle (CU_TENSOR_MAP_SWIZZLE_32B/64B/128B): bits [4, 4+b) are XORed
// with bits [7, 7+b), b = log2(kSwizzleBytes / 16). `off` is relative to a base aligned to
// the pattern's period (8 x 128 B = 1024 B for 128B; all our tiles are 1024-aligned).
// Example, 128B swizzle: row 3, chunk 1 -> 3*128 + 16 = 400 -> chunk 1^3 = 2 -> 416.
template <int kSwizzleBytes>
__device__ __forceinline__ uint32_t swizzle_offset(uint32_t off) {
  static_assert(kSwizzleBytes == 32 || kSwizzleBytes == 64 || kSwizzleBytes == 128, "TMA swizzle width");
  constexpr uint32_t kMask = kSwizzleBytes / 16 - 1;
  return off ^ (((off >> 7) & kMask) << 4);
}

// Calls f(std::integral_constant<int, v>) for v = n0 % 128, which can only take the values
// kFirst, kFirst + kStep, ... < 128 (kStep = gcd(BLOCK_N, 128)). Turns the column where a
// tile crosses into the next scale block into a compile-time constant, so the promotion
// picks its B scale with no per-element compare (one main-loop copy per value: 2 for
// BLOCK_N = 192).
template <int kFirst, int kStep, class F>
__device__ __forceinline__ void dispatch_scale_offset(uint32_t v, F&& f) {
  if constexpr (kFirst + kStep >= 128) {
    f(std::integral_constant<int, kFirst>{});
  } else {
    if (v == kFirst)
      f(std::integral_constant<int, kFirst>{});
    else
      dispatch_scale_offset<kFirst + kStep, kStep>(v, static_cast<F&&>(f));
  }
}

__host__ __device__ constexpr int gcd_int(int a, int b) { return b == 0 ? a : gcd_int(b, a % b); }

}  // namespace fp8proj::sm90::kernels
