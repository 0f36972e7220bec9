// Backend `cublaslt_bf16`: y[M, N] = x[M, K] . W[N, K]^T in bf16 with fp32 accumulation through
// cuBLASLt — the baseline every FP8 number is compared with, and the decode path.
//
// Layouts (shape : stride, elements): x [M, K] : [K, 1], W [N, K] : [K, 1], y [M, N] : [N, 1],
// all bf16 in device memory, 16-byte aligned. Any N, K (fused_qkv_a's N = 2624 runs here).
// Mapped to cuBLASLt as D^T = W . x^T (TN, see cublaslt.hpp); no transposes or copies.
//
// The plan owns a 32 MiB workspace (allocated at construction) and caches one algorithm per
// (M, operand alignment); run() neither allocates nor synchronises.
#include <memory>
#include <string>

#include "cuda/common/alignment.hpp"
#include "core/cuda_check.hpp"
#include "core/device_fault.hpp"
#include "cuda/gemm/cublaslt.hpp"
#include "fp8proj/device.hpp"
#include "fp8proj/memory.hpp"

namespace fp8proj {

namespace {

constexpr const char* kName = "cublaslt_bf16";


class CublasLtBf16Plan final : public Bf16GemmPlan {
 public:
  CublasLtBf16Plan(const bf16* w, int64_t n, int64_t k, int64_t max_m)
      : n_(n), k_(k), max_m_(max_m), matmul_(kName, CUDA_R_16BF, n, k, w),
        workspace_(MemorySpace::device, lt::kWorkspaceBytes) {}

  void run(const bf16* x, int64_t m, bf16* y, StreamHandle stream) override {
    check_device_usable();
    check_gemm_bf16_args(x, m, k_, y, max_m_);
    if (m == 0) return;
    FP8PROJ_CHECK(is_aligned16(x) && is_aligned16(y), kName, ": x and y must be 16-byte aligned");
    matmul_.run(matmul_.algo(m, x, y), x, y, workspace_.data(), static_cast<cudaStream_t>(stream));
  }

  std::string describe(int64_t m) const override { return m > 0 ? matmul_.describe(m) : "no-op (M = 0)"; }

 private:
  int64_t n_, k_, max_m_;
  lt::TnMatmul matmul_;
  Buffer workspace_;
};

class CublasLtBf16 final : public GemmBackend {
 public:
  std::string_view name() const override { return kName; }
  GemmKind kind() const override { return GemmKind::bf16; }
  MemorySpace space() const override { return MemorySpace::device; }
  std::string unsupported_reason(int64_t n, int64_t k) const override {
    if (n <= 0 || k <= 0) return "N and K must be positive";
    return cublaslt_bf16_unusable_reason();
  }
  std::unique_ptr<Bf16GemmPlan> plan_bf16(const bf16* w, int64_t n, int64_t k,
                                          const GemmPlanOptions& options) const override {
    const std::string why = unsupported_reason(n, k);
    FP8PROJ_CHECK(why.empty(), kName, " cannot run ", n, "x", k, ": ", why);
    FP8PROJ_CHECK(w != nullptr, kName, ": bf16 weight pointer is null");
    FP8PROJ_CHECK(is_aligned16(w), kName, ": bf16 weight must be 16-byte aligned");
    FP8PROJ_CHECK(options.max_m >= 0, kName, ": max_m must be >= 0");
    return std::make_unique<CublasLtBf16Plan>(w, n, k, options.max_m);
  }
};

}  // namespace

std::string cublaslt_bf16_unusable_reason() {
  const DeviceInfo& d = current_device();
  return d.present ? "" : d.why_absent;
}

const GemmBackend& cublaslt_bf16_backend() {
  static const CublasLtBf16 backend;
  return backend;
}

}  // namespace fp8proj
