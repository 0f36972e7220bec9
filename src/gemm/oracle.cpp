// The oracle: CPU reference GEMMs and the error metric (include/fp8proj/reference.hpp). The
// cpu_reference backend (src/gemm/backend_cpu.cpp) runs its plans on these.
#include <cblas.h>

#include <cmath>
#include <vector>

#include "core/parallel.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/quantize.hpp"
#include "fp8proj/reference.hpp"

namespace fp8proj {
namespace cpu {

void sgemm_nt(const float* a, const float* b, float* c, int64_t m, int64_t n, int64_t k) {
  if (m == 0 || n == 0) return;
  // Row-major C = A . B^T. OpenBLAS threads internally over the host's cores.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), 1.0f, a, static_cast<blasint>(k), b, static_cast<blasint>(k), 0.0f, c,
              static_cast<blasint>(n));
}

std::vector<float> to_float(const bf16* x, int64_t count) {
  std::vector<float> out(static_cast<size_t>(count));
  parallel_for(count, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = bf16_to_float(x[i]);
  });
  return out;
}

std::vector<bf16> to_bf16(const float* x, int64_t count) {
  std::vector<bf16> out(static_cast<size_t>(count));
  parallel_for(count, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) out[i] = float_to_bf16(x[i]);
  });
  return out;
}

namespace {
void store_bf16(const std::vector<float>& c, bf16* d) {
  parallel_for(static_cast<int64_t>(c.size()), 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) d[i] = float_to_bf16(c[i]);
  });
}
}  // namespace

void gemm_bf16(const bf16* a, const bf16* b, bf16* d, int64_t m, int64_t n, int64_t k) {
  FP8PROJ_CHECK(m >= 0 && n > 0 && k > 0, "gemm_bf16: bad shape M=", m, " N=", n, " K=", k);
  if (m == 0) return;
  FP8PROJ_CHECK(a && b && d, "gemm_bf16: null pointer");
  const std::vector<float> af = to_float(a, m * k), bf = to_float(b, n * k);
  std::vector<float> c(static_cast<size_t>(m * n));
  sgemm_nt(af.data(), bf.data(), c.data(), m, n, k);
  store_bf16(c, d);
}

void gemm_fp8_block(const Fp8ActivationView& a, const Fp8WeightView& b, bf16* d) {
  FP8PROJ_CHECK(a.k == b.k, "gemm_fp8_block: activation K=", a.k, " but weight K=", b.k);
  if (a.m == 0) return;
  FP8PROJ_CHECK(d != nullptr, "gemm_fp8_block: null output");
  // Exact: e4m3 values times power-of-two scales are representable in fp32, so this is the
  // block-scaled product up to the fp32 accumulation order.
  const std::vector<float> af = dequantize(a), bf = dequantize(b);
  std::vector<float> c(static_cast<size_t>(a.m * b.n));
  sgemm_nt(af.data(), bf.data(), c.data(), a.m, b.n, a.k);
  store_bf16(c, d);
}

std::vector<double> gemm_f64(const float* a, const float* b, int64_t m, int64_t n, int64_t k) {
  std::vector<double> c(static_cast<size_t>(m * n));
  // Blocked over N so that a panel of B stays in cache while rows of A stream past.
  constexpr int64_t kPanel = 64;
  parallel_for(m, 4, [&](int64_t begin, int64_t end) {
    for (int64_t j0 = 0; j0 < n; j0 += kPanel) {
      const int64_t j1 = std::min(n, j0 + kPanel);
      for (int64_t i = begin; i < end; ++i) {
        const float* ar = a + i * k;
        for (int64_t j = j0; j < j1; ++j) {
          const float* br = b + j * k;
          double s = 0.0;
          for (int64_t p = 0; p < k; ++p) s += static_cast<double>(ar[p]) * static_cast<double>(br[p]);
          c[i * n + j] = s;
        }
      }
    }
  });
  return c;
}

}  // namespace cpu

ErrorStats compare(const bf16* out, const double* ref, int64_t count) {
  ErrorStats s;
  s.count = count;
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    const double o = bf16_to_float(out[i]), r = ref[i];
    if (!std::isfinite(o)) {
      if (std::isfinite(r)) ++s.non_finite;
      continue;
    }
    const double diff = o - r;
    num += diff * diff;
    den += r * r;
    s.max_abs = std::max(s.max_abs, std::fabs(diff));
  }
  s.rel_frobenius = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return s;
}

ErrorStats compare(const bf16* out, const bf16* ref, int64_t count) {
  std::vector<double> r(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) r[i] = bf16_to_float(ref[i]);
  return compare(out, r.data(), count);
}

}  // namespace fp8proj
