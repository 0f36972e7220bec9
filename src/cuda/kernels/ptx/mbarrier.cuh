// mbarrier wrappers (PTX ISA 9.7.13.15): the full/empty handshake of the TMA -> WGMMA
// pipeline. All barriers live in shared memory of this CTA (no clusters), so every
// address is a 32-bit shared-window address.
//
// Protocol used by the kernels (one producer thread, C consumer warps):
//   full[s]  : init count 1.  The producer arms it with arrive.expect_tx(bytes of stage s);
//              TMA completes the transaction bytes; consumers wait on its parity.
//   empty[s] : init count C.  Lane 0 of each consumer warp arrives once the warp's WGMMAs
//              reading stage s have completed; the producer waits on it before refilling.
// Parity: a freshly initialised barrier is in phase 0; waiting for parity 1 ("the phase
// before") returns at once, which is why the producer waits with `phase ^ 1`.
#pragma once

#include <cstdint>

namespace fp8proj::sm90::ptx {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}

// Makes the initialised barriers visible to the async proxy (TMA's complete_tx) before
// the CTA-wide __syncthreads() that follows.
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// Producer: one arrival plus the number of bytes the TMA loads of this stage will deliver
// (the full box size, including zero-filled out-of-bounds elements).
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}

// Spins until the phase with the given parity has completed. try_wait suspends the thread
// for a hardware-chosen time (up to the 10 ms hint) instead of hammering shared memory.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1, %2;\n"
      "@!P1 bra WAIT_%=;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity), "r"(10000000)
      : "memory");
}

// The parity of the barrier's current phase, without waiting: test_wait.parity(0) is true
// once phase 0, 2, 4, ... has completed, i.e. while an odd phase is the current one.
__device__ __forceinline__ uint32_t mbarrier_current_parity(const uint64_t* bar) {
  uint32_t odd;
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "mbarrier.test_wait.parity.shared::cta.b64 P1, [%1], 0;\n"
      "selp.u32 %0, 1, 0, P1;\n"
      "}\n"
      : "=r"(odd)
      : "r"(smem_addr(bar))
      : "memory");
  return odd;
}

// One try_wait with a suspend-time hint: true when the phase with the given parity has
// completed, false when the hint (or a shorter, hardware-chosen time) passed first.
__device__ __forceinline__ bool mbarrier_try_wait_for(const uint64_t* bar, uint32_t parity, uint32_t hint_ns) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred P1;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 P1, [%1], %2, %3;\n"
      "selp.u32 %0, 1, 0, P1;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity), "r"(hint_ns)
      : "memory");
  return done != 0;
}

// Nanoseconds of the GPU's global timer (PTX %globaltimer).
__device__ __forceinline__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace fp8proj::sm90::ptx
