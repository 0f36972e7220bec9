#include "core/pdl.hpp"

#include <atomic>
#include <optional>

#include "core/device_testing.hpp"
#include "fp8proj/env.hpp"

namespace fp8proj {

namespace {
// -1: no override; 0 / 1: set_pdl_for_testing.
std::atomic<int> pdl_override{-1};
}  // namespace

bool pdl_enabled() {
  const int o = pdl_override.load(std::memory_order_relaxed);
  if (o >= 0) return o == 1;
  // Once: a knob that changed in the middle of a run would split a captured graph's kernels
  // between the two launch modes. A throw leaves it unset, so the next call reports it again.
  static const bool from_env = env::pdl().value_or(env::kDefaultPdl);
  return from_env;
}

void set_pdl_for_testing(std::optional<bool> on) {
  pdl_override.store(on ? (*on ? 1 : 0) : -1, std::memory_order_relaxed);
}

}  // namespace fp8proj
