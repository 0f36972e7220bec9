// The C ABI (include/fp8proj/c_api.h) over the GEMM backends: a handle owns one Fp8GemmPlan,
// built as the projection layer builds its FP8 plan (tuned configurations per M bucket);
// every entry point turns an exception into -1 and a per-thread message.
#include "fp8proj/c_api.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fp8proj/device.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/gemm.hpp"
#include "fp8proj/memory.hpp"
#include "fp8proj/tune.hpp"

#if FP8PROJ_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

struct fp8proj_fp8_gemm {
  const fp8proj::GemmBackend* backend = nullptr;
  std::unique_ptr<fp8proj::Fp8GemmPlan> plan;
  int64_t k = 0, max_m = 0;
};

namespace fp8proj {
namespace {

thread_local std::string last_error;

template <typename F>
int guarded(F&& f) noexcept {
  try {
    f();
    last_error.clear();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown C++ exception";
  }
  return -1;
}

// Pointers reach kernels as TMA base addresses and vector loads: they must be device memory
// (or managed) and 16-byte aligned. A host pointer would otherwise fault on the GPU, and the
// fault would poison the caller's context.
void check_device_pointer(const void* p, const char* what) {
  FP8PROJ_CHECK(p != nullptr, what, " is null");
  FP8PROJ_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, what, " is not 16-byte aligned");
#if FP8PROJ_WITH_CUDA
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, p);
  if (err != cudaSuccess) (void)cudaGetLastError();  // not sticky; clear it
  FP8PROJ_CHECK(err == cudaSuccess && (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged),
                what, " is not device memory (the FP8 GEMM reads and writes device buffers only)");
#endif
}

// The projection layer's rule: the tuned buckets that name this backend run their
// configuration, every other M the backend's heuristic (one plan runs every M here).
GemmPlanOptions plan_options(const GemmBackend& backend, int64_t n, int64_t k, int64_t max_m) {
  GemmPlanOptions po;
  po.max_m = max_m;
  const TuneTable* table = active_tune_table();
  if (const TunedShape* row = table ? table->find(n, k) : nullptr) {
    std::vector<std::optional<std::string>> runs;
    for (const TunedBucket& b : row->buckets) runs.emplace_back(b.fp8_backend == backend.name() ? b.fp8_config : "");
    po.config_by_m = tuned_config_by_m(*row, runs);
  }
  return po;
}

void create(const void* w_values, const float* w_scales, int64_t n, int64_t k, int64_t max_m, const char* name,
            fp8proj_fp8_gemm** out) {
  FP8PROJ_CHECK(out != nullptr, "out (the handle's address) is null");
  *out = nullptr;
  FP8PROJ_CHECK(n > 0 && k > 0 && n % 128 == 0 && k % 128 == 0, "weight shape ", n, "x", k,
                ": N and K must be positive multiples of 128");
  FP8PROJ_CHECK(max_m > 0, "max_m must be > 0, got ", max_m);
  FP8PROJ_CHECK(gpu_available(), "no usable CUDA GPU in this process: the C API runs device backends only");
  check_device_pointer(w_values, "w_values");
  check_device_pointer(w_scales, "w_scales");

  const GemmBackend* be =
      &resolve_backend(name && *name ? name : "auto", GemmKind::fp8_block, MemorySpace::device, n, k);
  auto g = std::make_unique<fp8proj_fp8_gemm>();
  g->backend = be;
  g->k = k;
  g->max_m = max_m;
  g->plan = be->plan_fp8(Fp8WeightView{static_cast<const uint8_t*>(w_values), w_scales, n, k},
                         plan_options(*be, n, k, max_m));
  *out = g.release();
}

void run(fp8proj_fp8_gemm* g, const void* x_values, const float* x_scales, int64_t x_scale_ld, int64_t m, void* y,
         void* stream) {
  FP8PROJ_CHECK(g != nullptr, "gemm handle is null");
  FP8PROJ_CHECK(m >= 0 && m <= g->max_m, "m=", m, " is outside [0, max_m=", g->max_m, "]");
  const Fp8ActivationView x{static_cast<const uint8_t*>(x_values), x_scales, m, g->k, x_scale_ld};
  check_gemm_fp8_args(x, g->k, static_cast<const bf16*>(y), g->max_m);
  if (m == 0) return;
  check_device_pointer(x_values, "x_values");
  check_device_pointer(x_scales, "x_scales");
  check_device_pointer(y, "y");
  g->plan->run(x, static_cast<bf16*>(y), stream);
}

}  // namespace
}  // namespace fp8proj

extern "C" {

int fp8proj_fp8_gemm_create(const void* w_values, const float* w_scales, int64_t n, int64_t k, int64_t max_m,
                            const char* backend, fp8proj_fp8_gemm** out) {
  return fp8proj::guarded([&] { fp8proj::create(w_values, w_scales, n, k, max_m, backend, out); });
}

int fp8proj_fp8_gemm_run(fp8proj_fp8_gemm* gemm, const void* x_values, const float* x_scales, int64_t x_scale_ld,
                         int64_t m, void* y, void* stream) {
  return fp8proj::guarded([&] { fp8proj::run(gemm, x_values, x_scales, x_scale_ld, m, y, stream); });
}

int fp8proj_fp8_gemm_describe(const fp8proj_fp8_gemm* gemm, int64_t m, char* buf, size_t size) {
  return fp8proj::guarded([&] {
    FP8PROJ_CHECK(gemm != nullptr, "gemm handle is null");
    FP8PROJ_CHECK(buf != nullptr && size > 0, "buf is null or size is 0");
    FP8PROJ_CHECK(m > 0 && m <= gemm->max_m, "m=", m, " is outside [1, max_m=", gemm->max_m, "]");
    const std::string s = std::string(gemm->backend->name()) + ":" + gemm->plan->describe(m);
    const size_t len = std::min(s.size(), size - 1);
    std::memcpy(buf, s.data(), len);
    buf[len] = '\0';
  });
}

void fp8proj_fp8_gemm_destroy(fp8proj_fp8_gemm* gemm) { delete gemm; }

const char* fp8proj_version_string(void) {
  static const std::string v = fp8proj::fp8proj_version();
  return v.c_str();
}

const char* fp8proj_last_error(void) { return fp8proj::last_error.c_str(); }

}  // extern "C"
