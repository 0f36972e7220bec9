// CPU reference quantizers (see include/fp8proj/quantize.hpp for the contract).
#include <cmath>
#include <vector>

#include "core/parallel.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/formats.hpp"
#include "fp8proj/quantize.hpp"
#include "quant/silu_exact.hpp"

namespace fp8proj {

namespace {

float load(const float* p, int64_t i) { return p[i]; }
float load(const bf16* p, int64_t i) { return bf16_to_float(p[i]); }

// Scale of a group from its amax; NaN when the group held a non-finite value.
struct GroupScale {
  float scale, inv;
};
GroupScale scale_of(float amax, bool finite, float eps, ScaleMode mode) {
  if (!finite) return {NAN, NAN};
  if (mode == ScaleMode::ue8m0) {
    const uint8_t e = ue8m0_scale_for_amax(amax, eps);
    return {ue8m0_to_float(e), ue8m0_inverse(e)};
  }
  const float s = group_scale(amax, eps, mode);
  return {s, 1.0f / s};
}

uint8_t encode(float x, const GroupScale& s, ScaleMode mode) {
  if (std::isnan(s.scale)) return kE4m3NaN;
  return quantize_value(x, s.scale, s.inv, mode);
}

template <typename T>
void quantize_weight_impl(const T* w, int64_t n, int64_t k, Fp8WeightOut out, ScaleMode mode) {
  check_weight_args(w, n, k, out);
  const int64_t rows = ceil_div(n, 128), cols = ceil_div(k, 128);
  parallel_for(rows * cols, 4, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t r0 = (blk / cols) * 128, c0 = (blk % cols) * 128;
      const int64_t r1 = std::min(n, r0 + 128), c1 = std::min(k, c0 + 128);
      float amax = 0.0f;
      bool finite = true;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          const float v = load(w, r * k + c);
          finite = finite && is_finite_float(v);
          amax = std::fmax(amax, std::fabs(v));
        }
      const GroupScale s = scale_of(amax, finite, kWeightAmaxEps, mode);
      out.scales[blk] = s.scale;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) out.values[r * k + c] = encode(load(w, r * k + c), s, mode);
    }
  });
}

template <typename T>
void quantize_activation_impl(const T* x, int64_t m, int64_t k, Fp8ActivationOut out, ScaleMode mode) {
  check_activation_args(x, m, k, out);
  const int64_t groups = k / 128;
  parallel_for(m, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t base = r * k + g * 128;
        float amax = 0.0f;
        bool finite = true;
        for (int64_t c = 0; c < 128; ++c) {
          const float v = load(x, base + c);
          finite = finite && is_finite_float(v);
          amax = std::fmax(amax, std::fabs(v));
        }
        const GroupScale s = scale_of(amax, finite, kActAmaxEps, mode);
        out.scales[g * out.scale_ld + r] = s.scale;
        for (int64_t c = 0; c < 128; ++c) out.values[base + c] = encode(load(x, base + c), s, mode);
      }
    }
  });
}

}  // namespace

void check_weight_args(const void* w, int64_t n, int64_t k, const Fp8WeightOut& out) {
  FP8PROJ_CHECK(n > 0 && k > 0, "weight shape must be positive, got N=", n, " K=", k);
  FP8PROJ_CHECK(w != nullptr, "weight pointer is null (N=", n, " K=", k, ")");
  FP8PROJ_CHECK(out.values != nullptr && out.scales != nullptr,
                "FP8 weight output has a null values or scales pointer");
  FP8PROJ_CHECK(out.n == n && out.k == k, "FP8 weight output is ", out.n, "x", out.k,
                " but the weight is ", n, "x", k);
}

void check_activation_args(const void* x, int64_t m, int64_t k, const Fp8ActivationOut& out) {
  FP8PROJ_CHECK(m >= 0, "activation rows M must be >= 0, got ", m);
  FP8PROJ_CHECK(k > 0 && k % 128 == 0, "activation quantization needs K to be a positive multiple of 128 "
                "(1x128 groups), got K=", k);
  FP8PROJ_CHECK(out.k == k && out.m >= m, "FP8 activation output is ", out.m, "x", out.k,
                ", too small for ", m, "x", k);
  FP8PROJ_CHECK(out.scale_ld >= activation_scale_ld(m) && out.scale_ld % 4 == 0,
                "activation scale stride ", out.scale_ld, " must be a multiple of 4 and >= round_up(M=", m,
                ", 4)");
  if (m == 0) return;
  FP8PROJ_CHECK(x != nullptr, "activation input pointer is null (M=", m, " K=", k, ")");
  FP8PROJ_CHECK(out.values != nullptr && out.scales != nullptr,
                "FP8 activation output has a null values or scales pointer");
}

std::optional<ScaleMode> parse_scale_mode(std::string_view name) {
  if (name == "ue8m0") return ScaleMode::ue8m0;
  if (name == "float" || name == "fp32") return ScaleMode::fp32;
  return std::nullopt;
}

const char* scale_mode_name(ScaleMode mode) { return mode == ScaleMode::ue8m0 ? "ue8m0" : "float"; }

HostFp8Weight make_host_fp8_weight(int64_t n, int64_t k) {
  FP8PROJ_CHECK(n > 0 && k > 0, "weight shape must be positive, got N=", n, " K=", k);
  HostFp8Weight w;
  w.n = n;
  w.k = k;
  w.values.resize(static_cast<size_t>(n * k));
  w.scales.resize(static_cast<size_t>(ceil_div(n, 128) * ceil_div(k, 128)));
  return w;
}

