#include "fp8proj/gate.hpp"

#include <limits>
#include <string>

namespace fp8proj {

const char* to_string(Path path) {
  switch (path) {
    case Path::none: return "none";
    case Path::bf16: return "bf16";
    case Path::fp8: return "fp8";
  }
  return "?";
}

const char* to_string(Fp8Policy policy) { return policy == Fp8Policy::all ? "all" : "prefill"; }

GateDecision decide_path(const GateInput& in) {
  if (in.m <= 0) return {Path::none, GateReason::empty};
  if (!in.enabled) return {Path::bf16, GateReason::disabled};
  if (!in.arch_ok) return {Path::bf16, GateReason::arch};
  if (!in.eligible) return {Path::bf16, GateReason::ineligible};
  if (in.policy == Fp8Policy::prefill && in.m <= in.decode_ceiling)
    return {Path::bf16, GateReason::decode_ceiling};
  // Inside a tuned bucket its measured verdict decides (both policies, above the ceiling for
  // prefill). The threshold alone would keep bf16 in a bucket between the ceiling and a
  // threshold that a later FP8 loss pushed up, although FP8 measured faster there.
  if (in.bucket_fp8_wins.has_value())
    return *in.bucket_fp8_wins ? GateDecision{Path::fp8, GateReason::bucket_fp8}
                               : GateDecision{Path::bf16, GateReason::bucket_bf16};
  if (in.m <= in.threshold) return {Path::bf16, GateReason::below_threshold};
  return {Path::fp8, GateReason::above_threshold};
}

std::string describe(const GateInput& in, const GateDecision& d) {
  using std::to_string;
  const std::string m = "M=" + to_string(in.m);
  // INT64_MAX is what `fp8proj tune` writes when FP8 never won by its margin (tuner.hpp).
  const bool never = in.threshold == std::numeric_limits<int64_t>::max();
  const std::string thr = "threshold " + (never ? std::string("never") : to_string(in.threshold)) + " (" +
                          std::string(in.threshold_source) + ")";
  const std::string policy = std::string(" [policy ") + fp8proj::to_string(in.policy) + "]";
  switch (d.reason) {
    case GateReason::empty: return "M=0: nothing to compute";
    case GateReason::disabled: return "FP8 is off (opt in with FP8PROJ_PREFILL_FP8=1 or ProjectionOptions::fp8)";
    case GateReason::arch: return "FP8 unavailable here: " + std::string(in.arch_reason);
    case GateReason::ineligible: return "not eligible for FP8: " + std::string(in.eligibility_reason);
    case GateReason::decode_ceiling:
      return m + " <= decode ceiling " + to_string(in.decode_ceiling) + ": decode batches stay bf16" + policy;
    case GateReason::below_threshold: return m + " <= " + thr + ": bf16" + policy;
    case GateReason::above_threshold:
      return m + " > " + thr +
             (in.policy == Fp8Policy::prefill ? " and > decode ceiling " + to_string(in.decode_ceiling) : "") +
             policy;
    case GateReason::bucket_fp8:
    case GateReason::bucket_bf16: {
      const std::string ceiling =
          in.policy == Fp8Policy::prefill ? " (above decode ceiling " + to_string(in.decode_ceiling) + ")" : "";
      return m + ceiling + ": " + (d.reason == GateReason::bucket_fp8 ? "FP8" : "bf16") +
             " measured faster in this tuned M bucket" + policy;
    }
  }
  return "";
}

}  // namespace fp8proj
