// `fp8proj tune --check FILE` (cmd_gatecheck.cpp): validates a tuned table by timing the
// gated layer against pure bf16 and pure FP8. cmd_tune.cpp registers the flags and calls it.
#pragma once

#include <cstdint>
#include <string>

namespace fp8proj::cli {

struct CheckArgs {
  std::string table;          // the tuned table to validate
  std::string m;              // M list; default: spread over 1..32768, off the tuning points
  int reps = 0, warmup = -1;  // per variant (gate check: interleaved call by call)
  int64_t decode_ceiling = 512;
  double tolerance_pct = 3;  // gated time <= (1 + tol) * min(bf16, FP8)
  bool cpu = false, no_flush = false, no_fail = false, force = false;
  std::string csv, json, md;
};
// Measures and reports; throws fp8proj::Error when a check fails (unless no_fail).
void run_gatecheck(const CheckArgs& args);

}  // namespace fp8proj::cli
