// Host launchers of the quantization kernels (src/cuda/quant/*.cu). They launch on `stream`
// and return: no allocation, no synchronisation. Arguments are assumed valid — device_ops.cu
// checks them (shapes, null pointers, 16-byte alignment) before calling.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fp8proj/bf16.hpp"
#include "fp8proj/formats.hpp"
#include "fp8proj/tensor.hpp"

namespace fp8proj::gpu {

// x[m, k] -> out (1x128 groups, scales in `mode`'s format, eps kActAmaxEps). k % 128 == 0.
void launch_activation_quant(const bf16* x, int64_t m, int64_t k, const Fp8ActivationOut& out, ScaleMode mode,
                             cudaStream_t stream);

// quantize_activation(bf16(bf16(silu(gate)) * up), mode) in one pass (a gated MLP's down_proj
// input). k % 128 == 0; row r of gate / up at gate / up + r * stride (stride % 8 == 0).
void launch_silu_mul_quant(const bf16* gate, const bf16* up, int64_t stride, int64_t m, int64_t k,
                           const Fp8ActivationOut& out, ScaleMode mode, cudaStream_t stream);

// y = bf16((x * r) * w) with the reduction order of cpu::rmsnorm. k % 8 == 0; row r of x at
// x + r * x_stride (x_stride % 8 == 0), y dense.
void launch_rmsnorm(const bf16* x, int64_t x_stride, const bf16* w, float eps, int64_t m, int64_t k,
                    bf16* y, cudaStream_t stream);

// quantize_activation(rmsnorm(x), mode) in one pass. k % 128 == 0, k <= kMaxRmsnormQuantK.
void launch_rmsnorm_quant(const bf16* x, int64_t x_stride, const bf16* w, float eps, int64_t m,
                          int64_t k, const Fp8ActivationOut& out, ScaleMode mode, cudaStream_t stream);
// The fused kernel stages a CTA's scales (K/128 x its rows) in shared memory: 4 KB at this K
// (four warps per row, two rows a CTA).
inline constexpr int64_t kMaxRmsnormQuantK = 65536;

// w[n, k] -> out (128x128 blocks, scales in `mode`'s format, eps kWeightAmaxEps), any n, k.
void launch_weight_quant(const bf16* w, int64_t n, int64_t k, const Fp8WeightOut& out, ScaleMode mode,
                         cudaStream_t stream);

// Largest M the activation kernels accept: grid.y of the activation kernel is M / 32 and
// must stay below 65536.
inline constexpr int64_t kMaxQuantRows = int64_t{65535} * 32;

}  // namespace fp8proj::gpu
