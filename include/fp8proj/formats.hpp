// The two number formats of the block-scaled recipe, on host and device.
//
// e4m3fn (OCP FP8, "fn" = finite + NaN): 1 sign, 4 exponent (bias 7), 3 mantissa bits.
//   Largest finite 448 (0x7e), smallest normal 2^-6, smallest subnormal 2^-9, no infinity,
//   NaN = 0x7f / 0xff. Encoding here rounds to nearest even and saturates finite overflow
//   (and +-inf) to +-448, as the hardware's cvt.rn.satfinite does; NaN stays NaN (0x7f|sign).
//
// A group's scale comes in one of two formats (ScaleMode), both stored as fp32 values:
//
// UE8M0 ("ue8m0", the default): one unsigned byte e holding the power of two 2^(e-127)
//   (e = 255 is NaN). The scale of a group is the power of two at or above amax/448, amax
//   clamped below at an epsilon (1e-4 for weights, 1e-10 for activations), computed from the
//   bits of the fp32 quotient (ceil(log2 x) = exponent + (mantissa != 0)) — the rule of
//   DeepSeek's and SGLang's ceil_to_ue8m0 / DeepGEMM's fast_log2_ceil, with the biased
//   exponent clamped to [1, 254]. A float log2 would round 2^e*(1+2^-23) down to e and break
//   amax/scale <= 448. Codes are e4m3(x * 2^(127-e)), which equals x / scale exactly.
//
// fp32 ("float"): the scale is amax/448 itself (an arbitrary fp32, the form of FP8 checkpoints'
//   weight_scale_inv), the rule of SGLang's / vLLM's per_token_group_quant_fp8 for activations:
//     scale = fl(max(amax, eps) / 448)        one IEEE fp32 division, round to nearest even
//     code  = e4m3(fl(x / scale))             one IEEE fp32 division, then float_to_e4m3
//   with the same epsilons (1e-4 weights, 1e-10 activations). Every step is one correctly
//   rounded fp32 operation, so CPU and GPU agree bit for bit (the GPU uses __fdiv_rn, never a
//   reciprocal: on Gaussian bf16 groups x * (1/scale) differs from x / scale in the last bit for
//   27% of the values and gives another e4m3 code for 5 in 10^4, DeepGEMM's per_token_cast_to_fp8
//   being one rule that multiplies). fl(amax / scale) can land one ulp above
//   448; float_to_e4m3 saturates it to 448. A block's values then use up to one more bit of
//   e4m3's range than under UE8M0 (whose scale is up to 2x larger than needed), at the price of
//   dequantized products (code * scale) that are rounded in fp32 rather than exact.
#pragma once

#include <cmath>
#include <cstdint>

#include "fp8proj/bf16.hpp"

