// What one call of a projection runs: one flat chain of predicates (Selector::select, in
// src/layer/selection.cpp, read top to bottom like ggml-cuda's ggml_cuda_mul_mat). A problem
// descriptor goes in -- M, N, K and the layout of the input -- and a typed choice comes out:
// the path (bf16 or FP8), the backend and its configuration (a GemmConfig, parsed once when
// the tuned table loaded), and the reason. ProjectionLayer::forward runs the choice,
// ProjectionLayer::explain prints it.
//
// Everything the chain reads is fixed when the layer is built (options, FP8PROJ_* knobs, the
// tuned row as typed buckets, the plans), so select() builds no strings and allocates
// nothing: forward() calls it on every launch, inside CUDA-graph capture too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp8proj/gemm.hpp"
#include "fp8proj/gemm_config.hpp"
#include "fp8proj/tensor.hpp"
#include "fp8proj/tune.hpp"

namespace fp8proj {

enum class Path : uint8_t { none, bf16, fp8 };
enum class Fp8Policy : uint8_t {
  prefill,  // decode batches (M <= decode ceiling) stay bf16; above the ceiling as `all`
  all,      // FP8 wherever it is measured (tuned bucket) or, outside the buckets, thresholded faster
};

const char* to_string(Path path);
const char* to_string(Fp8Policy policy);

inline constexpr int64_t kDefaultThreshold = 512;      // the reference design's M > 512
inline constexpr int64_t kDefaultDecodeCeiling = 512;  // largest CUDA-graph decode batch

// The FP8 path's shape rule, the only one: fp8_eligible / fp8_block_shape_reason (gemm.hpp).

// How the activations reach the GEMM.
enum class InputLayout : uint8_t {
  bf16_rows,      // forward(): x[M, K] bf16, row-major
  bf16_rmsnorm,   // forward_rmsnorm(): rmsnorm(x), rows x_stride >= K apart; on the FP8 path the norm
                  // writes the e4m3 input (rmsnorm_quantize), so a tuned bucket's verdict is the GEMM
                  // alone against bf16 (TunedBucket::fp8_gemm_wins)
  fp8_quantized,  // forward_quantized(): e4m3 [M, K] + 1x128 scales, quantized by the caller
};

// The problem: y[M, N] (bf16, row-major) = x[M, K] . W[N, K]^T with W row-major.
struct ProblemDesc {
  int64_t m = 0, n = 0, k = 0;
  InputLayout input = InputLayout::bf16_rows;
};

enum class SelectReason : uint8_t {
  empty,            // M = 0
  no_fp8_copy,      // pre-quantized input, but the layer holds no FP8 weight
  prequantized,     // pre-quantized input: FP8
  disabled,         // not opted in
  arch,             // no FP8 backend for this device and shape
  ineligible,       // !fp8_eligible(N, K)
  decode_ceiling,   // prefill policy, M <= ceiling
  bucket_fp8,       // tuned bucket: FP8 measured faster (prefill: above the ceiling)
  bucket_bf16,      // tuned bucket: bf16 measured faster
  below_threshold,  // M <= threshold
  above_threshold,  // M > threshold (and > ceiling for prefill)
};

enum class ThresholdSource : uint8_t { builtin, option, env, tuned };
const char* to_string(ThresholdSource source);  // "default", "option", "FP8PROJ_MIN_FP8_TOKENS", "tuned"

// Everything the chain reads, fixed at construction (ProjectionLayer fills it from its options).
struct SelectorSpec {
  std::string name = "projection";  // the layer's, for logs and explain()
  int64_t n = 0, k = 0;
  bool fp8 = false;  // opted in
  Fp8Policy policy = Fp8Policy::prefill;
  int64_t threshold = kDefaultThreshold;
  ThresholdSource threshold_source = ThresholdSource::builtin;
  int64_t decode_ceiling = kDefaultDecodeCeiling;
  int64_t max_rows = 0;     // rows per FP8 launch (the activation workspace's); larger M runs in chunks
  std::string arch_reason;  // why no FP8 backend can run here; "" when one can
  // The tuned row of (N, K), its typed configurations (parallel to its buckets) and where it
  // came from; tuned_decides: no explicit threshold, so inside the buckets their verdicts decide.
  std::optional<TunedShape> tuned;
  std::vector<GemmConfig> tuned_configs;
  std::string tuned_source;
  bool tuned_decides = false;
  bool table_expected = false;         // a device layer that looked for a table (explain() says so)
  std::string fp8_backend = "auto";    // the FP8 backend the caller asked for
};

// The tuned buckets mapped onto FP8 plans (route_fp8 below): one plan per backend, [0] the
// primary (the default or forced FP8 backend).
struct Fp8Routing {
  std::vector<const GemmBackend*> backends;
  std::vector<size_t> bucket_route;       // per tuned bucket: index into backends
  std::vector<GemmConfig> bucket_config;  // per tuned bucket: what it runs on that plan
};

// Which plan runs each tuned bucket: the bucket's own backend when it is available here for
// this memory space and shape and no other backend was forced, with the bucket's
// configuration; else the primary with its heuristic (logged once per layer and bucket).
// `lookup` finds an FP8 backend by name (find_backend in the library; tests pass their own).
using BackendLookup = std::function<const GemmBackend*(std::string_view)>;
Fp8Routing route_fp8(const SelectorSpec& spec, const GemmBackend& primary, MemorySpace space,
                     const BackendLookup& lookup);
// GemmPlanOptions::configs_by_m of plan `route`: every tuned bucket it runs, with its
// configuration (HeuristicConfig kept, so a bucket left to the heuristic does not inherit the
// next one's); empty when none names a configuration.
std::vector<std::pair<int64_t, GemmConfig>> plan_configs(const SelectorSpec& spec, const Fp8Routing& routing,
                                                         size_t route);

// The typed choice for one problem.
struct Selection {
  Path path = Path::none;
  SelectReason reason = SelectReason::empty;
  int64_t m = 0;
  int64_t rows = 0;                      // rows per launch: M, capped at max_rows on the FP8 path
  const GemmBackend* backend = nullptr;  // what runs (nullptr for Path::none)
  size_t route = 0;                      // FP8: its plan, Selector::fp8_plan(route)
  GemmConfig config;                     // FP8: the configuration of a launch of `rows` rows
  InputLayout input = InputLayout::bf16_rows;  // the problem's, for explain()
};

class Selector {
 public:
  // fp8_plans parallel to routing.backends; may be empty (no FP8 path).
  Selector(SelectorSpec spec, const GemmBackend& bf16_backend, std::unique_ptr<Bf16GemmPlan> bf16_plan,
           Fp8Routing routing, std::vector<std::unique_ptr<Fp8GemmPlan>> fp8_plans);
  ~Selector();
  Selector(Selector&&) noexcept;
  Selector& operator=(Selector&&) noexcept;

