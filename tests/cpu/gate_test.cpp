// Table-driven tests of the M-gate: which path runs for representative M with the flag on
// and off, eligible and ineligible shapes, overridden thresholds and both policies.
#include <gtest/gtest.h>

#include "fp8proj/gate.hpp"

namespace fp8proj {
namespace {

struct GateCase {
  const char* what;
  GateInput in;
  Path expect;
  GateReason reason;
};

GateInput make(int64_t m, bool enabled, bool eligible = true, int64_t threshold = 512,
               Fp8Policy policy = Fp8Policy::prefill, int64_t ceiling = 512) {
  GateInput in;
  in.m = m;
  in.enabled = enabled;
  in.eligible = eligible;
  in.threshold = threshold;
  in.policy = policy;
  in.decode_ceiling = ceiling;
  return in;
}

TEST(Gate, TableOfCases) {
  const Fp8Policy all = Fp8Policy::all;
  const GateCase cases[] = {
      // Flag on, eligible, defaults (reference design: FP8 when M > 512).
      {"on M=0", make(0, true), Path::none, GateReason::empty},
      {"on M=1", make(1, true), Path::bf16, GateReason::decode_ceiling},
      {"on M=511", make(511, true), Path::bf16, GateReason::decode_ceiling},
      {"on M=512", make(512, true), Path::bf16, GateReason::decode_ceiling},
      {"on M=513", make(513, true), Path::fp8, GateReason::above_threshold},
      {"on M=4096", make(4096, true), Path::fp8, GateReason::above_threshold},
      // Flag off: bf16 everywhere, M = 0 still a no-op.
      {"off M=0", make(0, false), Path::none, GateReason::empty},
      {"off M=1", make(1, false), Path::bf16, GateReason::disabled},
      {"off M=513", make(513, false), Path::bf16, GateReason::disabled},
      {"off M=4096", make(4096, false), Path::bf16, GateReason::disabled},
      // Ineligible (N or K not 128-aligned): bf16 even when on.
      {"inel M=4096", make(4096, true, false), Path::bf16, GateReason::ineligible},
      {"inel M=1", make(1, true, false), Path::bf16, GateReason::ineligible},
      // Threshold raised above the ceiling: it governs.
      {"thr2048 M=513", make(513, true, true, 2048), Path::bf16, GateReason::below_threshold},
      {"thr2048 M=2048", make(2048, true, true, 2048), Path::bf16, GateReason::below_threshold},
      {"thr2048 M=2049", make(2049, true, true, 2048), Path::fp8, GateReason::above_threshold},
      // Threshold lowered below the ceiling: prefill still keeps decode batches bf16...
      {"thr16 prefill M=64", make(64, true, true, 16), Path::bf16, GateReason::decode_ceiling},
      {"thr16 prefill M=513", make(513, true, true, 16), Path::fp8, GateReason::above_threshold},
      // ... and policy all lets FP8 run there.
      {"thr16 all M=64", make(64, true, true, 16, all), Path::fp8, GateReason::above_threshold},
      {"thr16 all M=16", make(16, true, true, 16, all), Path::bf16, GateReason::below_threshold},
      {"all M=511", make(511, true, true, 512, all), Path::bf16, GateReason::below_threshold},
      {"all M=513", make(513, true, true, 512, all), Path::fp8, GateReason::above_threshold},
      // Ceiling setting: 0 lets prefill use the threshold alone.
      {"ceil0 thr16 M=17", make(17, true, true, 16, Fp8Policy::prefill, 0), Path::fp8, GateReason::above_threshold},
  };
  for (const auto& c : cases) {
    const GateDecision d = decide_path(c.in);
    EXPECT_EQ(d.path, c.expect) << c.what << ": " << describe(c.in, d);
    EXPECT_EQ(d.reason, c.reason) << c.what << ": " << describe(c.in, d);
    EXPECT_FALSE(describe(c.in, d).empty()) << c.what;
  }
}

TEST(Gate, ArchitectureGateComesBeforeEligibility) {
  GateInput in = make(4096, true, false);
  in.arch_ok = false;
  in.arch_reason = "GPU is sm_80";
  const GateDecision d = decide_path(in);
  EXPECT_EQ(d.path, Path::bf16);
  EXPECT_EQ(d.reason, GateReason::arch);
  EXPECT_NE(describe(in, d).find("sm_80"), std::string::npos);
}

TEST(Gate, PolicyAllFollowsTunedBucket) {
  GateInput in = make(64, true, true, 512, Fp8Policy::all);
  in.bucket_fp8_wins = true;
  EXPECT_EQ(decide_path(in).path, Path::fp8);  // measured faster below the threshold
  in.m = 8192;
  in.bucket_fp8_wins = false;
  EXPECT_EQ(decide_path(in).path, Path::bf16);
  // The prefill policy keeps decode batches bf16 whatever the bucket says...
  in.policy = Fp8Policy::prefill;
  in.m = 64;
  in.bucket_fp8_wins = true;
  EXPECT_EQ(decide_path(in).reason, GateReason::decode_ceiling);
  EXPECT_EQ(decide_path(in).path, Path::bf16);
  // ... and above the ceiling follows the buckets like `all`: FP8 in a bucket it wins although
  // the threshold (pushed up by a later FP8 loss) lies beyond it, bf16 where bf16 won.
  in.m = 700;
  in.threshold = 2048;
  EXPECT_EQ(decide_path(in).path, Path::fp8);
  EXPECT_EQ(decide_path(in).reason, GateReason::bucket_fp8);
  EXPECT_NE(describe(in, decide_path(in)).find("above decode ceiling 512"), std::string::npos)
      << describe(in, decide_path(in));
  in.m = 1500;
  in.bucket_fp8_wins = false;
  EXPECT_EQ(decide_path(in).path, Path::bf16);
  EXPECT_EQ(decide_path(in).reason, GateReason::bucket_bf16);
  // Outside the buckets (no verdict) the threshold decides.
  in.bucket_fp8_wins.reset();
  EXPECT_EQ(decide_path(in).reason, GateReason::below_threshold);
  in.m = 4096;
  EXPECT_EQ(decide_path(in).path, Path::fp8);
}

TEST(Gate, DescribeNamesThresholdSource) {
  GateInput in = make(4096, true);
  in.threshold_source = "FP8PROJ_MIN_FP8_TOKENS";
  EXPECT_NE(describe(in, decide_path(in)).find("FP8PROJ_MIN_FP8_TOKENS"), std::string::npos);
}

}  // namespace
}  // namespace fp8proj
