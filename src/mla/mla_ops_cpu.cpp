// MlaOps on the host: the reference of the device passes (src/cuda/mla/). Same inputs, same
// roundings (fp32 RoPE through rope_pair, cos/sin of the fp32 angle correctly rounded to fp32,
// bf16 outputs), so host and device blocks differ only by GEMM and attention summation order.
#include <cmath>
#include <cstring>
#include <vector>

#include "core/parallel.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/memory.hpp"
#include "fp8proj/quantize.hpp"
#include "mla/mla_ops.hpp"

namespace fp8proj::mla {

namespace {

float f(bf16 v) { return bf16_to_float(v); }

// cos and sin of pair i at `pos`, times the YaRN attention factor.
void cos_sin(const RopeDims& d, int32_t pos, int i, float& c, float& s) {
  const double a = rope_angle(pos, d.inv_freq[i]);
  c = static_cast<float>(std::cos(a)) * d.mscale;
  s = static_cast<float>(std::sin(a)) * d.mscale;
}

// Ropes `rope` interleaved values of `in` at `pos` into `out` (may alias).
void rope_vector(const RopeDims& d, int32_t pos, const bf16* in, bf16* out) {
  for (int i = 0; i < d.rope / 2; ++i) {
    float c, s, y0, y1;
    cos_sin(d, pos, i, c, s);
    rope_pair(f(in[2 * i]), f(in[2 * i + 1]), c, s, y0, y1);
    out[2 * i] = float_to_bf16(y0);
    out[2 * i + 1] = float_to_bf16(y1);
  }
}

class HostMlaOps final : public MlaOps {
 public:
  MemorySpace space() const override { return MemorySpace::host; }

  void copy_2d(bf16* dst, int64_t dst_ld, const bf16* src, MemorySpace src_space, int64_t src_ld, int64_t rows,
               int64_t cols) const override {
    FP8PROJ_CHECK(dst && src && rows >= 0 && cols >= 0, "copy_2d: null pointer or negative extent");
    if (src_space == MemorySpace::host) {
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(dst + r * dst_ld, src + r * src_ld, static_cast<size_t>(cols) * sizeof(bf16));
      return;
    }
    for (int64_t r = 0; r < rows; ++r)
      copy_bytes(dst + r * dst_ld, MemorySpace::host, src + r * src_ld, src_space,
                 static_cast<size_t>(cols) * sizeof(bf16));
  }

  void transpose_heads(const bf16* in, bf16* out, int heads, int64_t rows, int64_t cols) const override {
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) out[(h * cols + c) * rows + r] = in[(h * rows + r) * cols + c];
  }

  void prefill_rope(const PrefillRopeArgs& a, StreamHandle) const override {
    const RopeDims& d = a.dims;
    const int qk = d.nope + d.rope;
    for (int b = 0; b < a.num_seqs; ++b) {
      const int32_t begin = a.seq_offsets[b], end = a.seq_offsets[b + 1];
      parallel_for(end - begin, 16, [&](int64_t lo, int64_t hi) {
        std::vector<bf16> kr(static_cast<size_t>(d.rope));
        for (int64_t p = lo; p < hi; ++p) {
          const int64_t t = begin + p;
          const int32_t pos = static_cast<int32_t>(p);
          rope_vector(d, pos, a.k_rope_raw + t * a.k_rope_stride, kr.data());
          for (int h = 0; h < d.heads; ++h) {
            bf16* qh = a.q + t * a.q_stride + int64_t{h} * qk;
            rope_vector(d, pos, qh + d.nope, qh + d.nope);
            bf16* kh = a.k + (t * d.heads + h) * qk;
            std::memcpy(kh, a.kv + t * a.kv_stride + int64_t{h} * d.nope, sizeof(bf16) * d.nope);
            std::memcpy(kh + d.nope, kr.data(), sizeof(bf16) * d.rope);
          }
          const int64_t row = int64_t{a.cache_start[b]} + p;
          if (row < 0 || row >= a.cache_capacity) continue;
          bf16* cr = a.cache + row * (d.kv_lora + d.rope);
          std::memcpy(cr, a.kv_c + t * d.kv_lora, sizeof(bf16) * d.kv_lora);
          std::memcpy(cr + d.kv_lora, kr.data(), sizeof(bf16) * d.rope);
        }
      });
    }
  }

