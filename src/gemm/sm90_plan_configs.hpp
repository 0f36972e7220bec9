// The host half of an sm90_fp8_block plan (src/cuda/gemm/sm90_fp8_block.cu), testable without
// a GPU: for one weight (N, K) on `num_sms` SMs, the heuristic's configuration per M, whether a
// configuration can run an M, the configuration the plan runs on its own (config_for), and the
// split-K workspace those need.
//
// heuristic(m) is precomputed for M <= kPrecomputedM at construction (where choosing costs most
// relative to the GEMM) and computed once per M above, kept in a table of max_m entries read
// and written atomically: a call for an M the plan has seen allocates nothing and takes no lock.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "gemm/sm90_fp8_heuristic.hpp"

namespace fp8proj::sm90 {

class PlanConfigs {
 public:
  // Swap-AB with split-K only competes while a problem has at most 2 token tiles (M <= 256),
  // and split-K runs at most kMaxSplitTokenTiles of 128 (M <= 1024): precomputing up to here
  // covers every M that can need a workspace.
  static constexpr int64_t kPrecomputedM = 1024;
  // M above this are chosen afresh per call (a GEMM of that size dwarfs the host cost).
  static constexpr int64_t kMaxCachedM = 65536;

  // tuned: GemmPlanOptions::configs_by_m reduced to this backend's configurations (std::nullopt
  // bounds = the heuristic), sorted by bound.
  PlanConfigs(int64_t n, int64_t k, int num_sms, int64_t max_m, std::vector<std::pair<int64_t, std::optional<Config>>> tuned);

  Config heuristic(int64_t m) const;
  bool can_run(const Config& c, int64_t m) const { return sm90::can_run(c, {m, n_, k_, num_sms_}); }
  // The tuned configuration covering m where it can run m, else heuristic(m).
  Config config_for(int64_t m) const;
  // What config_for needs at every M <= max_m.
  size_t workspace_bytes() const { return workspace_bytes_; }
  int num_sms() const { return num_sms_; }
  int64_t max_m() const { return max_m_; }

 private:
  static uint16_t encode(const Config& c);
  static Config decode(uint16_t code);

  int64_t n_, k_;
  int num_sms_;
  int64_t max_m_;
  std::vector<std::pair<int64_t, std::optional<Config>>> tuned_;
  std::unique_ptr<std::atomic<uint16_t>[]> chosen_;  // heuristic(m) at [m - 1], 0 = not yet
  int64_t cached_ = 0;
  size_t workspace_bytes_ = 0;
};

}  // namespace fp8proj::sm90