namespace fp8proj {

inline constexpr float kE4m3Max = 448.0f;
inline constexpr uint8_t kE4m3NaN = 0x7f;
inline constexpr int kScaleBlock = 128;     // 1x128 activation groups, 128x128 weight blocks
inline constexpr float kWeightAmaxEps = 1e-4f;
inline constexpr float kActAmaxEps = 1e-10f;

// RMSNorm's sum of squares is accumulated in a fixed order that the CPU reference and the device
// kernel share (quantize.hpp: cpu::rmsnorm): W "warps" of 32 lanes per row, W = 1 up to
// K = 2048 and kRmsnormWideWarps above (a wide row read by one warp was latency-bound).
inline constexpr int kRmsnormWideWarps = 4;
constexpr int rmsnorm_warps_per_row(int64_t k) { return k > 2048 ? kRmsnormWideWarps : 1; }

// ---- e4m3fn -------------------------------------------------------------------------------

FP8PROJ_HD float e4m3_to_float(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xfu;
  const uint32_t man = v & 0x7u;
  if (exp == 0xfu && man == 0x7u) return bits_float(sign | 0x7fc00000u);  // NaN
  if (exp == 0) {  // zero or subnormal: man * 2^-9, exact in fp32
    const float mag = static_cast<float>(man) * 0.001953125f;
    return sign ? -mag : mag;
  }
  // Normal: rebias 7 -> 127 and widen the mantissa 3 -> 23 bits.
  return bits_float(sign | ((exp + 120u) << 23) | (man << 20));
}

FP8PROJ_HD uint8_t float_to_e4m3(float x) {
  const uint32_t u = float_bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return static_cast<uint8_t>(kE4m3NaN | sign);  // NaN
  if (mag >= 0x43e00000u) return static_cast<uint8_t>(0x7eu | sign);    // >= 448 (and inf): saturate
  if (mag < 0x3c800000u) {
    // Below 2^-6: subnormal grid of step 2^-9. ax * 2^9 is exact, so rounding it to an
    // integer with ties to even is the correctly rounded result; 8 encodes 2^-6 itself.
    const float scaled = bits_float(mag) * 512.0f;
#if defined(__CUDA_ARCH__)
    const uint32_t q = static_cast<uint32_t>(__float2int_rn(scaled));
#else
    const uint32_t q = static_cast<uint32_t>(std::nearbyint(scaled));  // default mode: to even
#endif
    return static_cast<uint8_t>(sign | q);
  }
  // Normal: round the 23-bit mantissa to 3 bits, ties to even, then rebias 127 -> 7.
  const uint32_t rounded = mag + 0x7ffffu + ((mag >> 20) & 1u);
  // mag < 448 here, so the rounded code is at most 0x7e (448) and never the NaN code.
  return static_cast<uint8_t>(sign | ((rounded >> 20) - (120u << 3)));
}

// ---- UE8M0 scales -------------------------------------------------------------------------

// Biased exponent byte of the power of two at or above max(amax, eps) / 448.
FP8PROJ_HD uint8_t ue8m0_scale_for_amax(float amax, float eps) {
  const float clamped = amax > eps ? amax : eps;  // also maps amax = NaN to eps; callers handle NaN
  const uint32_t q = float_bits(clamped / kE4m3Max);
  int e = static_cast<int>((q >> 23) & 0xffu) + ((q & 0x7fffffu) != 0 ? 1 : 0);
  e = e < 1 ? 1 : (e > 254 ? 254 : e);
  return static_cast<uint8_t>(e);
}

FP8PROJ_HD float ue8m0_to_float(uint8_t e) {
  if (e == 255) return bits_float(0x7fc00000u);
  if (e == 0) return bits_float(0x00400000u);  // 2^-127, an fp32 subnormal
  return bits_float(static_cast<uint32_t>(e) << 23);
}

// Inverse of a UE8M0 scale as a float: 2^(127-e), exact for e in [1, 254].
FP8PROJ_HD float ue8m0_inverse(uint8_t e) {
  if (e == 254) return bits_float(0x00400000u);  // 2^-127 is an fp32 subnormal
  return bits_float(static_cast<uint32_t>(254 - e) << 23);
}

// How a group's scale is chosen (the two formats above).
enum class ScaleMode : uint8_t {
  ue8m0,  // power of two at or above amax/448 (the default; applying it is exact)
  fp32,   // amax/448 exactly, values x / scale ("float", as FP8 checkpoints store them)
};

// The scale of one group given its amax (already known to be finite), as an fp32 value.
FP8PROJ_HD float group_scale(float amax, float eps, ScaleMode mode) {
  if (mode == ScaleMode::ue8m0) return ue8m0_to_float(ue8m0_scale_for_amax(amax, eps));
  return (amax > eps ? amax : eps) / kE4m3Max;
}

// Quantizes one value given the group's scale. For power-of-two scales x * (1/s) equals
// x / s exactly; the fp32 mode divides (see above: a reciprocal would not be the same rule).
FP8PROJ_HD uint8_t quantize_value(float x, float scale, float inv_scale, ScaleMode mode) {
  return float_to_e4m3(mode == ScaleMode::ue8m0 ? x * inv_scale : x / scale);
}

FP8PROJ_HD bool is_finite_float(float x) { return (float_bits(x) & 0x7f800000u) != 0x7f800000u; }

}  // namespace fp8proj