  // The chain. p.n and p.k must be the layer's.
  Selection select(const ProblemDesc& p) const;
  // The FP8 launch of `rows` rows of a call that selected FP8 (its last, shorter chunk).
  Selection launch(const Selection& call, int64_t rows) const;

  // For explain(): why, and what the plan runs.
  std::string reason_text(const Selection& s) const;
  std::string config_text(const Selection& s) const;

  const SelectorSpec& spec() const { return spec_; }
  bool has_fp8() const { return !fp8_plans_.empty(); }
  Bf16GemmPlan& bf16_plan() const { return *bf16_plan_; }
  Fp8GemmPlan& fp8_plan(size_t route) const { return *fp8_plans_[route]; }
  size_t fp8_plan_count() const { return fp8_plans_.size(); }

 private:
  // One tuned bucket as the chain reads it.
  struct Bucket {
    int64_t m_lo = 0, m_hi = 0;
    bool fp8_wins = false;       // FP8 from bf16 rows, its quantization included
    bool fp8_gemm_wins = false;  // FP8 from an input its producer quantized: the GEMM alone
    size_t route = 0;
    GemmConfig config;
  };
  const Bucket* bucket_of(int64_t m) const;
  Selection choose(const ProblemDesc& p) const;  // select() without the problem's layout filled in
  Selection none(SelectReason why, int64_t m) const;
  Selection bf16(SelectReason why, int64_t m) const;
  Selection fp8(SelectReason why, int64_t m) const;

  SelectorSpec spec_;
  const GemmBackend* bf16_backend_;
  std::unique_ptr<Bf16GemmPlan> bf16_plan_;
  Fp8Routing routing_;
  std::vector<std::unique_ptr<Fp8GemmPlan>> fp8_plans_;
  std::vector<Bucket> buckets_;  // the tuned row's, typed
};

}  // namespace fp8proj