  void decode_rope(const DecodeRopeArgs& a, StreamHandle) const override {
    if (a.batch == 0) return;  // a no-op, arguments unchecked, as on the device
    FP8PROJ_CHECK(a.batch > 0, "decode RoPE: batch must be >= 0, got ", a.batch);
    const RopeDims& d = a.dims;
    check_decode_rope_kv(a);
    const int qk = d.nope + d.rope;
    for (int b = 0; b < a.batch; ++b) {
      const int32_t pos = a.positions[b];
      a.cache_len[b] = pos + 1;
      for (int h = 0; h < d.heads; ++h)
        rope_vector(d, pos, a.q + b * a.q_stride + int64_t{h} * qk + d.nope,
                    a.q_rope + (int64_t{b} * d.heads + h) * d.rope);
      const int64_t row = int64_t{a.cache_start[b]} + pos;
      if (row < 0 || row >= a.cache_capacity) continue;
      bf16* cr = a.cache + row * (d.kv_lora + d.rope);
      const bf16* kv_c = a.kv_c + b * a.kv_c_stride;
      if (a.kv_norm != nullptr)
        cpu::rmsnorm(kv_c, a.kv_c_stride, a.kv_norm, a.kv_norm_eps, 1, d.kv_lora, cr);
      else
        std::memcpy(cr, kv_c, sizeof(bf16) * d.kv_lora);
      rope_vector(d, pos, a.k_rope_raw + b * a.k_rope_stride, cr + d.kv_lora);
    }
  }

  void head_gemm(const HeadGemmArgs& a, StreamHandle) const override {
    if (a.rows <= 0) return;
    // FP8 output: the bf16 y the other mode writes, into a dense scratch, then the reference
    // quantizer -- which is what the device kernel's epilogue must equal bit for bit.
    std::vector<bf16> dense;
    HeadGemmArgs b = a;
    if (a.y_fp8.values != nullptr) {
      check_head_gemm_fp8_out(a);
      dense.resize(static_cast<size_t>(a.rows) * static_cast<size_t>(a.heads) * static_cast<size_t>(a.n));
      b.y = dense.data();
      b.y_row_stride = int64_t{a.heads} * a.n;
      b.y_head_stride = a.n;
    }
    compute(b);
    if (a.y_fp8.values != nullptr) cpu::quantize_activation(dense.data(), a.rows, b.y_row_stride, a.y_fp8);
  }

 private:
  static void compute(const HeadGemmArgs& a) {
    parallel_for(int64_t{a.heads} * a.rows, 4, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        const int64_t h = i / a.rows, r = i % a.rows;
        const bf16* x = a.x + r * a.x_row_stride + h * a.x_head_stride;
        const bf16* w = a.w + h * int64_t{a.n} * a.k;
        bf16* y = a.y + r * a.y_row_stride + h * a.y_head_stride;
        for (int n = 0; n < a.n; ++n) {
          float acc = 0.0f;
          for (int k = 0; k < a.k; ++k) acc += f(x[k]) * f(w[int64_t{n} * a.k + k]);
          y[n] = float_to_bf16(acc);
        }
      }
    });
  }
};

}  // namespace

void check_head_gemm_fp8_out(const HeadGemmArgs& a) {
  FP8PROJ_CHECK(a.n % 128 == 0, "absorbed projection with FP8 output: n ", a.n,
                " must be a multiple of 128 (a 1x128 group may not straddle two heads)");
  FP8PROJ_CHECK(a.y_fp8.scales != nullptr, "absorbed projection with FP8 output: scales pointer is null");
  FP8PROJ_CHECK(a.y_fp8.m == a.rows && a.y_fp8.k == int64_t{a.heads} * a.n, "absorbed projection with FP8 output: ",
                "the output is ", a.y_fp8.m, "x", a.y_fp8.k, ", expected rows x heads*n = ", a.rows, "x",
                int64_t{a.heads} * a.n);
  FP8PROJ_CHECK(a.y_fp8.scale_ld >= activation_scale_ld(a.rows) && a.y_fp8.scale_ld % 4 == 0,
                "absorbed projection with FP8 output: scale stride ", a.y_fp8.scale_ld,
                " must be a multiple of 4 and >= round_up(rows=", a.rows, ", 4)");
}

void check_decode_rope_kv(const DecodeRopeArgs& a) {
  FP8PROJ_CHECK(a.kv_c != nullptr && a.kv_c_stride >= a.dims.kv_lora, "decode RoPE: kv_c is null or its row stride ",
                a.kv_c_stride, " is below kv_lora ", a.dims.kv_lora);
  if (a.kv_norm == nullptr) return;
  FP8PROJ_CHECK(decode_rope_fuses_norm(a.dims.kv_lora), "decode RoPE: kv_a_layernorm over ", a.dims.kv_lora,
                " columns is not fused (one warp per row takes kv_lora <= 2048); run QuantOps::rmsnorm before it");
  FP8PROJ_CHECK(a.kv_norm_eps >= 0.0f, "decode RoPE: kv_a_layernorm eps must be >= 0, got ", a.kv_norm_eps);
}

const MlaOps& mla_ops(MemorySpace space) {
  static const HostMlaOps host;
  if (space == MemorySpace::host) return host;
#if FP8PROJ_WITH_CUDA
  return cuda_mla_ops();
#else
  FP8PROJ_FAIL("device MLA kernels asked for, but this build has no CUDA");
#endif
}

}  // namespace fp8proj::mla
