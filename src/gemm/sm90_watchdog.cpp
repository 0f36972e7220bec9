// Host side of the sm90 GEMM watchdog that needs no GPU: the knob and the report's text.
#include "gemm/sm90_watchdog.hpp"

#include <cstdio>

#include "fp8proj/env.hpp"
#include "fp8proj/gemm_config.hpp"

namespace fp8proj::sm90 {

uint64_t watchdog_timeout_ns_from_env() {
  const int64_t ms = env::watchdog_ms().value_or(env::kDefaultWatchdogMs);
  return static_cast<uint64_t>(ms) * 1000000u;
}

std::string format_watchdog_record(const WatchdogRecord& r, uint64_t timeout_ns) {
  const WatchdogConfig w = unpack_watchdog_config(r.config);
  std::string kernel;
  if (w.kernel == kWatchdogGemm1d2d || w.kernel == kWatchdogSwapAB) {
    Config c;
    c.kind = w.kernel == kWatchdogSwapAB ? KernelKind::kSwapAB : KernelKind::kGemm1d2d;
    c.block_m = static_cast<int>(w.block_m);
    c.block_n = static_cast<int>(w.block_n);
    c.math_wgs = static_cast<int>(w.math_wgs);
    c.stages = static_cast<int>(w.stages);
    c.cluster = static_cast<int>(w.cluster);
    c.cluster_on_n = w.cluster_on_n;
    c.carry = w.carry;
    c.split_k = static_cast<int>(r.split_k);
    kernel = "sm90_fp8_gemm " + c.name();
    if (w.fixed_kb != 0) kernel += " compiled for K=" + std::to_string(128u * w.fixed_kb);
  } else {
    kernel = "unknown kernel #" + std::to_string(w.kernel);
  }
  char waited[32];
  const double s = static_cast<double>(r.waited_ns) * 1e-9;
  if (s >= 1.0)
    std::snprintf(waited, sizeof waited, "%.1f s", s);
  else
    std::snprintf(waited, sizeof waited, "%.0f ms", s * 1e3);
  // A pipeline in step completes full[0], full[1], ... in turn: the parities read 1..1 0..0 (or
  // 0..0 1..1) and the next barrier to complete is the first whose parity differs from the one
  // before it (full[0] when all agree). It waits for the phase of that parity.
  auto next = [&](uint32_t bits) {
    uint32_t at = 0;
    for (uint32_t i = 1; i < w.stages && at == 0; ++i)
      if ((bits >> i & 1u) != (bits >> (i - 1) & 1u)) at = i;
    return "[" + std::to_string(at) + "] parity " + std::to_string(bits >> at & 1u);
  };
  auto bits_text = [&](uint32_t bits) {
    std::string t;
    for (uint32_t i = 0; i < w.stages; ++i) t += (bits >> i & 1u) ? '1' : '0';
    return t;
  };
  return "watchdog: " + kernel + " (M=" + std::to_string(r.m) + " N=" + std::to_string(r.n) + " K=" +
         std::to_string(r.k) + ") block " + std::to_string(r.block) + ": no pipeline barrier completed a phase for " +
         waited + "; next: full" + next(r.full_parity) + ", empty" + next(r.empty_parity) + " (phase parities full " +
         bits_text(r.full_parity) + ", empty " + bits_text(r.empty_parity) + "; FP8PROJ_WATCHDOG_MS=" +
         std::to_string(timeout_ns / 1000000u) + ")";
}

}  // namespace fp8proj::sm90
