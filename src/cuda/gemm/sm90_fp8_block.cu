// The sm90_fp8_block backend: our TMA + WGMMA kernel family (sm90_fp8_gemm.cu) behind the
// GemmBackend interface. A plan binds one FP8 weight; run_with() launches the configuration the
// selection hands it, run() the tuned one for that M's bucket, else the heuristic's choice
// (sm90::PlanConfigs, host code). The split-K workspace is sized at construction for every M
// the plan can be asked to run, so a call never allocates.
#include <algorithm>
#include <optional>
#include <utility>
#include <variant>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/device_fault.hpp"
#include "cuda/gemm/sm90_fp8_gemm.hpp"
#include "fp8proj/device.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/selection.hpp"
#include "gemm/backends.hpp"
#include "gemm/sm90_plan_configs.hpp"
#include "gemm/sm90_watchdog.hpp"

namespace fp8proj {

namespace {

// This backend's configurations in a configs_by_m list: a named one must be sm90::Config.
std::vector<std::pair<int64_t, std::optional<sm90::Config>>> own_configs(const GemmPlanOptions& o) {
  std::vector<std::pair<int64_t, std::optional<sm90::Config>>> out;
  if (!o.configs_by_m.empty()) {
    for (const auto& [m_hi, config] : o.configs_by_m) {
      const auto* c = std::get_if<sm90::Config>(&config);
      FP8PROJ_CHECK(c || is_heuristic(config), "sm90_fp8_block: a tuned configuration of another backend for M <= ",
                    m_hi);
      out.emplace_back(m_hi, c ? std::optional<sm90::Config>(*c) : std::nullopt);
    }
  } else {
    for (const auto& [m_hi, name] : o.config_by_m)  // bad names are rejected here, not mid-run
      out.emplace_back(m_hi, name.empty() ? std::nullopt : std::optional<sm90::Config>(std::get<sm90::Config>(
                                                               parse_gemm_config("sm90_fp8_block", name))));
  }
  return out;
}

class Sm90Plan final : public Fp8GemmPlan {
 public:
  Sm90Plan(const Fp8WeightView& w, const GemmPlanOptions& o)
      : w_(w), configs_(w.n, w.k, current_device().sm_count, o.max_m, own_configs(o)) {
    check_device_usable();
    // Arms the kernels' watchdog now, outside any graph capture a later run() may be part of.
    (void)sm90::watchdog_params();
    const size_t ws = configs_.workspace_bytes();
    if (ws > 0) {
      CUDA_CHECK(cudaMalloc(&workspace_, ws));
      CUDA_CHECK(cudaMemset(workspace_, 0, ws));  // split-K tile counters start at zero
      CUDA_CHECK(cudaDeviceSynchronize());
      workspace_bytes_ = ws;
    }
  }
  ~Sm90Plan() override {
    if (workspace_) cudaFree(workspace_);
  }

  void run(const Fp8ActivationView& x, bf16* y, StreamHandle stream) override {
    check_gemm_fp8_args(x, w_.k, y, configs_.max_m());
    if (x.m == 0) return;
    launch(x, y, configs_.config_for(x.m), stream);
  }

  void run_with(const Fp8ActivationView& x, bf16* y, const GemmConfig& config, StreamHandle stream) override {
    check_gemm_fp8_args(x, w_.k, y, configs_.max_m());
    if (x.m == 0) return;
    const auto* c = std::get_if<sm90::Config>(&config);
    launch(x, y, c ? *c : configs_.heuristic(x.m), stream);
  }

  GemmConfig heuristic_config(int64_t m) const override {
    return m > 0 ? GemmConfig(configs_.heuristic(m)) : GemmConfig(HeuristicConfig{});
  }
  bool can_run(const GemmConfig& config, int64_t m) const override {
    const auto* c = std::get_if<sm90::Config>(&config);
    return c && configs_.can_run(*c, m);
  }

  std::string describe(int64_t m) const override {
    if (m <= 0) return "";
    return configs_.config_for(std::min(m, configs_.max_m())).name();
  }
  size_t workspace_bytes() const override { return workspace_bytes_; }

 private:
  void launch(const Fp8ActivationView& x, bf16* y, const sm90::Config& cfg, StreamHandle stream) {
    const sm90::Fp8GemmArgs args{x.m, w_.n, w_.k, x.values, x.scales, x.scale_ld, w_.values, w_.scales, y};
    sm90::run(args, cfg, workspace_, workspace_bytes_, configs_.num_sms(), static_cast<cudaStream_t>(stream));
  }

  Fp8WeightView w_;
  sm90::PlanConfigs configs_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

class Sm90Fp8Block final : public GemmBackend {
 public:
  std::string_view name() const override { return "sm90_fp8_block"; }
  GemmKind kind() const override { return GemmKind::fp8_block; }
  MemorySpace space() const override { return MemorySpace::device; }

  std::string unsupported_reason(int64_t n, int64_t k) const override {
    if (!current_device().is_sm90()) return "needs an sm_90 GPU (this one is " + current_device().arch() + ")";
    return fp8_block_shape_reason(n, k);  // N % 16 (partial last weight block), K % 128
    return "";
  }

  std::unique_ptr<Fp8GemmPlan> plan_fp8(const Fp8WeightView& w, const GemmPlanOptions& o) const override {
    const std::string why = unsupported_reason(w.n, w.k);
    FP8PROJ_CHECK(why.empty(), "sm90_fp8_block cannot run ", w.n, "x", w.k, ": ", why);
    FP8PROJ_CHECK(w.values && w.scales, "sm90_fp8_block: FP8 weight has a null pointer");
    FP8PROJ_CHECK(o.max_m > 0, "sm90_fp8_block: max_m must be positive");
    return std::make_unique<Sm90Plan>(w, o);
  }
};

}  // namespace

const GemmBackend& sm90_fp8_block_backend() {
  static const Sm90Fp8Block backend;
  return backend;
}

}  // namespace fp8proj
