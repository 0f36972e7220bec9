// The selection chain (include/fp8proj/selection.hpp).
#include "fp8proj/selection.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>

#include "fp8proj/error.hpp"
#include "fp8proj/log.hpp"

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

const char* to_string(ThresholdSource source) {
  switch (source) {
    case ThresholdSource::builtin: return "default";
    case ThresholdSource::option: return "option";
    case ThresholdSource::env: return "FP8PROJ_MIN_FP8_TOKENS";
    case ThresholdSource::tuned: return "tuned";
  }
  return "?";
}

// ---- construction: which plan runs each tuned bucket ----

Fp8Routing route_fp8(const SelectorSpec& spec, const GemmBackend& primary, MemorySpace space,
                     const BackendLookup& lookup) {
  Fp8Routing r;
  r.backends = {&primary};
  if (!spec.tuned) return r;
  FP8PROJ_CHECK(spec.tuned_configs.size() == spec.tuned->buckets.size(), spec.name, ": ", spec.tuned_configs.size(),
                " typed configurations for ", spec.tuned->buckets.size(), " tuned buckets");
  const bool forced = spec.fp8_backend != "auto";
  for (size_t i = 0; i < spec.tuned->buckets.size(); ++i) {
    const TunedBucket& b = spec.tuned->buckets[i];
    const GemmBackend* be = lookup(b.fp8_backend);
    std::string why;
    if (forced) {
      if (b.fp8_backend != primary.name()) be = nullptr;  // a forced backend wins; explain() says so
    } else {
      why = !be                    ? "not available in this process"
            : be->space() != space ? "not for this memory space"
                                   : be->unsupported_reason(spec.n, spec.k);
    }
    if (!why.empty()) {
      log_once(LogLevel::warn, "tuned-backend:" + spec.name + ":" + b.fp8_backend,
               spec.name + ": tuned table names FP8 backend '" + b.fp8_backend + "' for M in [" +
                   std::to_string(b.m_lo) + ", " + std::to_string(b.m_hi) + "], which is " + why + "; using " +
                   std::string(primary.name()) + " there");
      be = nullptr;
    }
    if (!be) {  // the primary with its heuristic
      r.bucket_route.push_back(0);
      r.bucket_config.emplace_back(HeuristicConfig{});
      continue;
    }
    auto it = std::find(r.backends.begin(), r.backends.end(), be);
    if (it == r.backends.end()) it = r.backends.insert(r.backends.end(), be);
    r.bucket_route.push_back(static_cast<size_t>(it - r.backends.begin()));
    r.bucket_config.push_back(spec.tuned_configs[i]);
  }
  return r;
}

std::vector<std::pair<int64_t, GemmConfig>> plan_configs(const SelectorSpec& spec, const Fp8Routing& routing,
                                                         size_t route) {
  std::vector<std::pair<int64_t, GemmConfig>> out;
  if (!spec.tuned) return out;
  bool named = false;
  for (size_t i = 0; i < routing.bucket_route.size(); ++i)
    if (routing.bucket_route[i] == route) {
      out.emplace_back(spec.tuned->buckets[i].m_hi, routing.bucket_config[i]);
      named = named || !is_heuristic(routing.bucket_config[i]);
    }
  if (!named) out.clear();
  return out;
}

Selector::Selector(SelectorSpec spec, const GemmBackend& bf16_backend, std::unique_ptr<Bf16GemmPlan> bf16_plan,
                   Fp8Routing routing, std::vector<std::unique_ptr<Fp8GemmPlan>> fp8_plans)
    : spec_(std::move(spec)),
      bf16_backend_(&bf16_backend),
      bf16_plan_(std::move(bf16_plan)),
      routing_(std::move(routing)),
      fp8_plans_(std::move(fp8_plans)) {
  FP8PROJ_CHECK(bf16_plan_ != nullptr, spec_.name, ": the selection needs a bf16 plan");
  FP8PROJ_CHECK(fp8_plans_.empty() || fp8_plans_.size() == routing_.backends.size(), spec_.name, ": ",
                fp8_plans_.size(), " FP8 plans for ", routing_.backends.size(), " FP8 backends");
  FP8PROJ_CHECK(fp8_plans_.empty() || spec_.max_rows > 0, spec_.name, ": an FP8 path needs max_rows > 0");
  // Where the chain can reach FP8 there is a plan to run it.
  FP8PROJ_CHECK(!spec_.fp8 || !spec_.arch_reason.empty() || !fp8_eligible(spec_.n, spec_.k) || has_fp8(), spec_.name,
                ": FP8 is on and eligible here, but the selection was given no FP8 plan");
  if (spec_.tuned && !fp8_plans_.empty()) {
    FP8PROJ_CHECK(routing_.bucket_route.size() == spec_.tuned->buckets.size(), spec_.name,
                  ": the FP8 routing does not cover the tuned buckets");
    for (size_t i = 0; i < spec_.tuned->buckets.size(); ++i) {
      const TunedBucket& b = spec_.tuned->buckets[i];
      buckets_.push_back(
          {b.m_lo, b.m_hi, b.fp8_wins(), b.fp8_gemm_wins(), routing_.bucket_route[i], routing_.bucket_config[i]});
    }
  }
}