HostFp8Activation make_host_fp8_activation(int64_t m, int64_t k) {
  FP8PROJ_CHECK(m >= 0 && k > 0 && k % 128 == 0, "activation shape must have M >= 0 and K a positive "
                "multiple of 128, got M=", m, " K=", k);
  HostFp8Activation x;
  x.m = m;
  x.k = k;
  x.scale_ld = activation_scale_ld(m);
  x.values.resize(static_cast<size_t>(m * k));
  x.scales.assign(static_cast<size_t>((k / 128) * x.scale_ld), 0.0f);
  return x;
}

namespace cpu {

void quantize_weight(const bf16* w, int64_t n, int64_t k, Fp8WeightOut out, ScaleMode mode) {
  quantize_weight_impl(w, n, k, out, mode);
}
void quantize_weight(const float* w, int64_t n, int64_t k, Fp8WeightOut out, ScaleMode mode) {
  quantize_weight_impl(w, n, k, out, mode);
}
void quantize_activation(const bf16* x, int64_t m, int64_t k, Fp8ActivationOut out, ScaleMode mode) {
  quantize_activation_impl(x, m, k, out, mode);
}
void quantize_activation(const float* x, int64_t m, int64_t k, Fp8ActivationOut out, ScaleMode mode) {
  quantize_activation_impl(x, m, k, out, mode);
}

void rmsnorm(const bf16* x, int64_t x_stride, const bf16* weight, float eps, int64_t m, int64_t k, bf16* y) {
  FP8PROJ_CHECK(m >= 0 && k > 0 && k % 8 == 0, "rmsnorm needs M >= 0 and K a positive multiple of 8, "
                "got M=", m, " K=", k);
  FP8PROJ_CHECK(x_stride >= k, "rmsnorm input row stride ", x_stride, " is below K=", k);
  if (m == 0) return;
  FP8PROJ_CHECK(x && weight && y, "rmsnorm got a null pointer");
  FP8PROJ_CHECK(eps >= 0.0f, "rmsnorm eps must be >= 0, got ", eps);
  parallel_for(m, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const bf16* row = x + r * x_stride;
      const int warps = rmsnorm_warps_per_row(k), threads = 32 * warps;
      float lane[32 * kRmsnormWideWarps] = {};
      for (int64_t c = 0; c < k / 8; ++c)
        for (int e = 0; e < 8; ++e) {
          const float v = bf16_to_float(row[c * 8 + e]);
          lane[c % threads] = std::fma(v, v, lane[c % threads]);
        }
      float ss = 0.0f;
      for (int w = 0; w < warps; ++w) {
        float* warp = lane + 32 * w;
        for (int off = 16; off >= 1; off /= 2) {
          float next[32];
          for (int j = 0; j < 32; ++j) next[j] = warp[j] + warp[j ^ off];
          std::copy(next, next + 32, warp);
        }
        ss = w == 0 ? warp[0] : ss + warp[0];  // the warps' sums in order
      }
      const float r_inv = 1.0f / std::sqrt(ss / static_cast<float>(k) + eps);
      for (int64_t c = 0; c < k; ++c)
        y[r * k + c] = float_to_bf16((bf16_to_float(row[c]) * r_inv) * bf16_to_float(weight[c]));
    }
  });
}

void rmsnorm_quantize(const bf16* x, int64_t x_stride, const bf16* weight, float eps, int64_t m, int64_t k,
                      Fp8ActivationOut out, ScaleMode mode) {
  check_activation_args(x, m, k, out);
  if (m == 0) return;
  std::vector<bf16> normed(static_cast<size_t>(m * k));
  rmsnorm(x, x_stride, weight, eps, m, k, normed.data());
  quantize_activation(normed.data(), m, k, out, mode);
}

void silu_mul(const bf16* gate, const bf16* up, int64_t stride, int64_t m, int64_t k, bf16* y) {
  FP8PROJ_CHECK(m >= 0 && k > 0, "silu_mul needs M >= 0 and K > 0, got M=", m, " K=", k);
  FP8PROJ_CHECK(stride >= k, "silu_mul row stride ", stride, " is below K=", k);
  if (m == 0) return;
  FP8PROJ_CHECK(gate && up && y, "silu_mul got a null pointer");
  parallel_for(m, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t c = 0; c < k; ++c) {
        const float g = bf16_to_float(gate[r * stride + c]);
        const float s = bf16_to_float(float_to_bf16(detail::silu_exact(g)));
        y[r * k + c] = float_to_bf16(s * bf16_to_float(up[r * stride + c]));
      }
  });
}

void silu_mul_quantize(const bf16* gate, const bf16* up, int64_t stride, int64_t m, int64_t k,
                       Fp8ActivationOut out, ScaleMode mode) {
  check_activation_args(gate, m, k, out);
  if (m == 0) return;
  std::vector<bf16> h(static_cast<size_t>(m * k));
  silu_mul(gate, up, stride, m, k, h.data());
  quantize_activation(h.data(), m, k, out, mode);
}

std::vector<float> dequantize(const Fp8WeightView& w) {
  FP8PROJ_CHECK(w.values && w.scales && w.n > 0 && w.k > 0, "dequantize: empty or null FP8 weight");
  std::vector<float> out(static_cast<size_t>(w.n * w.k));
  parallel_for(w.n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t c = 0; c < w.k; ++c) out[r * w.k + c] = e4m3_to_float(w.values[r * w.k + c]) * w.scale(r, c);
  });
  return out;
}

std::vector<float> dequantize(const Fp8ActivationView& x) {
  FP8PROJ_CHECK(x.m == 0 || (x.values && x.scales), "dequantize: null FP8 activation");
  std::vector<float> out(static_cast<size_t>(x.m * x.k));
  parallel_for(x.m, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t c = 0; c < x.k; ++c) out[r * x.k + c] = e4m3_to_float(x.values[r * x.k + c]) * x.scale(r, c);
  });
  return out;
}

}  // namespace cpu
}  // namespace fp8proj
