// Host launchers of the MLA block's small kernels (src/cuda/mla/*.cu). They launch on `stream`
// and return: no allocation, no synchronisation. Arguments are assumed valid — device_mla_ops.cu
// checks them (null pointers, 16-byte alignment, extents) before calling.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "mla/mla_ops.hpp"

namespace fp8proj::mla::gpu {

// rope_cache.cu
void launch_prefill_rope(const PrefillRopeArgs& args, cudaStream_t stream);
void launch_decode_rope(const DecodeRopeArgs& args, cudaStream_t stream);
// sm80_head_gemm_mma.cu
void launch_head_gemm(const HeadGemmArgs& args, cudaStream_t stream);
// Largest k whose CTA fits in an sm_90 CTA's shared memory at 64 rows.
inline constexpr int kHeadGemmMaxK = 864;
// weight_layout.cu
void launch_transpose_heads(const bf16* in, bf16* out, int heads, int64_t rows, int64_t cols, cudaStream_t stream);

// Grid limits: one CTA per token (prefill) or per sequence (decode) in grid.x.
inline constexpr int64_t kMaxRopeTokens = int64_t{1} << 31;

}  // namespace fp8proj::mla::gpu
