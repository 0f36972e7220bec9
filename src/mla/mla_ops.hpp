// Internal: the MLA block's small passes behind one interface per memory space, as QuantOps
// does for the quantizers. The host implementation (mla_ops_cpu.cpp) is the reference; the
// device one (src/cuda/mla/) launches kernels on the given stream, without allocation or
// synchronisation (except copy_2d and transpose_heads, which run at load time).
//
// Layouts (shape : stride, elements; H = local heads, T tokens, B decode rows):
//   q          [T, H, nope+rope] : [q_stride, nope+rope, 1]   q_b_proj output; rope part last
//   k_rope_raw [T, rope] : [k_rope_stride, 1]                 the rope columns of fused_qkv_a
//   kv_c       [T, kv_lora] : [kv_lora, 1]                    kv_a_layernorm output
//   kv         [T, H*nope | H*v] : [kv_stride, 1]             kv_b_proj output with its weight rows
//                                                             permuted: all heads' k_nope, then v
//   k          [T, H, nope+rope] : [H*(nope+rope), nope+rope, 1]   prefill keys (built here)
//   cache      [capacity, kv_lora+rope] : [kv_lora+rope, 1]   [c_kv | roped k_rope] per token
//   q_rope     [B, H, rope] : [H*rope, rope, 1]               decode: roped q rope part
#pragma once

#include <cstdint>

#include "fp8proj/bf16.hpp"
#include "fp8proj/formats.hpp"
#include "fp8proj/tensor.hpp"

namespace fp8proj::mla {

struct RopeDims {
  int heads = 0, nope = 0, rope = 0;
  int64_t kv_lora = 0;
  const float* inv_freq = nullptr;  // [rope / 2], in the ops' memory space
  float mscale = 1.0f;              // factor on cos and sin (YaRN attention factor)
};

// Prefill: RoPE on q (in place) and on the shared k_rope, the cache rows, and k = [k_nope | k_rope].
struct PrefillRopeArgs {
  RopeDims dims;
  int64_t tokens = 0;
  int num_seqs = 0;
  const int32_t* seq_offsets = nullptr;  // [num_seqs + 1]
  const int32_t* cache_start = nullptr;  // [num_seqs]
  bf16* q = nullptr;
  int64_t q_stride = 0;
  const bf16* k_rope_raw = nullptr;
  int64_t k_rope_stride = 0;
  const bf16* kv_c = nullptr;
  const bf16* kv = nullptr;  // k_nope of head h at column h*nope
  int64_t kv_stride = 0;
  bf16* k = nullptr;
  bf16* cache = nullptr;
  int64_t cache_capacity = 0;  // rows outside [0, capacity) are not written
};

// Decode: roped q rope part to q_rope, the cache row of each new token, cache_len = pos + 1.
// With kv_norm set, kv_c is kv_a_layernorm's input (the c_kv columns of fused_qkv_a's output,
// kv_c_stride apart) and the cache row gets rmsnorm(kv_c) * kv_norm, bit for bit the separate
// QuantOps::rmsnorm it replaces (one launch fewer per decode step). Needs
// rmsnorm_warps_per_row(kv_lora) == 1 (kv_lora <= 2048).
struct DecodeRopeArgs {
  RopeDims dims;
  int batch = 0;
  const int32_t* positions = nullptr;
  const int32_t* cache_start = nullptr;
  int32_t* cache_len = nullptr;
  const bf16* q = nullptr;
  int64_t q_stride = 0;
  const bf16* k_rope_raw = nullptr;
  int64_t k_rope_stride = 0;
  const bf16* kv_c = nullptr;
  int64_t kv_c_stride = 0;  // elements between rows, >= kv_lora
  const bf16* kv_norm = nullptr;  // [kv_lora] kv_a_layernorm weight, or null: kv_c is already normalized
  float kv_norm_eps = 0.0f;
  bf16* q_rope = nullptr;
  bf16* cache = nullptr;
  int64_t cache_capacity = 0;
};

// Whether decode_rope can take kv_a_layernorm for rows of kv_lora (DecodeRopeArgs::kv_norm).
constexpr bool decode_rope_fuses_norm(int64_t kv_lora) { return rmsnorm_warps_per_row(kv_lora) == 1; }

// kv_c's stride and the fused norm's rules, checked by both implementations.
void check_decode_rope_kv(const DecodeRopeArgs& args);

// The absorbed decode projections, one small GEMM per head:
//   y[b, h, n] = bf16( sum_k x[b, h, k] * w[h, n, k] )   fp32 accumulation
//   x [rows, heads, k] : [x_row_stride, x_head_stride, 1]
//   w [heads, n, k]    : [n*k, k, 1]
//   y [rows, heads, n] : [y_row_stride, y_head_stride, 1]
// q_latent = q_nope . W_UK uses w = W_UK^T per head ([kv_lora, nope]); out = out_latent . W_UV^T
// uses w = W_UV ([v, kv_lora]) as kv_b_proj holds it.
struct HeadGemmArgs {
  const bf16* x = nullptr;
  int64_t x_row_stride = 0, x_head_stride = 0;
  const bf16* w = nullptr;
  bf16* y = nullptr;
  int64_t y_row_stride = 0, y_head_stride = 0;
  int rows = 0, heads = 0, n = 0, k = 0;
  // Set (values non-null): y is not written; its rows, as one dense [rows, heads * n] matrix,
  // go out as the next GEMM's FP8 input instead -- e4m3 + 1x128 UE8M0 scales (M-contiguous,
  // scale_ld apart), bit for bit QuantOps::quantize_activation of the bf16 y the other mode
  // writes. Needs n % 128 == 0 (a group never straddles two heads), y_fp8.m == rows and
  // y_fp8.k == heads * n. out_latent . W_UV^T writes o_proj's input this way at decode.
  Fp8ActivationOut y_fp8;
};

// The FP8 output's rules (HeadGemmArgs::y_fp8), checked by both implementations.
void check_head_gemm_fp8_out(const HeadGemmArgs& args);

class MlaOps {
 public:
  virtual ~MlaOps() = default;
  virtual MemorySpace space() const = 0;

