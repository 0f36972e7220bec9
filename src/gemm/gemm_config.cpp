// Typed configurations (include/fp8proj/gemm_config.hpp): names in and out, per backend.
#include "fp8proj/gemm_config.hpp"

#include <type_traits>

#include "fp8proj/error.hpp"
#include "gemm/sm90_fp8_heuristic.hpp"

namespace fp8proj {

std::string config_name(const GemmConfig& config) {
  return std::visit(
      [](const auto& c) -> std::string {
        if constexpr (std::is_same_v<std::decay_t<decltype(c)>, sm90::Config>)
          return c.name();
        else
          return "";
      },
      config);
}

GemmConfig parse_gemm_config(std::string_view backend, std::string_view name) {
  if (name.empty()) return HeuristicConfig{};
  if (backend == "sm90_fp8_block") {
    const sm90::Config c = sm90::Config::parse(name);
    FP8PROJ_CHECK(sm90::is_instantiated(c), "sm90_fp8_block configuration '", name,
                  "' names no kernel of the compiled family (src/gemm/sm90_fp8_heuristic.cpp)");
    return c;
  }
  FP8PROJ_FAIL("FP8 backend '", backend, "' has no named configurations, got '", name,
               "' (only sm90_fp8_block has; \"\" is the backend's own choice)");
}

int64_t config_grid_ctas(const GemmConfig& config, int64_t m, int64_t n, int64_t k, int num_sms) {
  const auto* c = std::get_if<sm90::Config>(&config);
  const sm90::Problem p{m, n, k, num_sms};
  if (!c || m <= 0 || !sm90::problem_ok(p)) return 0;
  return sm90::tile_grid(*c, p).grid;
}

}  // namespace fp8proj
