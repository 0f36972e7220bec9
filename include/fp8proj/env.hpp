// Every environment knob the library reads, in one place (README.md has the table).
// Each getter parses strictly: a malformed value throws fp8proj::Error naming the variable.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "fp8proj/formats.hpp"

namespace fp8proj::env {

// FP8PROJ_PREFILL_FP8: 0/off -> disabled; 1/on/prefill -> policy "prefill"; all -> "all".
// nullopt when unset (the caller's options stand).
struct Fp8Switch {
  bool enabled = false;
  bool policy_all = false;
};
std::optional<Fp8Switch> prefill_fp8();

std::optional<int64_t> min_fp8_tokens();      // FP8PROJ_MIN_FP8_TOKENS (FP8 when M > value)
std::optional<int64_t> decode_ceiling();      // FP8PROJ_DECODE_CEILING (prefill policy)
std::optional<std::string> fp8_backend();     // FP8PROJ_FP8_BACKEND (auto | backend name)
std::optional<ScaleMode> weight_scales();     // FP8PROJ_WEIGHT_SCALES (ue8m0 | float)
std::optional<std::string> tune_file();       // FP8PROJ_TUNE_FILE
std::optional<std::string> log_level();       // FP8PROJ_LOG_LEVEL
// FP8PROJ_WATCHDOG_MS: how long the pipeline of an sm90 GEMM kernel may stand still before the
// kernel is ended with an error naming it (0 = off: the kernels built without the watchdog run).
// At most a week. Off by default: the kernels built with it ran 2.6% slower on the geometric mean
// (up to 18% at M = 128; H200, bench/results/robustness/watchdog-cost/).
inline constexpr int64_t kDefaultWatchdogMs = 0;
inline constexpr int64_t kMaxWatchdogMs = int64_t{7} * 24 * 3600 * 1000;
std::optional<int64_t> watchdog_ms();
// FP8PROJ_PDL: 0 or 1. 1 launches the kernels of the projection and MLA decode paths with
// programmatic dependent launch (each kernel's prologue overlaps the end of the one before it;
// core/pdl.hpp). On by default: on an H200 every measured decode step took 2-12% less time with it
// and every small-M quantize + GEMM less (bench/results/decode/pdl-trigger/), outputs bitwise the same.
inline constexpr bool kDefaultPdl = true;
std::optional<bool> pdl();

// Raw access for the knobs above (exposed for tests).
std::optional<std::string> get(const char* name);
// Integers and numbers follow fp8proj/numbers.hpp (strict, full int64 range, then bounds).
std::optional<int64_t> get_int(const char* name, int64_t min_value, int64_t max_value = INT64_MAX);
std::optional<double> get_number(const char* name, double min_value, double max_value);

}  // namespace fp8proj::env
