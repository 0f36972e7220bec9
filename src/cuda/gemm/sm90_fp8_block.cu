// The sm90_fp8_block backend: our TMA + WGMMA kernel family (sm90_fp8_gemm.cu) behind the
// GemmBackend interface. A plan binds one FP8 weight; per M it runs the configuration the
// tuned table names for that M's bucket, else the heuristic's choice (precomputed for the
// decode-sized M where choosing costs most relative to the GEMM). The split-K workspace is
// sized at construction for every M the plan can be asked to run, so run() never allocates.
#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "core/cuda_check.hpp"
#include "cuda/gemm/sm90_fp8_gemm.hpp"
#include "fp8proj/device.hpp"
#include "fp8proj/error.hpp"
#include "gemm/backends.hpp"

namespace fp8proj {

namespace {

// Swap-AB with split-K only competes while a problem has at most 2 token tiles (M <= 256);
// precomputing the choice up to here covers every M that can need a workspace.
constexpr int64_t kPrecomputedM = 1024;

class Sm90Plan final : public Fp8GemmPlan {
 public:
  Sm90Plan(const Fp8WeightView& w, const GemmPlanOptions& o) : w_(w), max_m_(o.max_m), tuned_(o.config_by_m) {
    num_sms_ = current_device().sm_count;
    for (const auto& [m_hi, name] : tuned_)
      if (!name.empty()) (void)sm90::Config::parse(name);  // reject bad names now, not mid-run
    const int64_t pre = std::min(max_m_, kPrecomputedM);
    chosen_.reserve(static_cast<size_t>(pre));
    size_t ws = 0;
    for (int64_t m = 1; m <= pre; ++m) {
      chosen_.push_back(choose(m));
      ws = std::max(ws, sm90::workspace_bytes(chosen_.back(), m, w_.n, w_.k));
    }
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
    check_gemm_fp8_args(x, w_.k, y, max_m_);
    if (x.m == 0) return;
    const sm90::Config cfg = config_for(x.m);
    const sm90::Fp8GemmArgs args{x.m, w_.n, w_.k, x.values, x.scales, x.scale_ld, w_.values, w_.scales, y};
    sm90::run(args, cfg, workspace_, workspace_bytes_, num_sms_, static_cast<cudaStream_t>(stream));
  }

  std::string describe(int64_t m) const override {
    if (m <= 0) return "";
    return const_cast<Sm90Plan*>(this)->config_for(std::min(m, max_m_)).name();
  }
  size_t workspace_bytes() const override { return workspace_bytes_; }

 private:
  // The first tuned entry whose bound covers m names the configuration ("" = heuristic); a
  // named configuration that cannot run this M (e.g. its split-K needs more K blocks) also
  // falls back to the heuristic rather than failing a forward call.
  sm90::Config choose(int64_t m) const {
    const sm90::Problem p{m, w_.n, w_.k, num_sms_};
    for (const auto& [m_hi, name] : tuned_)
      if (m <= m_hi) {
        if (name.empty()) break;
        sm90::Config c = sm90::Config::parse(name);
        if (sm90::why_illegal(c, p).empty()) return c;
        break;
      }
    return sm90::choose(p);
  }

  sm90::Config config_for(int64_t m) {
    if (m <= static_cast<int64_t>(chosen_.size())) return chosen_[m - 1];
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = cache_.find(m);
    if (it == cache_.end()) it = cache_.emplace(m, choose(m)).first;
    return it->second;
  }

  Fp8WeightView w_;
  int64_t max_m_;
  std::vector<std::pair<int64_t, std::string>> tuned_;
  int num_sms_ = 0;
  std::vector<sm90::Config> chosen_;  // chosen_[m - 1] for m <= kPrecomputedM
  std::mutex mutex_;
  std::unordered_map<int64_t, sm90::Config> cache_;
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
    if (n <= 0 || k <= 0 || n % 128 || k % 128) return "N and K must be positive multiples of 128";
    return "";
  }

  std::vector<std::string> candidate_configs(int64_t m, int64_t n, int64_t k) const override {
    std::vector<std::string> names;
    for (const sm90::Config& c : sm90::candidates({m, n, k, current_device().sm_count})) names.push_back(c.name());
    return names;
  }

  int64_t wave_step(const std::string& config, int64_t lo, int64_t hi, int64_t n, int64_t k) const override {
    const int sms = current_device().sm_count;
    // Waves of CTAs at M (-1 when the configuration cannot run it).
    auto waves = [&](int64_t m) -> int64_t {
      const sm90::Problem p{m, n, k, sms};
      const sm90::Config c = config.empty() ? sm90::choose(p) : sm90::Config::parse(config);
      if (!sm90::why_illegal(c, p).empty()) return -1;
      const sm90::TileGrid g = sm90::tile_grid(c, p);
      return (g.units + g.grid - 1) / g.grid;
    };
    try {
      // Every tile height is a multiple of 16 rows: the wave count can only change from
      // M = 16 j to 16 j + 1.
      for (int64_t m = std::max<int64_t>(1, (lo + 15) / 16) * 16; m < hi; m += 16)
        if (waves(m + 1) > waves(m)) return m;
    } catch (const Error&) {
      return 0;  // not one of our configuration names, or not a problem we run
    }
    return 0;
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
