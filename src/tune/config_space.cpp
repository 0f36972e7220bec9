// The tuner's registry of backends with named configurations (include/fp8proj/tuner.hpp):
// sm90_fp8_block, whose family and heuristic are host code (src/gemm/sm90_fp8_heuristic.hpp).
#include <algorithm>

#include "fp8proj/device.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/tuner.hpp"
#include "gemm/sm90_fp8_heuristic.hpp"

namespace fp8proj::tune {

namespace {

class Sm90ConfigSpace final : public ConfigSpace {
 public:
  std::vector<std::string> candidates(int64_t m, int64_t n, int64_t k) const override {
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
      if (!sm90::can_run(c, p)) return -1;
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
};

}  // namespace

const ConfigSpace* config_space(std::string_view backend) {
  static const Sm90ConfigSpace sm90;
  if (backend == "sm90_fp8_block") return &sm90;
  return nullptr;
}

}  // namespace fp8proj::tune