Selector::~Selector() = default;
Selector::Selector(Selector&&) noexcept = default;
Selector& Selector::operator=(Selector&&) noexcept = default;

// ---- the chain ----

const Selector::Bucket* Selector::bucket_of(int64_t m) const {
  for (const Bucket& b : buckets_)
    if (m >= b.m_lo && m <= b.m_hi) return &b;
  return nullptr;
}

Selection Selector::none(SelectReason why, int64_t m) const {
  Selection s;
  s.path = Path::none;
  s.reason = why;
  s.m = m;
  return s;
}

Selection Selector::bf16(SelectReason why, int64_t m) const {
  Selection s;
  s.path = Path::bf16;
  s.reason = why;
  s.m = m;
  s.rows = m;
  s.backend = bf16_backend_;
  return s;
}

Selection Selector::fp8(SelectReason why, int64_t m) const {
  Selection s;
  s.path = Path::fp8;
  s.reason = why;
  s.m = m;
  return launch(s, std::min(m, spec_.max_rows));
}

Selection Selector::select(const ProblemDesc& p) const {
  Selection s = choose(p);
  s.input = p.input;
  return s;
}

Selection Selector::choose(const ProblemDesc& p) const {
  const int64_t m = p.m;
  if (m <= 0) return none(SelectReason::empty, m);
  // The caller quantized the input: FP8, if the layer holds the FP8 weight.
  if (p.input == InputLayout::fp8_quantized)
    return has_fp8() ? fp8(SelectReason::prequantized, m) : none(SelectReason::no_fp8_copy, m);
  // Can this layer take the FP8 path at all?
  if (!spec_.fp8) return bf16(SelectReason::disabled, m);
  if (!spec_.arch_reason.empty()) return bf16(SelectReason::arch, m);
  if (!fp8_eligible(p.n, p.k)) return bf16(SelectReason::ineligible, m);
  // Which path for this M?
  if (spec_.policy == Fp8Policy::prefill && m <= spec_.decode_ceiling) return bf16(SelectReason::decode_ceiling, m);
  // Inside a tuned bucket its measured verdict decides (both policies; above the ceiling for
  // prefill). The threshold alone would keep bf16 in a bucket between the ceiling and a
  // threshold that a later FP8 loss pushed up, although FP8 measured faster there.
  // Where the norm before the GEMM writes its input (forward_rmsnorm) the FP8 path has no
  // quantization of its own to pay: the bucket's GEMM-alone verdict.
  if (const Bucket* b = spec_.tuned_decides ? bucket_of(m) : nullptr) {
    const bool wins = p.input == InputLayout::bf16_rmsnorm ? b->fp8_gemm_wins : b->fp8_wins;
    return wins ? fp8(SelectReason::bucket_fp8, m) : bf16(SelectReason::bucket_bf16, m);
  }
  if (m <= spec_.threshold) return bf16(SelectReason::below_threshold, m);
  return fp8(SelectReason::above_threshold, m);
}

Selection Selector::launch(const Selection& call, int64_t rows) const {
  Selection s = call;
  s.rows = rows;
  // Which FP8 plan: the tuned bucket's of the launch's rows (whichever rule chose the path),
  // else the primary's.
  const Bucket* b = bucket_of(rows);
  s.route = b ? b->route : 0;
  s.backend = routing_.backends[s.route];
  // Which configuration: the bucket's where its plan can run it with these rows (e.g. a
  // split-K that needs more K blocks cannot), else the backend's heuristic.
  const Fp8GemmPlan& plan = *fp8_plans_[s.route];
  s.config = b && plan.can_run(b->config, rows) ? b->config : plan.heuristic_config(rows);
  return s;
}

// ---- explain() ----

