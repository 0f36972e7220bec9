// setmaxnreg (sm_90a): moves registers from the producer warpgroup (which only issues TMA
// and needs ~40) to the consumer warpgroups (accumulators: 64..96 fp32 partial + as many
// promoted, see the kernels). Takes effect only when the kernel has a register cap at entry
// (__launch_bounds__(threads, 1)) and every warp of a warpgroup executes the same call.
// Budget: 65536 registers per SM; 128 x 40 + 256 x 232 = 64512 for 384-thread CTAs.
#pragma once

#include <cstdint>

namespace fp8proj::sm90::ptx {

template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

template <uint32_t kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg: multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}

}  // namespace fp8proj::sm90::ptx
