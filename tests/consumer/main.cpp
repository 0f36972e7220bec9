// The installed library from outside: a ProjectionLayer on the host (the cpu_reference
// backend) with FP8 on, both paths checked bit for bit against the oracle (quantize + block-
// scaled GEMM, and the bf16 GEMM), and the FP8 result near the bf16 one. Exit 0 = pass.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "fp8proj/projection.hpp"
#include "fp8proj/quantize.hpp"
#include "fp8proj/random.hpp"
#include "fp8proj/reference.hpp"

int main() {
  using namespace fp8proj;
  const int64_t m = 600, n = 256, k = 384;  // M > 512: the FP8 path; M = 64: bf16
  std::vector<bf16> w(n * k), x(m * k), y(m * n), ref(m * n);
  fill_normal(MemorySpace::host, w.data(), n * k, 1, 0.02f);
  fill_normal(MemorySpace::host, x.data(), m * k, 2);
  ProjectionOptions o;
  o.name = "consumer";
  o.fp8 = true;
  o.apply_env = false;
  ProjectionLayer layer(MemorySpace::host, w.data(), n, k, o);
  std::printf("%s\n%s\n", layer.explain(m).to_string().c_str(), layer.explain(64).to_string().c_str());
  if (layer.path_for(m) != Path::fp8 || layer.path_for(64) != Path::bf16) return 1;

  layer.forward(x.data(), m, y.data());
  HostFp8Activation qx = make_host_fp8_activation(m, k);
  HostFp8Weight qw = make_host_fp8_weight(n, k);
  cpu::quantize_activation(x.data(), m, k, qx.out());
  cpu::quantize_weight(w.data(), n, k, qw.out());
  cpu::gemm_fp8_block(qx.view(), qw.view(), ref.data());
  if (std::memcmp(y.data(), ref.data(), y.size() * sizeof(bf16)) != 0) {
    std::printf("FAIL: the FP8 path differs from the oracle\n");
    return 1;
  }
  std::vector<bf16> exact(m * n);
  cpu::gemm_bf16(x.data(), w.data(), exact.data(), m, n, k);
  double num = 0, den = 0;
  for (int64_t i = 0; i < m * n; ++i) {
    const double d = double(bf16_to_float(y[i])) - bf16_to_float(exact[i]);
    num += d * d;
    den += double(bf16_to_float(exact[i])) * bf16_to_float(exact[i]);
  }
  const double rel = std::sqrt(num / den);
  std::printf("FP8 path vs bf16 GEMM: relative error %.4f\n", rel);
  if (!(rel > 0.005 && rel < 0.08)) return 1;  // block-scaled e4m3 on Gaussian data: ~3.7%

  layer.forward(x.data(), 64, y.data());
  if (std::memcmp(y.data(), exact.data(), 64 * n * sizeof(bf16)) != 0) {
    std::printf("FAIL: the bf16 path differs from the oracle\n");
    return 1;
  }
  std::printf("PASS\n");
  return 0;
}