  // dst[r, c] = src[r, c] for r < rows, c < cols bf16 elements (strides in elements); src in
  // `src_space`, dst in this space. Synchronous (load time).
  virtual void copy_2d(bf16* dst, int64_t dst_ld, const bf16* src, MemorySpace src_space, int64_t src_ld,
                       int64_t rows, int64_t cols) const = 0;
  // out[h, c, r] = in[h, r, c]: heads matrices [rows, cols] -> [cols, rows], both dense and in
  // this space. Synchronous (load time).
  virtual void transpose_heads(const bf16* in, bf16* out, int heads, int64_t rows, int64_t cols) const = 0;

  virtual void prefill_rope(const PrefillRopeArgs& args, StreamHandle stream) const = 0;
  virtual void decode_rope(const DecodeRopeArgs& args, StreamHandle stream) const = 0;
  virtual void head_gemm(const HeadGemmArgs& args, StreamHandle stream) const = 0;
};

// The implementation for a memory space; throws if the device one is not built.
const MlaOps& mla_ops(MemorySpace space);

#if FP8PROJ_WITH_CUDA
const MlaOps& cuda_mla_ops();  // src/cuda/mla/device_mla_ops.cu
#endif

// RoPE of one interleaved pair, shared by host and device so both round the same way:
// (x0, x1) -> (x0 c - x1 s, x0 s + x1 c), each with one fused multiply-add.
FP8PROJ_HD void rope_pair(float x0, float x1, float c, float s, float& y0, float& y1) {
#if defined(__CUDA_ARCH__)
  y0 = fmaf(x0, c, -(x1 * s));
  y1 = fmaf(x0, s, x1 * c);
#else
  y0 = __builtin_fmaf(x0, c, -(x1 * s));
  y1 = __builtin_fmaf(x0, s, x1 * c);
#endif
}

// The angle of pair i at position pos: fp32 product, as the reference's fp32 outer product.
FP8PROJ_HD float rope_angle(int32_t pos, float inv_freq) { return static_cast<float>(pos) * inv_freq; }

}  // namespace fp8proj::mla
