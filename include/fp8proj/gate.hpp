// The M-gate: which path one call of a projection takes. A flat chain of predicates, each
// with the reason it gives, in the order they are checked (ggml-cuda's should_use_mmq shape).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fp8proj {

enum class Path : uint8_t { none, bf16, fp8 };
enum class Fp8Policy : uint8_t {
  prefill,  // decode batches (M <= decode ceiling) stay bf16; above the ceiling as `all`
  all,      // FP8 wherever it is measured (tuned bucket) or, outside the buckets, thresholded faster
};

const char* to_string(Path path);
const char* to_string(Fp8Policy policy);

inline constexpr int64_t kDefaultThreshold = 512;       // the reference design's M > 512
inline constexpr int64_t kDefaultDecodeCeiling = 512;   // largest CUDA-graph decode batch

// Everything the decision depends on. The string views only feed describe(); the decision
// itself builds no strings, so forward() can call it on every launch.
struct GateInput {
  int64_t m = 0;
  bool enabled = false;  // opt-in flag
  Fp8Policy policy = Fp8Policy::prefill;
  bool arch_ok = true;   // the device can run an FP8 backend
  bool eligible = true;  // N and K multiples of 128
  int64_t threshold = kDefaultThreshold;
  int64_t decode_ceiling = kDefaultDecodeCeiling;
  // The tuned bucket's verdict for this M: set when a tuned table covers M and no explicit
  // threshold (option or FP8PROJ_MIN_FP8_TOKENS) overrides the table.
  std::optional<bool> bucket_fp8_wins;

  std::string_view arch_reason;         // why not, when !arch_ok
  std::string_view eligibility_reason;  // why not, when !eligible
  std::string_view threshold_source = "default";  // "default", "FP8PROJ_MIN_FP8_TOKENS", "tuned table ..."
};

enum class GateReason : uint8_t {
  empty,              // M = 0
  disabled,           // not opted in
  arch,               // no FP8 backend for this device
  ineligible,         // N or K not a multiple of 128
  decode_ceiling,     // prefill policy, M <= ceiling
  below_threshold,    // M <= threshold
  above_threshold,    // M > threshold (and > ceiling for prefill)
  bucket_fp8,         // tuned bucket: FP8 measured faster (prefill: above the ceiling)
  bucket_bf16,        // tuned bucket: bf16 measured faster
};

struct GateDecision {
  Path path = Path::bf16;
  GateReason reason = GateReason::disabled;
};

GateDecision decide_path(const GateInput& in);
// One sentence saying why, for explain() and logs.
std::string describe(const GateInput& in, const GateDecision& decision);

}  // namespace fp8proj
