// Device building blocks of the block-scaled FP8 quantizers (activation_quant.cu,
// rmsnorm_quant.cu, weight_quant.cu): bf16 values in, e4m3 codes and a scale out -- a UE8M0
// power of two by default, or fp32 amax/448 (ScaleMode::fp32, the template argument kMode) --
// bit-identical to the CPU reference (include/fp8proj/formats.hpp, src/quant/quantize_cpu.cpp).
//
// Registers: bf16 values travel as 32-bit words of two (element 2i in the low half, as a
// 16-byte load leaves them); e4m3 codes as 32-bit words of four (element j in byte j), ready
// for 8- or 16-byte stores.
//
// Why each step equals the reference:
//   amax   taken over the bit patterns |x| = x & 0x7fff. For non-negative IEEE numbers the
//          integer order is the numeric order, so for a finite group the result is exactly
//          fmaxf over |x|, and a result >= 0x7f80 (exponent all ones) says the group holds an
//          Inf or NaN, which the reference turns into a NaN scale and NaN codes (an fmaxf amax
//          would silently drop a NaN). Two values per __vmaxu2: 16 values cost 8 LOP3 + 7 VMNMX.
//   scale  ue8m0_scale_for_amax() of formats.hpp compiled for the device: amax / 448 is an IEEE
//          division (the project never builds with --use_fast_math), the rest is integer code.
//          fp32 mode: __fdiv_rn(max(amax, eps), 448), the CPU's one correctly rounded division.
//   value  x * 2^(127-e) is the same IEEE fp32 product the CPU forms (neither side flushes
//          denormals: nvcc's default is -ftz=false); fp32 mode: __fdiv_rn(x, scale), the CPU's
//          x / scale (division is correctly rounded whatever -prec-div says, spelled out so
//          that no flag can turn it into a reciprocal); then cvt.rn.satfinite.e4m3x2.f32.
//          That conversion equals float_to_e4m3() bit for bit on every finite fp32 input:
//            - both round to nearest, ties to even, on the whole e4m3 grid: step 2^-9 below
//              2^-6 (subnormals) and 3 mantissa bits above; float_to_e4m3 does the subnormal
//              case as nearbyint(x * 2^9) (exact scaling, then RNE) and the normal case by the
//              add-0x7ffff-plus-lsb carry, which is RNE on the 20 dropped bits;
//            - both saturate: float_to_e4m3 maps |x| >= 448 to 448; the hardware rounds
//              (448, 464) down to 448, rounds the tie 464 to the even 448, and .satfinite
//              clamps everything that would round to 480 (no such e4m3fn value) to 448;
//            - both keep the sign of zero (-tiny -> 0x80), as IEEE conversion does.
//          tests/gpu/quant_gpu_test.cu (Fp8Convert.HardwareCvtMatchesReferenceOnAllFloats)
//          checks all 2^32 bit patterns on the device. NaN never reaches the cvt in a way that
//          matters: a non-finite group's codes are replaced by 0x7f.
#pragma once

#include <cstdint>

#include "fp8proj/formats.hpp"

namespace fp8proj::gpu {

inline constexpr uint32_t kNaNCodes4 = 0x7f7f7f7fu;   // kE4m3NaN in all four bytes
inline constexpr uint32_t kNonFiniteAbsBits = 0x7f80u;  // |bf16| bits >= this: Inf or NaN

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// Largest |bf16| bit pattern among the 2N values held in w.
template <int N>
__device__ __forceinline__ uint32_t abs_max_bits(const uint32_t (&w)[N]) {
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < N; ++i) m = __vmaxu2(m, w[i] & 0x7fff7fffu);
  return max(m & 0xffffu, m >> 16);
}

struct GroupScale {
  float scale;  // what the scale tensor stores: 2^(e-127) or amax/448, NaN for a non-finite group
  float inv;    // UE8M0: 2^(127-e), x * inv is the reference's x * (1 / scale); fp32: the divisor
  bool finite;
};