std::string Selector::reason_text(const Selection& s) const {
  using std::to_string;
  const std::string m = "M=" + to_string(s.m);
  // INT64_MAX is what `fp8proj tune` writes when FP8 never won by its margin (tuner.hpp).
  const bool never = spec_.threshold == std::numeric_limits<int64_t>::max();
  const std::string thr = "threshold " + (never ? std::string("never") : to_string(spec_.threshold)) + " (" +
                          fp8proj::to_string(spec_.threshold_source) + ")";
  const std::string policy = std::string(" [policy ") + fp8proj::to_string(spec_.policy) + "]";
  const std::string shape = to_string(spec_.n) + "x" + to_string(spec_.k);
  std::string text;
  switch (s.reason) {
    case SelectReason::empty: return "M=0: nothing to compute";
    case SelectReason::no_fp8_copy: return "pre-quantized input, but the layer holds no FP8 weight";
    case SelectReason::prequantized: text = m + ": input quantized by the caller"; break;
    case SelectReason::disabled: text = "FP8 is off (opt in with FP8PROJ_PREFILL_FP8=1 or ProjectionOptions::fp8)"; break;
    case SelectReason::arch: text = "FP8 unavailable here: " + spec_.arch_reason; break;
    case SelectReason::ineligible:
      text = "not eligible for FP8: " + fp8_block_shape_reason(spec_.n, spec_.k);
      break;
    case SelectReason::decode_ceiling:
      text = m + " <= decode ceiling " + to_string(spec_.decode_ceiling) + ": decode batches stay bf16" + policy;
      break;
    case SelectReason::below_threshold: text = m + " <= " + thr + ": bf16" + policy; break;
    case SelectReason::above_threshold:
      text = m + " > " + thr +
             (spec_.policy == Fp8Policy::prefill ? " and > decode ceiling " + to_string(spec_.decode_ceiling) : "") +
             policy;
      break;
    case SelectReason::bucket_fp8:
    case SelectReason::bucket_bf16: {
      const std::string ceiling =
          spec_.policy == Fp8Policy::prefill ? " (above decode ceiling " + to_string(spec_.decode_ceiling) + ")" : "";
      text = m + ceiling + ": " + (s.reason == SelectReason::bucket_fp8 ? "FP8" : "bf16") +
             " measured faster in this tuned M bucket" +
             (s.input == InputLayout::bf16_rmsnorm ? " (FP8 GEMM alone: the norm before it writes its FP8 input)" : "") +
             policy;
      break;
    }
  }
  // The tuned row and bucket behind this decision, or why there is none.
  if (!spec_.tuned) {
    if (s.reason == SelectReason::disabled || s.reason == SelectReason::arch || s.reason == SelectReason::ineligible)
      return text;
    if (!spec_.tuned_source.empty()) return text + "; no tuned row for " + shape + " in " + spec_.tuned_source;
    return text + (spec_.table_expected ? "; no tuned table for this GPU" : "");
  }
  text += "; tuned row " + shape + " (" + spec_.tuned_source + ")";
  const TunedBucket* b = spec_.tuned->bucket_for(s.m);
  if (!b) return text + ", beyond its buckets";
  char times[128];
  if (b->fp8_gemm_us > 0)
    std::snprintf(times, sizeof times, ": bf16 %.1f us, FP8 %.1f us (GEMM alone %.1f us)", b->bf16_us, b->fp8_us,
                  b->fp8_gemm_us);
  else
    std::snprintf(times, sizeof times, ": bf16 %.1f us, FP8 %.1f us", b->bf16_us, b->fp8_us);
  text += " bucket [" + to_string(b->m_lo) + ", " + to_string(b->m_hi) + "]" + times + ", FP8 via " + b->fp8_backend +
          (b->fp8_config.empty() ? "" : " [" + b->fp8_config + "]");
  if (s.path == Path::fp8 && s.backend && s.backend->name() != b->fp8_backend)
    text += " -- runs on " + std::string(s.backend->name()) + " here (" +
            (spec_.fp8_backend != "auto" ? "backend forced to " + spec_.fp8_backend
                                         : std::string("the tuned backend is unavailable")) +
            ")";
  return text;
}

std::string Selector::config_text(const Selection& s) const {
  switch (s.path) {
    case Path::none: return "";
    case Path::bf16: return bf16_plan_->describe(s.m);
    case Path::fp8: return is_heuristic(s.config) ? fp8_plans_[s.route]->describe(s.rows) : config_name(s.config);
  }
  return "";
}

}  // namespace fp8proj
