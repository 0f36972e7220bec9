// Typed GEMM configurations. A tuned table or a caller names a backend's configuration by a
// string; it is parsed once -- when the table loads, or when a layer or plan is built -- into
// a GemmConfig, and only the typed value travels on the call path (no strings per call).
//
//   HeuristicConfig   no configuration named: the backend's own heuristic picks one per M
//   sm90::Config      a kernel of the sm90_fp8_block family (src/gemm/sm90_fp8_heuristic.hpp
//                     lists the family and the name grammar, e.g. "m128n128_ws2_st5")
//
// The other backends (cuBLASLt, cpu_reference) have no named configurations.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

namespace fp8proj {

namespace sm90 {

enum class KernelKind : uint8_t { kGemm1d2d, kSwapAB };

struct Config {
  KernelKind kind = KernelKind::kGemm1d2d;
  int block_m = 128;  // kGemm1d2d: rows of A (M) per tile; kSwapAB: tokens per tile (WGMMA N)
  int block_n = 128;  // columns of D (weight rows) per tile
  int math_wgs = 2;   // consumer warpgroups (128 threads each); plus one producer warpgroup
  int stages = 5;     // TMA pipeline depth
  int split_k = 1;    // kSwapAB only: K is cut into split_k contiguous ranges of 128-blocks
  int cluster = 1;    // kGemm1d2d only: CTAs per cluster (1 or 2) sharing one operand tile
  bool cluster_on_n = false;  // cluster > 1: along N sharing A ("_mcn"), else along M sharing B
  bool carry = false;  // kGemm1d2d, 2 warpgroups: next tile's first K block issued before the epilogue ("_c")

  std::string name() const;
  // Throws fp8proj::Error naming the text when it is not a config name (grammar in
  // src/gemm/sm90_fp8_heuristic.hpp).
  static Config parse(std::string_view name);
  bool operator==(const Config&) const = default;
};

}  // namespace sm90

struct HeuristicConfig {
  bool operator==(const HeuristicConfig&) const = default;
};

using GemmConfig = std::variant<HeuristicConfig, sm90::Config>;

inline bool is_heuristic(const GemmConfig& config) { return std::holds_alternative<HeuristicConfig>(config); }

// The configuration's name in its backend's grammar; "" for HeuristicConfig.
std::string config_name(const GemmConfig& config);

// `name` in the grammar of the backend named `backend`; "" is HeuristicConfig for every
// backend. Throws fp8proj::Error naming the backend and the text when it is not one of that
// backend's configurations (sm90_fp8_block: a kernel of its compiled family, any split-K;
// every other backend: "" only).
GemmConfig parse_gemm_config(std::string_view backend, std::string_view name);

// CTAs the launch of `config` runs for an M x N x K problem on num_sms SMs: the persistent grid,
// min(work tiles x split-K, SMs in whole clusters) (sm90::tile_grid); 0 for HeuristicConfig or
// an invalid problem. A clustered launch can run fewer, where a GPC cannot hold a whole cluster
// (cudaOccupancyMaxActiveClusters decides at launch); the small-M kernels have no clusters.
int64_t config_grid_ctas(const GemmConfig& config, int64_t m, int64_t n, int64_t k, int num_sms);

}  // namespace fp8proj