// amax_bits: abs_max_bits over the whole group (or weight block).
template <ScaleMode kMode = ScaleMode::ue8m0>
__device__ __forceinline__ GroupScale group_scale(uint32_t amax_bits, float eps) {
  GroupScale s;
  s.finite = amax_bits < kNonFiniteAbsBits;
  const float amax = __uint_as_float(amax_bits << 16);
  if constexpr (kMode == ScaleMode::ue8m0) {
    const uint8_t e = ue8m0_scale_for_amax(amax, eps);
    s.scale = s.finite ? ue8m0_to_float(e) : __uint_as_float(0x7fc00000u);  // the CPU's NAN
    s.inv = ue8m0_inverse(e);
  } else {
    const float q = __fdiv_rn(amax > eps ? amax : eps, kE4m3Max);
    s.scale = s.finite ? q : __uint_as_float(0x7fc00000u);
    s.inv = q;
  }
  return s;
}

// One value scaled for encoding: the reference's x * (1 / scale) (UE8M0) or x / scale (fp32).
template <ScaleMode kMode>
__device__ __forceinline__ float scale_value(float v, const GroupScale& s) {
  if constexpr (kMode == ScaleMode::ue8m0) return v * s.inv;
  else return __fdiv_rn(v, s.inv);
}

// Four fp32 values -> four e4m3 codes, value j in byte j. cvt packs its first source into the
// upper byte of the 16-bit result and its second into the lower byte, hence the swapped order.
__device__ __forceinline__ uint32_t e4m3x4(float v0, float v1, float v2, float v3) {
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(v1), "f"(v0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(v3), "f"(v2));
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// Two fp32 values -> two bf16 (lo in the low half), cvt.rn.bf16x2.f32: round to nearest even,
// overflow to Inf, subnormals kept — float_to_bf16 (bf16.hpp) bit for bit on every finite input
// (tests/gpu: Bf16Convert.HardwareCvtMatchesReferenceOnAllFloats). NaN stays NaN but takes the
// hardware's canonical payload; the CPU's NaN payloads are the host's own, so NaN bits never
// matched anyway. One instruction instead of ~5 integer ops per value.
__device__ __forceinline__ uint32_t bf16x2_rn(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// One fp32 value -> its e4m3 code (for the element-wise edge paths).
__device__ __forceinline__ uint8_t e4m3_code(float v) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(v));
  return static_cast<uint8_t>(r & 0xffu);
}

// codes[i] = e4m3 of values 4i .. 4i+3 of w, each scaled by scale_value; all NaN for a
// non-finite group.
template <ScaleMode kMode = ScaleMode::ue8m0, int N>
__device__ __forceinline__ void encode_e4m3(const uint32_t (&w)[N], const GroupScale& s, uint32_t (&codes)[N / 2]) {
  static_assert(N % 2 == 0, "codes are packed four to a word");
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const uint32_t a = w[2 * i], b = w[2 * i + 1];
    const uint32_t c = e4m3x4(scale_value<kMode>(bf16_lo(a), s), scale_value<kMode>(bf16_hi(a), s),
                              scale_value<kMode>(bf16_lo(b), s), scale_value<kMode>(bf16_hi(b), s));
    codes[i] = s.finite ? c : kNaNCodes4;
  }
}

// Quantizes one 1x128 group spread over kLanes consecutive lanes of a warp (the group starts at
// a lane index divisible by kLanes), each holding 2N bf16 values. Returns the group's scale in
// every one of its lanes. The shuffles use the full mask: every lane of the warp must call
// this together; lanes without data pass zeros and ignore the result.
template <int kLanes, ScaleMode kMode = ScaleMode::ue8m0, int N>
__device__ __forceinline__ float quantize_group(const uint32_t (&w)[N], float eps, uint32_t (&codes)[N / 2]) {
  static_assert(kLanes * 2 * N == kScaleBlock, "a group is 128 values");
  static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "lanes per group: a power of two");
  uint32_t m = abs_max_bits(w);
#pragma unroll
  for (int off = kLanes / 2; off >= 1; off /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, off));
  const GroupScale s = group_scale<kMode>(m, eps);
  encode_e4m3<kMode>(w, s, codes);
  return s.scale;
}

}  // namespace fp8proj::gpu
