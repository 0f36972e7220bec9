// stmatrix (PTX ISA 9.7.14.5.16): a warp stores 8x8 b16 matrices from the MMA fragment
// layout to shared memory. With .x2, lanes 0-7 give the 8 row addresses of matrix 0 and
// lanes 8-15 those of matrix 1 (16 bytes each; lanes 16-31 are ignored). Lane l holds, in
// each 32-bit register, the elements (row l/4, cols 2*(l%4) and 2*(l%4)+1), lower column in
// the lower half. With .trans each matrix is stored transposed: the row at address j
// receives fragment column j. That is the WGMMA accumulator layout (after bf16 packing), so
// the epilogue needs no shuffles.
#pragma once

#include <cstdint>

namespace fp8proj::sm90::ptx {

__device__ __forceinline__ void stmatrix_x2(uint32_t smem_addr, uint32_t r0, uint32_t r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.shared.b16 [%0], {%1, %2};" ::"r"(smem_addr),
               "r"(r0), "r"(r1)
               : "memory");
}

__device__ __forceinline__ void stmatrix_x2_trans(uint32_t smem_addr, uint32_t r0, uint32_t r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};" ::"r"(smem_addr),
               "r"(r0), "r"(r1)
               : "memory");
}

// One fp32 -> bf16 (round to nearest even, NaN stays NaN) stored to global memory.
__device__ __forceinline__ void st_global_bf16(uint16_t* p, float v) {
  asm volatile(
      "{\n.reg .b16 h;\ncvt.rn.bf16.f32 h, %1;\nst.global.b16 [%0], h;\n}\n" ::"l"(p), "f"(v)
      : "memory");
}

// Two fp32 -> one bf16x2 word, round to nearest even (NaN stays NaN), `lo` in bits 0-15.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

}  // namespace fp8proj::sm90::ptx
