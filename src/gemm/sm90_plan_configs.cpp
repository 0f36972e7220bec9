#include "gemm/sm90_plan_configs.hpp"

#include <algorithm>

#include "fp8proj/error.hpp"

namespace fp8proj::sm90 {

PlanConfigs::PlanConfigs(int64_t n, int64_t k, int num_sms, int64_t max_m,
                         std::vector<std::pair<int64_t, std::optional<Config>>> tuned)
    : n_(n), k_(k), num_sms_(num_sms), max_m_(max_m), tuned_(std::move(tuned)) {
  check_problem({0, n, k, num_sms});
  FP8PROJ_CHECK(max_m > 0, "sm90_fp8_block: max_m must be positive");
  cached_ = std::min(max_m_, kMaxCachedM);
  chosen_ = std::make_unique<std::atomic<uint16_t>[]>(static_cast<size_t>(cached_));
  for (int64_t m = 0; m < cached_; ++m) chosen_[m].store(0, std::memory_order_relaxed);
  const int64_t pre = std::min(max_m_, kPrecomputedM);
  for (int64_t m = 1; m <= pre; ++m) {
    (void)heuristic(m);
    workspace_bytes_ = std::max(workspace_bytes_, sm90::workspace_bytes(config_for(m), m, n_, k_));
  }
}

uint16_t PlanConfigs::encode(const Config& c) {
  Config base = c;
  base.split_k = 1;
  const auto& family = kernel_family();
  const auto idx = static_cast<uint16_t>(std::find(family.begin(), family.end(), base) - family.begin());
  return static_cast<uint16_t>(1 + idx + 64 * c.split_k);
}

Config PlanConfigs::decode(uint16_t code) {
  Config c = kernel_family()[(code - 1) % 64];
  c.split_k = (code - 1) / 64;
  return c;
}

Config PlanConfigs::heuristic(int64_t m) const {
  if (m < 1 || m > cached_) return choose({m, n_, k_, num_sms_});
  std::atomic<uint16_t>& slot = chosen_[m - 1];
  uint16_t code = slot.load(std::memory_order_acquire);
  if (code == 0) {  // first call at this M: choose once (two threads may both do it; same answer)
    code = encode(choose({m, n_, k_, num_sms_}));
    slot.store(code, std::memory_order_release);
  }
  return decode(code);
}

Config PlanConfigs::config_for(int64_t m) const {
  for (const auto& [m_hi, config] : tuned_)
    if (m <= m_hi) {
      if (config && can_run(*config, m)) return *config;
      break;
    }
  return heuristic(m);
}

}  // namespace fp8proj::sm90
