// Pieces shared by the sm90_fp8_block kernels: the pipeline set-up, the hang watchdog, the TMA
// swizzle as an address function and the compile-time dispatch of a tile's offset inside its
// 128-column scale block.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <type_traits>

#include "cuda/kernels/ptx/mbarrier.cuh"
#include "cuda/kernels/ptx/tma.cuh"
#include "gemm/sm90_watchdog.hpp"

namespace fp8proj::sm90::kernels {

// Run by the one thread that becomes the producer, before the CTA-wide (or cluster-wide)
// barrier: traps unless the dynamic shared memory starts on a 1024-byte boundary (the swizzle
// patterns are functions of the shared address), prefetches the four TMA descriptors and
// initialises the kStages full/empty mbarrier pairs -- full: one arrival (the producer's
// expect_tx); empty: `empty_arrivals` (lane 0 of every consumer warp that reads the stage) --
// and, in the kernels built with the watchdog, its `done` barrier (one arrival per consumer
// warpgroup, run_watchdog below).
template <int kStages, bool kWatchdog>
__device__ __forceinline__ void init_tma_pipeline(const uint8_t* smem, const CUtensorMap* tmap_a,
                                                  const CUtensorMap* tmap_sfa, const CUtensorMap* tmap_b,
                                                  const CUtensorMap* tmap_d, uint64_t* full, uint64_t* empty,
                                                  uint32_t empty_arrivals, uint64_t* done, uint32_t done_arrivals) {
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
  if constexpr (kWatchdog) ptx::mbarrier_init(done, done_arrivals);  // kernels built with the watchdog
  ptx::mbarrier_init_fence();
}

// The hang watchdog (gemm/sm90_watchdog.hpp). Its "done" barrier sits in the last 8 bytes of
// the 256-byte barrier region (after the kStages full/empty pairs, and the swap-AB kernel's
// flag): every consumer warpgroup arrives on it once, when it has stored its last tile.
inline constexpr uint32_t kWatchdogDoneOffset = 248;

// The watchdog record's configuration word of kernel traits T.
template <class T>
constexpr uint64_t watchdog_config() {
  WatchdogConfig c;
  c.math_wgs = T::kMathWGs;
  c.stages = T::kStages;
  if constexpr (requires { T::BLOCK_TOK; }) {
    c.kernel = kWatchdogSwapAB;
    c.block_m = T::BLOCK_TOK;
    c.block_n = T::BLOCK_W;
  } else {
    c.kernel = kWatchdogGemm1d2d;
    c.block_m = T::BLOCK_M;
    c.block_n = T::BLOCK_N;
    c.cluster = T::kCluster;
    c.cluster_on_n = T::kClusterOnN;
    c.carry = T::kCarry;
    c.fixed_kb = T::kFixedKb;
  }
  return pack_watchdog_config(c);
}

// Which CTA writes the watchdog record when several find their pipeline stuck: the first to
// claim this word (one per module and device, zero when the module loads). A device-memory
// atomic: an atomic on the mapped host record would depend on the platform's PCIe atomics.
static __device__ uint32_t watchdog_claim;

// The watchdog of one CTA, run by one thread of the producer warpgroup that has nothing else
// to do (lane 0 of its second warp). Until every consumer warpgroup has arrived on `done` it
// samples the phase parities of the CTA's 2 kStages pipeline barriers (full[s], then empty[s]
// = full[kStages + s]); a pipeline that runs flips one of them at least every K block (a few
// microseconds). When none has changed for params.timeout_ns the pipeline is stuck: the first
// CTA to notice writes the record -- the configuration of traits T, the problem, this block,
// the parities, how long -- and traps; the others trap once it is complete (or a timeout
// later). The trap ends the grid with a sticky error.
//
// NOTES: the barrier waits themselves are unchanged (ptx::mbarrier_wait). Bounding them in the
// waiting threads instead cost every 2-warpgroup kernel 1-10 KB of spills (ptxas -v,
// m128n112: a trap in C++ next to the consumers' waits), and the statements a record needs,
// added to each wait of the 4x-unrolled main loop, made the compiler unroll that loop's
// remainder less (m128n96: 112 -> 96 WGMMAs in the PTX). Here the consumers gain one arrive
// per kernel and their main loops keep their instructions (SASS of m128n128: the same 824
// around the WGMMAs, two USELs swapped). The watchdog thread sleeps in try_wait on `done` (it
// wakes when the consumers finish, so the CTA does not outlive its work) and samples at most
// every 100 us. It also catches a pipeline stuck outside a barrier wait (a named barrier, a
// bulk-store wait). Off (record null or timeout 0): it returns at once.
template <class T>
__device__ __forceinline__ void run_watchdog(const WatchdogParams& params, const uint64_t* full, const uint64_t* done) {
  const uint64_t timeout = params.timeout_ns;
  if (params.record == nullptr || timeout == 0) return;
  constexpr uint32_t kStages = T::kStages;
  static_assert(kStages <= 16, "the parities of kStages barriers fit 16 bits");
  auto parities = [&]() {
    uint32_t bits = 0;
#pragma unroll 1
    for (uint32_t i = 0; i < 2 * kStages; ++i)
      bits |= ptx::mbarrier_current_parity(full + i) << (i < kStages ? i : 16 + i - kStages);
    return bits;
  };
  uint32_t seen = parities();
  uint64_t last_change = ptx::globaltimer_ns(), sampled = last_change;
  while (!ptx::mbarrier_try_wait_for(done, 0, 1000000)) {
    const uint64_t now = ptx::globaltimer_ns();
    if (now - sampled < 100000) continue;
    sampled = now;
    const uint32_t bits = parities();
    if (bits != seen) {
      seen = bits;
      last_change = now;
      continue;
    }
    if (now - last_change <= timeout) continue;
    // Stuck.
    volatile WatchdogRecord* r = params.record;
    if (atomicCAS(&watchdog_claim, 0u, 1u) == 0u) {
      r->config = watchdog_config<T>();
      r->m = params.m;
      r->n = params.n;
      r->k = params.k;
      r->split_k = params.split_k;
      r->block = blockIdx.x;
      r->full_parity = bits & 0xffffu;
      r->empty_parity = bits >> 16;
      r->waited_ns = now - last_change;
      __threadfence_system();  // every field reaches host memory before the magic does
      r->magic = kWatchdogMagic;
      __threadfence_system();
    } else {
      // Another CTA is writing the record (microseconds); a trap now could end the grid first.
      while (r->magic != kWatchdogMagic && ptx::globaltimer_ns() - now < timeout) __nanosleep(100000);
    }
    __trap();
  }
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
