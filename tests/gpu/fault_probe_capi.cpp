// The fault probe's "sticky" scenario for the C ABI (the capi probe links libfp8proj_c.so and
// the CUDA runtime only): every C entry point that uses the GPU must return -1 at once after a
// sticky fault, with its text in fp8proj_last_error() and fp8proj_device_fault().
#include <cuda_runtime_api.h>

#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "fault_probe.hpp"
#include "fp8proj/c_api.h"

namespace fault_probe {

namespace {
// -1 becomes the exception check_surfaces() expects; 0 means the call claimed success.
void expect_failure(int rc) {
  if (rc != 0) throw std::runtime_error(fp8proj_last_error());
}
}  // namespace

int sticky_scenario() {
  constexpr int64_t n = 256, k = 256, m = 64;
  void *wv = nullptr, *ws = nullptr, *w16 = nullptr, *x = nullptr, *xv = nullptr, *xs = nullptr, *y = nullptr,
       *norm = nullptr;
  for (auto [p, bytes] : std::vector<std::pair<void**, size_t>>{{&wv, n * k},
                                                                {&ws, (n / 128) * (k / 128) * 4},
                                                                {&w16, n * k * 2},
                                                                {&x, m * k * 2},
                                                                {&xv, m * k},
                                                                {&xs, (k / 128) * m * 4},
                                                                {&y, m * n * 2},
                                                                {&norm, k * 2}}) {
    if (cudaMalloc(p, bytes) != cudaSuccess || cudaMemset(*p, 0x38, bytes) != cudaSuccess) {
      std::printf("probe FAILED: cudaMalloc\n");
      return 1;
    }
  }
  const float* wsf = static_cast<const float*>(ws);
  float* xsf = static_cast<float*>(xs);
  fp8proj_fp8_gemm* gemm = nullptr;
  fp8proj_projection* fp8 = nullptr;
  fp8proj_projection* bf16 = nullptr;
  fp8proj_projection_options o;
  fp8proj_projection_options_init(&o);
  o.enabled = 1;
  o.policy = "all";
  o.threshold = 0;
  o.apply_env = 0;
  o.rmsnorm_input = 1;
  o.max_tokens = 256;
  fp8proj_projection_options o16 = o;
  o16.enabled = 0;
  if (fp8proj_fp8_gemm_create(wv, wsf, n, k, 256, nullptr, &gemm) != 0 ||
      fp8proj_projection_create(w16, n, k, &o, &fp8) != 0 || fp8proj_projection_create(w16, n, k, &o16, &bf16) != 0 ||
      fp8proj_fp8_gemm_run(gemm, xv, xsf, m, m, y, nullptr) != 0 ||
      fp8proj_projection_forward(fp8, x, m, y, nullptr) != 0 || cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("probe FAILED: set-up on a healthy context: %s\n", fp8proj_last_error());
    return 1;
  }

  const std::string marker = inject_fault();
  if (marker.empty()) return 1;
  std::vector<Surface> surfaces = {
      {"fp8proj_fp8_gemm_run", [&] { expect_failure(fp8proj_fp8_gemm_run(gemm, xv, xsf, m, m, y, nullptr)); }},
      {"fp8proj_fp8_gemm_run m=0", [&] { expect_failure(fp8proj_fp8_gemm_run(gemm, xv, xsf, m, 0, y, nullptr)); }},
      {"fp8proj_projection_forward (FP8)", [&] { expect_failure(fp8proj_projection_forward(fp8, x, m, y, nullptr)); }},
      {"fp8proj_projection_forward (bf16)",
       [&] { expect_failure(fp8proj_projection_forward(bf16, x, m, y, nullptr)); }},
      {"fp8proj_projection_forward_rmsnorm",
       [&] { expect_failure(fp8proj_projection_forward_rmsnorm(fp8, x, k, norm, 1e-6f, m, y, nullptr)); }},
      {"fp8proj_quantize_activation",
       [&] { expect_failure(fp8proj_quantize_activation(x, k, m, k, xv, xsf, m, nullptr)); }},
      {"fp8proj_rmsnorm_quantize",
       [&] { expect_failure(fp8proj_rmsnorm_quantize(x, k, norm, 1e-6f, m, k, xv, xsf, m, nullptr)); }},
      {"fp8proj_quantize_weight",
       [&] { expect_failure(fp8proj_quantize_weight(w16, n, k, wv, static_cast<float*>(ws), nullptr)); }},
      {"fp8proj_fp8_gemm_create",
       [&] {
         fp8proj_fp8_gemm* g = nullptr;
         expect_failure(fp8proj_fp8_gemm_create(wv, wsf, n, k, 256, nullptr, &g));
       }},
      {"fp8proj_projection_create",
       [&] {
         fp8proj_projection* p = nullptr;
         expect_failure(fp8proj_projection_create(w16, n, k, &o, &p));
       }},
      {"fp8proj_workspace_create",
       [&] {
         fp8proj_workspace* w = nullptr;
         expect_failure(fp8proj_workspace_create(256, 256, 1, &w));
       }},
  };
  const int rc = check_surfaces(std::move(surfaces), marker);
  const char* fault = fp8proj_device_fault();
  if (fault == nullptr || std::string(fault).find(marker) == std::string::npos) {
    std::printf("probe FAILED: fp8proj_device_fault() does not name %s: %s\n", marker.c_str(), fault ? fault : "NULL");
    return 1;
  }
  // Host-only calls keep answering (a server can still say what it held).
  char buf[256];
  if (fp8proj_projection_explain(fp8, m, buf, sizeof buf) != 0) {
    std::printf("probe FAILED: explain after the fault: %s\n", fp8proj_last_error());
    return 1;
  }
  return rc;
}

}  // namespace fault_probe
