// MlaOps for MemorySpace::device (src/mla/mla_ops.hpp): checks the arguments on the host, then
// launches the kernels of src/cuda/mla/ on the caller's stream. prefill_rope, decode_rope and
// head_gemm neither allocate nor synchronise (decode steps are captured in CUDA graphs);
// copy_2d and transpose_heads run at load time and wait for their work.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda_check.hpp"
#include "cuda/common/alignment.hpp"
#include "cuda/mla/mla_kernels.hpp"
#include "fp8proj/error.hpp"
#include "mla/mla_ops.hpp"

namespace fp8proj::mla {

namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The kernels move 16-byte vectors: base pointers 16-byte aligned, row strides whole vectors.
void check_vec(const void* p, int64_t stride, const char* what) {
  FP8PROJ_CHECK(p != nullptr, "MLA kernel: ", what, " is null");
  FP8PROJ_CHECK(aligned16(p) && stride % 8 == 0, "MLA kernel: ", what, " must be 16-byte aligned with a row stride ",
                "that is a multiple of 8 elements (got address ", p, ", stride ", stride, ")");
}

void check_dims(const RopeDims& d) {
  FP8PROJ_CHECK(d.heads > 0 && d.nope % 8 == 0 && d.rope % 8 == 0 && d.rope > 0 && d.rope <= 256 &&
                    d.kv_lora % 8 == 0 && d.inv_freq != nullptr,
                "MLA RoPE kernel: unsupported dims (heads ", d.heads, ", nope ", d.nope, ", rope ", d.rope, ", kv_lora ",
                d.kv_lora, ")");
}

cudaStream_t as_cuda(StreamHandle s) { return static_cast<cudaStream_t>(s); }

class DeviceMlaOps final : public MlaOps {
 public:
  MemorySpace space() const override { return MemorySpace::device; }

  void copy_2d(bf16* dst, int64_t dst_ld, const bf16* src, MemorySpace, int64_t src_ld, int64_t rows,
               int64_t cols) const override {
    FP8PROJ_CHECK(dst && src && rows >= 0 && cols >= 0 && dst_ld >= cols && src_ld >= cols,
                  "copy_2d: null pointer or bad extents");
    if (rows == 0 || cols == 0) return;
    // cudaMemcpyDefault: the source may be host or device memory (unified addressing).
    CUDA_CHECK(cudaMemcpy2D(dst, static_cast<size_t>(dst_ld) * sizeof(bf16), src,
                            static_cast<size_t>(src_ld) * sizeof(bf16), static_cast<size_t>(cols) * sizeof(bf16),
                            static_cast<size_t>(rows), cudaMemcpyDefault));
    CUDA_CHECK(cudaDeviceSynchronize());
  }

  void transpose_heads(const bf16* in, bf16* out, int heads, int64_t rows, int64_t cols) const override {
    FP8PROJ_CHECK(in && out && heads >= 0 && rows >= 0 && cols >= 0, "transpose_heads: null pointer or bad extents");
    FP8PROJ_CHECK(heads <= 65535, "transpose_heads: at most 65535 heads");
    gpu::launch_transpose_heads(in, out, heads, rows, cols, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
  }

  void prefill_rope(const PrefillRopeArgs& a, StreamHandle stream) const override {
    if (a.tokens == 0) return;
    check_dims(a.dims);
    FP8PROJ_CHECK(a.tokens > 0 && a.tokens < gpu::kMaxRopeTokens && a.num_seqs > 0, "prefill RoPE: bad token count ",
                  a.tokens, " or sequence count ", a.num_seqs);
    FP8PROJ_CHECK(a.seq_offsets && a.cache_start && a.cache, "prefill RoPE: null offsets, cache starts or cache");
    check_vec(a.q, a.q_stride, "q");
    check_vec(a.k_rope_raw, a.k_rope_stride, "k_rope (fused_qkv_a output)");
    check_vec(a.kv_c, a.dims.kv_lora, "kv_c");
    check_vec(a.kv, a.kv_stride, "kv (kv_b_proj output)");
    check_vec(a.k, a.dims.nope + a.dims.rope, "k");
    check_vec(a.cache, a.dims.kv_lora + a.dims.rope, "cache");
    gpu::launch_prefill_rope(a, as_cuda(stream));
  }

  void decode_rope(const DecodeRopeArgs& a, StreamHandle stream) const override {
    if (a.batch == 0) return;
    check_dims(a.dims);
    FP8PROJ_CHECK(a.batch > 0, "decode RoPE: batch must be >= 0");
    FP8PROJ_CHECK(a.positions && a.cache_start && a.cache_len && a.cache, "decode RoPE: null positions, cache starts, ",
                  "lengths or cache");
    check_vec(a.q, a.q_stride, "q");
    check_vec(a.k_rope_raw, a.k_rope_stride, "k_rope (fused_qkv_a output)");
    check_decode_rope_kv(a);
    check_vec(a.kv_c, a.kv_c_stride, "kv_c");
    if (a.kv_norm != nullptr) check_vec(a.kv_norm, 0, "kv_a_layernorm weight");
    check_vec(a.q_rope, a.dims.rope, "q_rope");
    check_vec(a.cache, a.dims.kv_lora + a.dims.rope, "cache");
    gpu::launch_decode_rope(a, as_cuda(stream));
  }

  void head_gemm(const HeadGemmArgs& a, StreamHandle stream) const override {
    if (a.rows == 0) return;
    FP8PROJ_CHECK(a.rows > 0 && a.heads > 0 && a.heads <= 65535 && a.n > 0 && a.n % 8 == 0 && a.k > 0 && a.k % 32 == 0,
                  "absorbed decode projection: needs n a multiple of 8 and k of 32 (got rows ", a.rows, ", heads ",
                  a.heads, ", n ", a.n, ", k ", a.k, ")");
    FP8PROJ_CHECK(a.k <= gpu::kHeadGemmMaxK, "absorbed decode projection: k ", a.k, " exceeds ", gpu::kHeadGemmMaxK,
                  ", the most one CTA's shared memory holds (64 weight rows and 64 input rows of k)");
    check_vec(a.x, a.x_row_stride, "absorbed projection input");
    FP8PROJ_CHECK(a.x_head_stride % 8 == 0, "absorbed projection: input head stride must be a multiple of 8");
    check_vec(a.w, a.k, "absorbed projection weight");
    if (a.y_fp8.values != nullptr) {
      check_head_gemm_fp8_out(a);
      FP8PROJ_CHECK(is_aligned16(a.y_fp8.values) && is_aligned16(a.y_fp8.scales),
                    "absorbed projection: FP8 output values and scales must be 16-byte aligned");
    } else {
      FP8PROJ_CHECK(a.y != nullptr && reinterpret_cast<uintptr_t>(a.y) % 4 == 0 && a.y_row_stride % 2 == 0 &&
                        a.y_head_stride % 2 == 0,
                    "absorbed projection: output must be 4-byte aligned with even strides");
    }
    gpu::launch_head_gemm(a, as_cuda(stream));
  }
};

}  // namespace

const MlaOps& cuda_mla_ops() {
  static const DeviceMlaOps ops;
  return ops;
}

}  // namespace fp8proj::mla
