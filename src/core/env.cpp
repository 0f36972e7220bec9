#include "fp8proj/env.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "fp8proj/error.hpp"
#include "fp8proj/numbers.hpp"
#include "fp8proj/quantize.hpp"

namespace fp8proj::env {

std::optional<std::string> get(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::optional<int64_t> get_int(const char* name, int64_t min_value, int64_t max_value) {
  auto v = get(name);
  if (!v) return std::nullopt;
  return parse_int(*v, name, min_value, max_value);  // fp8proj/numbers.hpp: the one rule
}

std::optional<double> get_number(const char* name, double min_value, double max_value) {
  auto v = get(name);
  if (!v) return std::nullopt;
  return parse_number(*v, name, min_value, max_value);
}

std::optional<Fp8Switch> prefill_fp8() {
  auto v = get("FP8PROJ_PREFILL_FP8");
  if (!v) return std::nullopt;
  std::string s = *v;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "0" || s == "off" || s == "false" || s == "no") return Fp8Switch{false, false};
  if (s == "1" || s == "on" || s == "true" || s == "yes" || s == "prefill") return Fp8Switch{true, false};
  if (s == "all") return Fp8Switch{true, true};
  FP8PROJ_FAIL("FP8PROJ_PREFILL_FP8='", *v, "' is not one of 0, 1, prefill, all");
}

std::optional<int64_t> min_fp8_tokens() { return get_int("FP8PROJ_MIN_FP8_TOKENS", 0); }
std::optional<int64_t> decode_ceiling() { return get_int("FP8PROJ_DECODE_CEILING", 0); }
std::optional<std::string> fp8_backend() { return get("FP8PROJ_FP8_BACKEND"); }

std::optional<ScaleMode> weight_scales() {
  auto v = get("FP8PROJ_WEIGHT_SCALES");
  if (!v) return std::nullopt;
  auto mode = parse_scale_mode(*v);
  FP8PROJ_CHECK(mode.has_value(), "FP8PROJ_WEIGHT_SCALES='", *v, "' is not one of ue8m0, float");
  return mode;
}
std::optional<std::string> tune_file() { return get("FP8PROJ_TUNE_FILE"); }
std::optional<int64_t> watchdog_ms() { return get_int("FP8PROJ_WATCHDOG_MS", 0, kMaxWatchdogMs); }

std::optional<bool> pdl() {
  auto v = get("FP8PROJ_PDL");
  if (!v) return std::nullopt;
  FP8PROJ_CHECK(*v == "0" || *v == "1", "FP8PROJ_PDL='", *v, "' is not one of 0, 1");
  return *v == "1";
}

std::optional<std::string> log_level() {
  auto v = get("FP8PROJ_LOG_LEVEL");
  if (!v) return std::nullopt;
  FP8PROJ_CHECK(*v == "error" || *v == "warn" || *v == "info" || *v == "debug", "FP8PROJ_LOG_LEVEL='", *v,
                "' is not one of error, warn, info, debug");
  return v;
}

}  // namespace fp8proj::env
