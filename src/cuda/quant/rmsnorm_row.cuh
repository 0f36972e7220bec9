// RMSNorm's per-row arithmetic on the device, shared by the norm kernels (rmsnorm_quant.cu) and
// the kernels that normalize a row on the way to somewhere else (the decode step's c_kv, in
// src/cuda/mla/rope_cache.cu). The order is cpu::rmsnorm's (include/fp8proj/quantize.hpp):
// 8-element chunks, each lane's sum of squares with fmaf in increasing order, the lanes added by a
// butterfly, r = 1 / sqrt(ss / K + eps) with IEEE division and square root, y = bf16((x * r) * w).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/quant/fp8_group_quant.cuh"

namespace fp8proj::gpu {

// ss plus the squares of one 8-element chunk, elements 8c .. 8c+7 in increasing order.
__device__ __forceinline__ float add_squares(const uint4& v, float ss) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float lo = bf16_lo(w[i]), hi = bf16_hi(w[i]);
    ss = fmaf(lo, lo, ss);
    ss = fmaf(hi, hi, ss);
  }
  return ss;
}

// The warp's butterfly: afterwards every lane holds the same sum, bit for bit (each step adds
// the same two numbers in both partner lanes).
__device__ __forceinline__ float warp_sum_butterfly(float ss) {
#pragma unroll
  for (int off = 16; off >= 1; off /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  return ss;
}

__device__ __forceinline__ float rms_inverse(float ss, int64_t k, float eps) {
  return 1.0f / sqrtf(ss / static_cast<float>(k) + eps);
}

// bf16((x * r) * w) for the 8 values of one chunk, packed two per word.
__device__ __forceinline__ void normalize(const uint4& xv, const uint4& wv, float r, uint32_t (&y)[4]) {
  const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w}, ww[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
  for (int i = 0; i < 4; ++i)
    y[i] = bf16x2_rn((bf16_lo(xw[i]) * r) * bf16_lo(ww[i]), (bf16_hi(xw[i]) * r) * bf16_hi(ww[i]));
}

// y = rmsnorm(x) * w for one row of k elements (k % 8 == 0, rmsnorm_warps_per_row(k) == 1: lane j
// on chunks j, j + 32, ...), by the 32 lanes of the calling warp together; x, w and y 16-byte
// aligned. The row is read twice, the second time from L1 / L2: meant for short rows (the
// 512-wide c_kv), where the norm kernels keep theirs in registers.
__device__ __forceinline__ void warp_rmsnorm_row(const bf16* __restrict__ x, const bf16* __restrict__ w, float eps,
                                                 int64_t k, bf16* __restrict__ y, int lane) {
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  const uint4* wr = reinterpret_cast<const uint4*>(w);
  const int64_t chunks = k / 8;
  float ss = 0.0f;
  for (int64_t c = lane; c < chunks; c += 32) ss = add_squares(__ldg(xr + c), ss);
  const float r = rms_inverse(warp_sum_butterfly(ss), k, eps);
  for (int64_t c = lane; c < chunks; c += 32) {
    uint32_t yw[4];
    normalize(__ldg(xr + c), __ldg(wr + c), r, yw);
    reinterpret_cast<uint4*>(y)[c] = make_uint4(yw[0], yw[1], yw[2], yw[3]);
  }
}

}  // namespace fp8proj::gpu
