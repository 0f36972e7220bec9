// bfloat16 as a plain 16-bit pattern, usable on host and device, with the
// conversions the numerics contract needs: float -> bf16 rounds to nearest even
// and keeps NaN a (quiet) NaN; bf16 -> float is exact.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FP8PROJ_HD __host__ __device__ __forceinline__
#else
#define FP8PROJ_HD inline
#endif

namespace fp8proj {

FP8PROJ_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

FP8PROJ_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// Same size and alignment as __nv_bfloat16, so device buffers can be reinterpreted.
struct alignas(2) bf16 {
  uint16_t bits = 0;

  FP8PROJ_HD static bf16 from_bits(uint16_t b) {
    bf16 h;
    h.bits = b;
    return h;
  }
};

FP8PROJ_HD float bf16_to_float(bf16 h) { return bits_float(static_cast<uint32_t>(h.bits) << 16); }

FP8PROJ_HD bf16 float_to_bf16(float x) {
  uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u)  // NaN: keep sign, force a quiet-NaN payload
    return bf16::from_bits(static_cast<uint16_t>((u >> 16) | 0x0040u));
  // Round to nearest even: add 0x7fff plus the lowest kept bit, then truncate.
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16::from_bits(static_cast<uint16_t>(u >> 16));
}

}  // namespace fp8proj
