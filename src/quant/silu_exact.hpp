// silu(g) = g / (1 + exp(-g)) in fp32 with the same bits on the host and on the device: the CPU
// reference (quantize_cpu.cpp) and the fused gated-MLP quantizer (cuda/quant/activation_quant.cu)
// both call silu_exact. A library expf would not do: glibc's and CUDA's differ in the last bit
// for some inputs (CUDA's goes through the approximate ex2 unit), and a last-bit difference moves
// bf16(silu(g)) by one step wherever silu(g) lies near a rounding tie -- about a dozen of the
// 65,536 bf16 gates.
//
// exp(x): n = rint(x log2 e); r = x - n ln2 in two fmaf steps (Cody-Waite: ln2's high part has 16
// significant bits, so n * high is exact for |n| <= 128); e^r by its Taylor series to r^7 / 7!
// in Horner form (|r| <= 0.347: the remainder is below 6e-9, 0.1 ulp at 1); times 2^n as two
// exact products by powers of two (2^128 is not a float). Every step is one IEEE-rounded fmaf
// or an exact product, so both compilers give the same bits: host C++ is built with
// -ffp-contract=off (CMakeLists.txt; GCC would otherwise fuse on FMA hosts), and on the device the
// products and the sum are written with __fmul_rn / __fadd_rn, which nvcc never fuses. (The one
// multiply-then-add, the last scaling and 1 + exp, would give the same bits fused: the scaling by
// a power of two is exact.) About 1.5 ulp from the true exp.
//
// Outside the polynomial's range: exp(x) = inf above 88.7228 (log of FLT_MAX), and 0 below -20,
// where 1 + exp(x) rounds to 1 in fp32 anyway (exp(-20) < 2^-28). NaN stays NaN; silu(+inf) =
// inf, silu(-inf) = -inf / inf = NaN (as g / (1 + expf(-g)) gives with any expf).
#pragma once

#include <cmath>
#include <cstdint>

#include "fp8proj/bf16.hpp"

namespace fp8proj::detail {

FP8PROJ_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

FP8PROJ_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// 2^e for -126 <= e <= 127, exactly.
FP8PROJ_HD float pow2i(int e) { return bits_float(static_cast<uint32_t>(e + 127) << 23); }

// exp(x) as described above, for silu's 1 + exp(-g).
FP8PROJ_HD float exp_for_silu(float x) {
  if (!(x == x)) return x;                  // NaN
  if (x > 0x1.62e430p+6f) return INFINITY;  // 88.72284: exp overflows
  if (x < -20.0f) return 0.0f;
  const float n = rintf(mul_rn(x, 0x1.715476p+0f));  // log2(e); |n| <= 128
  float r = fmaf(-n, 0x1.62e4p-1f, x);                // ln2, high part
  r = fmaf(-n, 0x1.7f7d1cp-20f, r);                   // ln2, low part
  float p = 0x1.a01a02p-13f;                          // 1/7!
  p = fmaf(p, r, 0x1.6c16c2p-10f);                    // 1/6!
  p = fmaf(p, r, 0x1.111112p-7f);                     // 1/5!
  p = fmaf(p, r, 0x1.555556p-5f);                     // 1/4!
  p = fmaf(p, r, 0x1.555556p-3f);                     // 1/3!
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  const int e = static_cast<int>(n);
  const int h = e / 2;
  return mul_rn(mul_rn(p, pow2i(h)), pow2i(e - h));
}

FP8PROJ_HD float silu_exact(float g) { return g / add_rn(1.0f, exp_for_silu(-g)); }

}  // namespace fp8proj::detail
