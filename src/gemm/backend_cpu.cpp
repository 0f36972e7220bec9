// The cpu_reference backend: plans over the CPU oracle (src/gemm/oracle.cpp). It runs both
// kinds, so a CPU-only build exercises the whole layer, gate included.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fp8proj/error.hpp"
#include "fp8proj/gemm.hpp"
#include "fp8proj/reference.hpp"
#include "gemm/backends.hpp"

namespace fp8proj {

namespace {

class CpuBf16Plan final : public Bf16GemmPlan {
 public:
  CpuBf16Plan(const bf16* w, int64_t n, int64_t k, int64_t max_m) : w_(w), n_(n), k_(k), max_m_(max_m) {}
  void run(const bf16* x, int64_t m, bf16* y, StreamHandle) override {
    check_gemm_bf16_args(x, m, k_, y, max_m_);
    cpu::gemm_bf16(x, w_, y, m, n_, k_);
  }
  std::string describe(int64_t) const override { return "fp32 sgemm (OpenBLAS)"; }

 private:
  const bf16* w_;
  int64_t n_, k_, max_m_;
};

class CpuFp8Plan final : public Fp8GemmPlan {
 public:
  CpuFp8Plan(const Fp8WeightView& w, const GemmPlanOptions& o) : w_(w), max_m_(o.max_m) {
    // The oracle has one algorithm and no named configurations.
    for (const auto& [m_hi, config] : o.configs_by_m)
      FP8PROJ_CHECK(is_heuristic(config), "cpu_reference has no named configurations, got '", config_name(config),
                    "' for M <= ", m_hi);
    for (const auto& [m_hi, name] : o.config_by_m)
      FP8PROJ_CHECK(name.empty(), "cpu_reference has no named configurations, got '", name, "' for M <= ", m_hi);
  }
  void run(const Fp8ActivationView& x, bf16* y, StreamHandle) override {
    check_gemm_fp8_args(x, w_.k, y, max_m_);
    cpu::gemm_fp8_block(x, w_, y);
  }
  std::string describe(int64_t) const override { return "dequantize + fp32 sgemm (OpenBLAS)"; }

 private:
  Fp8WeightView w_;
  int64_t max_m_;
};

class CpuReference final : public GemmBackend {
 public:
  explicit CpuReference(GemmKind kind) : kind_(kind) {}
  std::string_view name() const override { return "cpu_reference"; }
  GemmKind kind() const override { return kind_; }
  MemorySpace space() const override { return MemorySpace::host; }
  std::string unsupported_reason(int64_t n, int64_t k) const override {
    if (n <= 0 || k <= 0) return "N and K must be positive";
    if (kind_ == GemmKind::fp8_block && k % 128 != 0) return "K must be a multiple of 128 (1x128 activation groups)";
    return "";
  }
  std::unique_ptr<Bf16GemmPlan> plan_bf16(const bf16* w, int64_t n, int64_t k,
                                          const GemmPlanOptions& o) const override {
    FP8PROJ_CHECK(kind_ == GemmKind::bf16, "cpu_reference fp8_block backend asked for a bf16 plan");
    FP8PROJ_CHECK(w != nullptr, "bf16 weight pointer is null");
    return std::make_unique<CpuBf16Plan>(w, n, k, o.max_m);
  }
  std::unique_ptr<Fp8GemmPlan> plan_fp8(const Fp8WeightView& w, const GemmPlanOptions& o) const override {
    FP8PROJ_CHECK(kind_ == GemmKind::fp8_block, "cpu_reference bf16 backend asked for an FP8 plan");
    FP8PROJ_CHECK(w.values && w.scales, "FP8 weight has a null pointer");
    const std::string why = unsupported_reason(w.n, w.k);
    FP8PROJ_CHECK(why.empty(), "cpu_reference cannot run ", w.n, "x", w.k, ": ", why);
    return std::make_unique<CpuFp8Plan>(w, o);
  }

 private:
  GemmKind kind_;
};

}  // namespace

const GemmBackend& cpu_reference_backend(GemmKind kind) {
  static const CpuReference bf16_backend(GemmKind::bf16), fp8_backend(GemmKind::fp8_block);
  return kind == GemmKind::bf16 ? static_cast<const GemmBackend&>(bf16_backend) : fp8_backend;
}

}  // namespace fp8proj
