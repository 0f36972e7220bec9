// Quantizers and dequantizers of the block-scaled recipe.
//
//   weights      128x128 blocks -> e4m3 [N, K] + fp32 scales [ceil(N/128), ceil(K/128)]
//                (any N, K: edge blocks are partial and use their own amax), eps 1e-4
//   activations  1x128 groups per token -> e4m3 [M, K] + fp32 scales [K/128, round_up(M,4)]
//                (K must be a multiple of 128), eps 1e-10
//
// Non-finite input: a group (or weight block) holding a NaN or an infinity gets a NaN scale
// and NaN codes, so that every output it touches is NaN rather than silent garbage (an amax
// taken with fmaxf would skip the NaN). Scales are UE8M0 powers of two stored as fp32 values
// unless ScaleMode::fp32 ("float", amax/448) is asked for (formats.hpp defines both rules).
//
// The CPU versions below are the reference; the GPU kernels (src/cuda/quant/) are tested to
// be bit-identical to them.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "fp8proj/bf16.hpp"
#include "fp8proj/formats.hpp"
#include "fp8proj/tensor.hpp"

namespace fp8proj {

// The scale formats by their user-facing names: "ue8m0" and "float" (also "fp32"), as
// FP8PROJ_WEIGHT_SCALES, the CLI's --weight-scales and the Python scale_fmt arguments spell
// them (transformers' FineGrainedFP8Config uses the same two words). nullopt for any other.
std::optional<ScaleMode> parse_scale_mode(std::string_view name);
const char* scale_mode_name(ScaleMode mode);  // "ue8m0" | "float"

// Owning host containers, handy for tests, the CLI and checkpoint loading.
struct HostFp8Weight {
  std::vector<uint8_t> values;
  std::vector<float> scales;
  int64_t n = 0, k = 0;

  Fp8WeightView view() const { return {values.data(), scales.data(), n, k}; }
  Fp8WeightOut out() { return {values.data(), scales.data(), n, k}; }
};

struct HostFp8Activation {
  std::vector<uint8_t> values;
  std::vector<float> scales;
  int64_t m = 0, k = 0, scale_ld = 0;

  Fp8ActivationView view() const { return {values.data(), scales.data(), m, k, scale_ld}; }
  Fp8ActivationOut out() { return {values.data(), scales.data(), m, k, scale_ld}; }
};

HostFp8Weight make_host_fp8_weight(int64_t n, int64_t k);
HostFp8Activation make_host_fp8_activation(int64_t m, int64_t k);

// RMSNorm epsilon used when a caller does not give one (DeepSeek-V3 / GLM-5 configs).
inline constexpr float kRmsNormEps = 1e-6f;

namespace cpu {

void quantize_weight(const bf16* w, int64_t n, int64_t k, Fp8WeightOut out,
                     ScaleMode mode = ScaleMode::ue8m0);
void quantize_weight(const float* w, int64_t n, int64_t k, Fp8WeightOut out,
                     ScaleMode mode = ScaleMode::ue8m0);

void quantize_activation(const bf16* x, int64_t m, int64_t k, Fp8ActivationOut out,
                         ScaleMode mode = ScaleMode::ue8m0);
void quantize_activation(const float* x, int64_t m, int64_t k, Fp8ActivationOut out,
                         ScaleMode mode = ScaleMode::ue8m0);

// y = bf16((x * r) * w) with r = 1 / sqrtf(ss / K + eps). The sum of squares ss follows
// the fixed order the GPU kernel uses, so both agree bit for bit: with W =
// rmsnorm_warps_per_row(K) (formats.hpp: 1 up to K = 2048, else 4),
//   lane t in 0..32W-1 accumulates, with fmaf in increasing index order, the elements of the
//   8-element chunks c = t, t + 32W, t + 64W, ... (elements 8c .. 8c+7); each group of 32 lanes
//   combines its partial sums by the butterfly s[j] += s[j ^ off] for off = 16, 8, 4, 2, 1; the W
//   sums are added in order.
// Row r of x starts at x + r * x_stride (x_stride >= k: a view into wider rows); y is dense.
void rmsnorm(const bf16* x, int64_t x_stride, const bf16* weight, float eps, int64_t m, int64_t k,
             bf16* y);

// quantize_activation(rmsnorm(x), mode): the bf16 rounding of the norm's output is kept, so the
// fused GPU kernel gives exactly what the unfused norm-then-quantize gives.
void rmsnorm_quantize(const bf16* x, int64_t x_stride, const bf16* weight, float eps, int64_t m,
                      int64_t k, Fp8ActivationOut out, ScaleMode mode = ScaleMode::ue8m0);

// y = bf16(bf16(silu(gate)) * up), silu(g) = g / (1 + exp(-g)) in fp32: PyTorch's bf16
// act_fn(gate) * up (two roundings). Rows of gate and up are `stride` >= k elements apart; y is
// dense [m, k]. exp is fp8proj's own (src/quant/silu_exact.hpp, within ~1.5 ulp), the same bits on
// host and device, so the CPU reference and the GPU kernel agree bit for bit; against a library
// expf (PyTorch's silu) bf16(silu(g)) may differ by one step for the few gates near a tie.
void silu_mul(const bf16* gate, const bf16* up, int64_t stride, int64_t m, int64_t k, bf16* y);

// quantize_activation(silu_mul(gate, up), mode).
void silu_mul_quantize(const bf16* gate, const bf16* up, int64_t stride, int64_t m, int64_t k,
                       Fp8ActivationOut out, ScaleMode mode = ScaleMode::ue8m0);

std::vector<float> dequantize(const Fp8WeightView& w);      // [N, K] fp32
std::vector<float> dequantize(const Fp8ActivationView& x);  // [M, K] fp32

}  // namespace cpu

// Checks shared by every implementation; each throws fp8proj::Error with the reason.
void check_activation_args(const void* x, int64_t m, int64_t k, const Fp8ActivationOut& out);
void check_weight_args(const void* w, int64_t n, int64_t k, const Fp8WeightOut& out);

}  // namespace fp8proj
