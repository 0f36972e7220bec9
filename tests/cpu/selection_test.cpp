// The selection chain (include/fp8proj/selection.hpp) without a GPU: which path, backend and
// configuration it picks for representative M, N, K, policies and tuned rows, the reason it
// gives, and that a call allocates nothing. FP8 plans are the sm90_fp8_block backend's host
// half (sm90::PlanConfigs: its heuristic and legality rules) behind a plan that never launches,
// next to the real cpu_reference plans.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <variant>

#include "fp8proj/error.hpp"
#include "fp8proj/selection.hpp"
#include "gemm/sm90_fp8_heuristic.hpp"
#include "gemm/sm90_plan_configs.hpp"

// Heap allocations on this thread while `g_count_allocations` is set.
namespace {
thread_local bool g_count_allocations = false;
std::atomic<long> g_allocations{0};
}  // namespace

// Every unaligned form is replaced, so that new and delete always pair malloc with free (a
// sanitizer's own nothrow new would otherwise meet this delete: std::stable_sort's buffer).
namespace {
void* counted_malloc(std::size_t size) noexcept {
  if (g_count_allocations) g_allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(size ? size : 1);
}
}  // namespace
void* operator new(std::size_t size) {
  if (void* p = counted_malloc(size)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) {
  if (void* p = counted_malloc(size)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return counted_malloc(size); }
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept { return counted_malloc(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace fp8proj {
namespace {

// sm90_fp8_block as the selection sees it: its heuristic and legality, host only.
class HostSm90Backend final : public GemmBackend {
 public:
  std::string_view name() const override { return "sm90_fp8_block"; }
  GemmKind kind() const override { return GemmKind::fp8_block; }
  MemorySpace space() const override { return MemorySpace::host; }
  std::string unsupported_reason(int64_t n, int64_t k) const override {
    return fp8_block_shape_reason(n, k);
  }
};

class HostSm90Plan final : public Fp8GemmPlan {
 public:
  HostSm90Plan(int64_t n, int64_t k, int64_t max_m, const std::vector<std::pair<int64_t, GemmConfig>>& tuned)
      : configs_(n, k, 132, max_m, own(tuned)) {}
  void run(const Fp8ActivationView&, bf16*, StreamHandle) override { FP8PROJ_FAIL("host sm90 plan: no launches"); }
  GemmConfig heuristic_config(int64_t m) const override { return configs_.heuristic(m); }
  bool can_run(const GemmConfig& c, int64_t m) const override {
    const auto* s = std::get_if<sm90::Config>(&c);
    return s && configs_.can_run(*s, m);
  }
  std::string describe(int64_t m) const override { return configs_.config_for(m).name(); }

 private:
  static std::vector<std::pair<int64_t, std::optional<sm90::Config>>> own(
      const std::vector<std::pair<int64_t, GemmConfig>>& tuned) {
    std::vector<std::pair<int64_t, std::optional<sm90::Config>>> out;
    for (const auto& [m_hi, c] : tuned)
      out.emplace_back(m_hi, std::holds_alternative<sm90::Config>(c) ? std::optional(std::get<sm90::Config>(c))
                                                                    : std::nullopt);
    return out;
  }
  sm90::PlanConfigs configs_;
};

const HostSm90Backend kSm90;
const bf16 kDummyWeight[1] = {};
const uint8_t kDummyValues[1] = {};
const float kDummyScales[1] = {};

const GemmBackend* lookup(std::string_view name) {
  if (name == "sm90_fp8_block") return &kSm90;
  return find_backend(name, GemmKind::fp8_block);
}

// A Selector as ProjectionLayer builds one: primary FP8 backend `primary` (nullptr: no FP8
// path), bucket routing by `lookup`, one plan per routed backend.
Selector make(SelectorSpec spec, const GemmBackend* primary = &kSm90) {
  if (spec.max_rows == 0) spec.max_rows = 8192;
  const GemmBackend& bf = *find_backend("cpu_reference", GemmKind::bf16);
  GemmPlanOptions bo;
  bo.max_m = spec.max_rows;
  auto bf16_plan = bf.plan_bf16(kDummyWeight, spec.n, spec.k, bo);
  Fp8Routing routing;
  std::vector<std::unique_ptr<Fp8GemmPlan>> plans;
  if (primary && fp8_eligible(spec.n, spec.k)) {  // as the layer: no FP8 copy of an ineligible weight
    routing = route_fp8(spec, *primary, MemorySpace::host, lookup);
    for (size_t r = 0; r < routing.backends.size(); ++r) {
      const auto configs = plan_configs(spec, routing, r);
      if (routing.backends[r] == &kSm90) {
        plans.push_back(std::make_unique<HostSm90Plan>(spec.n, spec.k, spec.max_rows, configs));
      } else {
        GemmPlanOptions po;
        po.max_m = spec.max_rows;
        po.configs_by_m = configs;
        plans.push_back(routing.backends[r]->plan_fp8({kDummyValues, kDummyScales, spec.n, spec.k}, po));
      }
    }
  }
  return Selector(std::move(spec), bf, std::move(bf16_plan), std::move(routing), std::move(plans));
}

SelectorSpec spec(int64_t n, int64_t k, bool fp8, int64_t threshold = kDefaultThreshold,
                  Fp8Policy policy = Fp8Policy::prefill, int64_t ceiling = kDefaultDecodeCeiling) {
  SelectorSpec s;
  s.name = "sel";
  s.n = n;
  s.k = k;
  s.fp8 = fp8;
  s.threshold = threshold;
  s.policy = policy;
  s.decode_ceiling = ceiling;
  return s;
}

std::string name_of(const Selection& s) { return config_name(s.config); }

struct Case {
  const char* what;
  SelectorSpec spec;
  int64_t m;
  Path path;
  SelectReason reason;
};

TEST(Selection, PathForRepresentativeProblems) {
  const Fp8Policy all = Fp8Policy::all;
  const int64_t n = 16384, k = 2048;  // glm5 q_b_proj, TP1
  const Case cases[] = {
      // Opted in, eligible, defaults (the reference design: FP8 when M > 512).
      {"on M=0", spec(n, k, true), 0, Path::none, SelectReason::empty},
      {"on M=1", spec(n, k, true), 1, Path::bf16, SelectReason::decode_ceiling},
      {"on M=512", spec(n, k, true), 512, Path::bf16, SelectReason::decode_ceiling},
      {"on M=513", spec(n, k, true), 513, Path::fp8, SelectReason::above_threshold},
      {"on M=32768", spec(n, k, true), 32768, Path::fp8, SelectReason::above_threshold},
      // Not opted in: bf16 everywhere, M = 0 still a no-op.
      {"off M=0", spec(n, k, false), 0, Path::none, SelectReason::empty},
      {"off M=4096", spec(n, k, false), 4096, Path::bf16, SelectReason::disabled},
      // Ineligible shapes (fp8_eligible): N not a multiple of 16 or K not a multiple of 128;
      // fused_qkv_a's 2112 rows (a partial last 128-row block) are eligible.
      {"N=2112 M=4096", spec(2112, 6144, true), 4096, Path::fp8, SelectReason::above_threshold},
      {"N=2120 M=4096", spec(2120, 6144, true), 4096, Path::bf16, SelectReason::ineligible},
      {"K=200 M=4096", spec(n, 200, true), 4096, Path::bf16, SelectReason::ineligible},
      // Threshold above the ceiling governs; below it, prefill still keeps decode batches bf16 ...
      {"thr2048 M=2048", spec(n, k, true, 2048), 2048, Path::bf16, SelectReason::below_threshold},
      {"thr2048 M=2049", spec(n, k, true, 2048), 2049, Path::fp8, SelectReason::above_threshold},
      {"thr16 prefill M=64", spec(n, k, true, 16), 64, Path::bf16, SelectReason::decode_ceiling},
      // ... and policy all lets FP8 run there.
      {"thr16 all M=64", spec(n, k, true, 16, all), 64, Path::fp8, SelectReason::above_threshold},
      {"thr16 all M=16", spec(n, k, true, 16, all), 16, Path::bf16, SelectReason::below_threshold},
      // Ceiling 0: prefill uses the threshold alone.
      {"ceil0 thr16 M=17", spec(n, k, true, 16, Fp8Policy::prefill, 0), 17, Path::fp8, SelectReason::above_threshold},
  };
  for (const auto& c : cases) {
    const Selector sel = make(c.spec);
    const Selection s = sel.select({c.m, c.spec.n, c.spec.k});
    EXPECT_EQ(s.path, c.path) << c.what << ": " << sel.reason_text(s);
    EXPECT_EQ(s.reason, c.reason) << c.what << ": " << sel.reason_text(s);
    EXPECT_FALSE(sel.reason_text(s).empty()) << c.what;
    if (s.path == Path::fp8) {
      // No tuned row: the sm90 heuristic's configuration for these rows, typed.
      ASSERT_TRUE(std::holds_alternative<sm90::Config>(s.config)) << c.what;
      EXPECT_EQ(std::get<sm90::Config>(s.config), sm90::choose({s.rows, c.spec.n, c.spec.k, 132})) << c.what;
      EXPECT_EQ(s.backend->name(), "sm90_fp8_block");
    } else if (s.path == Path::bf16) {
      EXPECT_EQ(s.backend->name(), "cpu_reference");
    }
  }
}

TEST(Selection, ArchitectureComesBeforeEligibility) {
  SelectorSpec sp = spec(2112, 6144, true);
  sp.arch_reason = "GPU X is sm_80";
  const Selector sel = make(sp, nullptr);
  const Selection s = sel.select({4096, 2112, 6144});
  EXPECT_EQ(s.path, Path::bf16);
  EXPECT_EQ(s.reason, SelectReason::arch);
  EXPECT_NE(sel.reason_text(s).find("sm_80"), std::string::npos);
  // FP8 on, eligible, no arch reason: the selection must be given a plan to run it.
  EXPECT_THROW(make(spec(16384, 2048, true), nullptr), Error);
}

// A tuned row for 6144 x 16384 (glm5 o_proj TP1) the way a table file gives it.
SelectorSpec tuned_spec(Fp8Policy policy, int64_t ceiling = kDefaultDecodeCeiling) {
  SelectorSpec s = spec(6144, 16384, true, 0, policy, ceiling);
  TunedShape row;
  row.n = 6144;
  row.k = 16384;
  row.threshold = 96;
  row.buckets = {
      {1, 16, "sm90_fp8_block", "swapab_m16n128_ws2_st11_sk4", 40, 30, {}},  // FP8, split-K 4
      {17, 64, "sm90_fp8_block", "", 60, 70, {}},                            // bf16 faster; heuristic
      {65, 128, "cublaslt_fp8_block", "", 80, 70, {}},                       // unavailable here
      {129, 1024, "sm90_fp8_block", "m128n96_ws2_st7", 200, 150, {}},        // FP8
      {1025, 4096, "sm90_fp8_block", "m128n192_ws2_st4", 900, 950, {}},      // bf16 faster
      {4097, 32768, "sm90_fp8_block", "m256n128_ws2_st3_c", 9000, 6000, {}},
  };
  for (const auto& b : row.buckets) s.tuned_configs.push_back(parse_gemm_config(b.fp8_backend, b.fp8_config));
  s.tuned = row;
  s.tuned_source = "table.json";
  s.tuned_decides = true;
  s.threshold = row.threshold;
  s.threshold_source = ThresholdSource::tuned;
  return s;
}

TEST(Selection, TunedRowPolicyAllFollowsEachBucketAndItsConfiguration) {
  const Selector sel = make(tuned_spec(Fp8Policy::all));
  auto at = [&](int64_t m) { return sel.select({m, 6144, 16384}); };
  Selection s = at(8);
  EXPECT_EQ(s.path, Path::fp8);
  EXPECT_EQ(s.reason, SelectReason::bucket_fp8);
  EXPECT_EQ(name_of(s), "swapab_m16n128_ws2_st11_sk4") << "the bucket's configuration, typed, reaches the plan";
  EXPECT_EQ(sel.config_text(s), "swapab_m16n128_ws2_st11_sk4");
  EXPECT_EQ(at(40).path, Path::bf16);
  EXPECT_EQ(at(40).reason, SelectReason::bucket_bf16);
  // An unavailable backend's bucket runs on the primary with its heuristic, and explain says so.
  s = at(100);
  EXPECT_EQ(s.path, Path::fp8);
  EXPECT_EQ(s.backend->name(), "sm90_fp8_block");
  EXPECT_EQ(std::get<sm90::Config>(s.config), sm90::choose({100, 6144, 16384, 132}));
  EXPECT_NE(sel.reason_text(s).find("runs on sm90_fp8_block here (the tuned backend is unavailable)"),
            std::string::npos)
      << sel.reason_text(s);
  s = at(500);
  EXPECT_EQ(name_of(s), "m128n96_ws2_st7");
  EXPECT_NE(sel.reason_text(s).find("tuned row 6144x16384 (table.json) bucket [129, 1024]"), std::string::npos)
      << sel.reason_text(s);
  EXPECT_EQ(at(2000).path, Path::bf16);
  EXPECT_EQ(name_of(at(8192)), "m256n128_ws2_st3_c");
  // Beyond the buckets the threshold decides, with the heuristic's configuration.
  s = at(40000);
  EXPECT_EQ(s.reason, SelectReason::above_threshold);
  EXPECT_EQ(s.rows, 8192) << "M beyond max_rows runs in launches of max_rows";
  EXPECT_EQ(name_of(s), "m256n128_ws2_st3_c") << "a launch of 8192 rows is in the last bucket";
  // The last, shorter launch of M = 8192 + 100 picks its own: bucket [65, 128], the heuristic.
  const Selection tail = sel.launch(at(8292), 100);
  EXPECT_EQ(tail.rows, 100);
  EXPECT_EQ(std::get<sm90::Config>(tail.config), sm90::choose({100, 6144, 16384, 132}));
}

TEST(Selection, TunedConfigurationThatCannotRunFallsBackToTheHeuristic) {
  // Split-K keeps at most 8 token tiles: swapab m128 sk2 runs M <= 1024, not above. In a bucket
  // reaching past that, the M it cannot run get the heuristic's configuration instead.
  SelectorSpec sp = tuned_spec(Fp8Policy::all);
  sp.tuned->buckets[3] = {129, 2048, "sm90_fp8_block", "swapab_m128n128_ws2_st5_sk2", 200, 150, {}};
  sp.tuned->buckets[4].m_lo = 2049;
  sp.tuned_configs[3] = parse_gemm_config("sm90_fp8_block", "swapab_m128n128_ws2_st5_sk2");
  const Selector sel = make(sp);
  EXPECT_EQ(name_of(sel.select({1000, 6144, 16384})), "swapab_m128n128_ws2_st5_sk2");
  EXPECT_FALSE(sm90::can_run(std::get<sm90::Config>(sp.tuned_configs[3]), {1500, 6144, 16384, 132}));
  EXPECT_EQ(std::get<sm90::Config>(sel.select({1500, 6144, 16384}).config), sm90::choose({1500, 6144, 16384, 132}));
}

TEST(Selection, PrefillFollowsTheBucketsAboveTheCeilingAndThresholdsOverride) {
  const Selector sel = make(tuned_spec(Fp8Policy::prefill));
  EXPECT_EQ(sel.select({8, 6144, 16384}).reason, SelectReason::decode_ceiling);
  EXPECT_EQ(sel.select({600, 6144, 16384}).reason, SelectReason::bucket_fp8);
  EXPECT_NE(sel.reason_text(sel.select({600, 6144, 16384})).find("above decode ceiling 512"), std::string::npos);
  EXPECT_EQ(sel.select({2000, 6144, 16384}).path, Path::bf16);
  // An explicit threshold: the verdicts no longer decide the path, the buckets still pick the kernel.
  SelectorSpec sp = tuned_spec(Fp8Policy::all, 0);
  sp.tuned_decides = false;
  sp.threshold = 1500;
  sp.threshold_source = ThresholdSource::env;
  const Selector t = make(sp);
  EXPECT_EQ(t.select({8, 6144, 16384}).reason, SelectReason::below_threshold);
  const Selection s = t.select({2000, 6144, 16384});
  EXPECT_EQ(s.reason, SelectReason::above_threshold);
  EXPECT_EQ(name_of(s), "m128n192_ws2_st4") << "bucket [1025, 4096]'s kernel although bf16 won its verdict";
  EXPECT_NE(t.reason_text(s).find("threshold 1500 (FP8PROJ_MIN_FP8_TOKENS)"), std::string::npos) << t.reason_text(s);
}

TEST(Selection, ForcedBackendKeepsOnlyItsOwnBuckets) {
  SelectorSpec sp = tuned_spec(Fp8Policy::all);
  sp.fp8_backend = "cpu_reference";
  const Selector sel = make(sp, find_backend("cpu_reference", GemmKind::fp8_block));
  const Selection s = sel.select({500, 6144, 16384});
  EXPECT_EQ(s.backend->name(), "cpu_reference");
  EXPECT_TRUE(is_heuristic(s.config));
  EXPECT_NE(sel.reason_text(s).find("backend forced to cpu_reference"), std::string::npos) << sel.reason_text(s);
  EXPECT_NE(sel.config_text(s).find("OpenBLAS"), std::string::npos) << "the plan describes its own choice";
}

// Behind a norm that writes the FP8 input itself (forward_rmsnorm) the FP8 path pays no
// quantization: the bucket's GEMM-alone time decides. Without one, the quantize + GEMM verdict.
TEST(Selection, NormedInputFollowsTheGemmAloneVerdict) {
  SelectorSpec s = tuned_spec(Fp8Policy::all);
  s.tuned->buckets[1].fp8_gemm_us = 55;  // [17, 64]: bf16 60 us, FP8 70 us with its quantization, 55 without
  s.tuned->buckets[3].fp8_gemm_us = 210;  // [129, 1024]: FP8 150 us with its quantization: a slower GEMM alone
  const Selector sel = make(s);
  auto at = [&](int64_t m, InputLayout in) { return sel.select({m, 6144, 16384, in}); };
  EXPECT_EQ(at(40, InputLayout::bf16_rows).path, Path::bf16);
  Selection n = at(40, InputLayout::bf16_rmsnorm);
  EXPECT_EQ(n.path, Path::fp8);
  EXPECT_EQ(n.reason, SelectReason::bucket_fp8);
  EXPECT_EQ(n.input, InputLayout::bf16_rmsnorm);
  const std::string why = sel.reason_text(n);
  EXPECT_NE(why.find("FP8 GEMM alone: the norm before it writes its FP8 input"), std::string::npos) << why;
  EXPECT_NE(why.find("bf16 60.0 us, FP8 70.0 us (GEMM alone 55.0 us)"), std::string::npos) << why;
  EXPECT_EQ(at(500, InputLayout::bf16_rows).path, Path::fp8);
  EXPECT_EQ(at(500, InputLayout::bf16_rmsnorm).path, Path::bf16) << "the GEMM-alone time is the verdict there";
  // A bucket without a GEMM-alone time (older tables) keeps its one verdict for both.
  EXPECT_EQ(at(2000, InputLayout::bf16_rmsnorm).path, Path::bf16);
  EXPECT_EQ(at(8, InputLayout::bf16_rmsnorm).path, Path::fp8);
  EXPECT_EQ(sel.reason_text(at(8, InputLayout::bf16_rows)).find("GEMM alone"), std::string::npos);
  // An explicit threshold overrides the buckets for both layouts.
  SelectorSpec t = s;
  t.tuned_decides = false;
  t.threshold = 1000;
  t.threshold_source = ThresholdSource::option;
  EXPECT_EQ(make(t).select({40, 6144, 16384, InputLayout::bf16_rmsnorm}).reason, SelectReason::below_threshold);
}

TEST(Selection, PreQuantizedInputIsFp8) {
  const Selector sel = make(spec(16384, 2048, false));
  const Selection s = sel.select({64, 16384, 2048, InputLayout::fp8_quantized});
  EXPECT_EQ(s.path, Path::fp8);
  EXPECT_EQ(s.reason, SelectReason::prequantized);
  const Selector none = make(spec(16384, 2048, false), nullptr);
  EXPECT_EQ(none.select({64, 16384, 2048, InputLayout::fp8_quantized}).reason, SelectReason::no_fp8_copy);
  EXPECT_EQ(none.select({0, 16384, 2048, InputLayout::fp8_quantized}).path, Path::none);
}

TEST(Selection, ACallAllocatesNothing) {
  const Selector sel = make(tuned_spec(Fp8Policy::prefill));
  const Selector plain = make(spec(4096, 2048, true, 16, Fp8Policy::all));
  int64_t sum = 0;
  auto calls = [&] {
    for (int64_t m : {0, 1, 8, 16, 17, 100, 513, 1024, 3000, 8192, 9000, 40000}) {
      const Selection a = sel.select({m, 6144, 16384});
      const Selection b = plain.select({m, 4096, 2048});
      sum += a.rows + b.rows + (a.path == Path::fp8 ? sel.launch(a, 7).rows : 0);
    }
  };
  calls();  // first sight of each M above 1024: the heuristic runs once and is kept
  g_allocations = 0;
  g_count_allocations = true;
  calls();
  g_count_allocations = false;
  EXPECT_EQ(g_allocations.load(), 0) << "select() and launch() must not allocate";
  EXPECT_GT(sum, 0);
}

}  // namespace
}  // namespace fp8proj
