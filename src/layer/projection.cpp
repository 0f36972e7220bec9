// The gated projection layer (include/fp8proj/projection.hpp).
#include "fp8proj/projection.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "fp8proj/device.hpp"
#include "fp8proj/env.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/gemm.hpp"
#include "fp8proj/log.hpp"
#include "fp8proj/memory.hpp"
#include "fp8proj/ops.hpp"

namespace fp8proj {

ProjectionOptions ProjectionOptions::with_env() const {
  ProjectionOptions o = *this;
  if (auto sw = env::prefill_fp8()) {
    o.fp8 = sw->enabled;
    o.policy = sw->policy_all ? Fp8Policy::all : Fp8Policy::prefill;
  }
  if (auto t = env::min_fp8_tokens()) o.threshold = *t;
  if (auto c = env::decode_ceiling()) o.decode_ceiling = *c;
  if (auto b = env::fp8_backend()) o.fp8_backend = *b;
  return o;
}

std::string Explanation::to_string() const {
  std::string s = "M=" + std::to_string(m) + ": " + fp8proj::to_string(path);
  if (!backend.empty()) s += " via " + backend + (config.empty() ? "" : " [" + config + "]");
  return s + " -- " + reason;
}

namespace {
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
}  // namespace

struct ProjectionLayer::Impl {
  MemorySpace space;
  const bf16* weight;
  int64_t n, k;
  ProjectionOptions opt;

  bool eligible = false, arch_ok = false;
  std::string eligibility_reason, arch_reason;
  int64_t threshold = kDefaultThreshold;
  std::string threshold_source = "default";
  bool threshold_is_tuned = false;  // no explicit threshold: the tuned buckets decide inside their range
  std::optional<TunedShape> tuned;
  std::string tuned_source;  // the table file, or "ProjectionOptions::tuned"

  const GemmBackend* bf16_backend = nullptr;
  std::unique_ptr<Bf16GemmPlan> bf16_plan;

  Buffer fp8_values, fp8_scales;
  struct Fp8Candidate {
    const GemmBackend* backend;
    std::unique_ptr<Fp8GemmPlan> plan;
  };
  std::vector<Fp8Candidate> fp8_plans;  // [0] is the default FP8 backend
  std::vector<size_t> bucket_plan;      // tuned->buckets[i] runs on fp8_plans[bucket_plan[i]]
  std::shared_ptr<ActivationWorkspace> ws;
  bool owns_ws = false;
  const QuantOps* ops = nullptr;

  GateInput gate_input(int64_t m) const {
    GateInput in;
    in.m = m;
    in.enabled = opt.fp8;
    in.policy = opt.policy;
    in.arch_ok = arch_ok;
    in.eligible = eligible;
    in.threshold = threshold;
    in.decode_ceiling = opt.decode_ceiling;
    if (tuned && threshold_is_tuned)
      if (const TunedBucket* b = tuned->bucket_for(m)) in.bucket_fp8_wins = b->fp8_wins();
    in.arch_reason = arch_reason;
    in.eligibility_reason = eligibility_reason;
    in.threshold_source = threshold_source;
    return in;
  }

  Path path(int64_t m) const {
    const Path p = decide_path(gate_input(m)).path;
    return (p == Path::fp8 && fp8_plans.empty()) ? Path::bf16 : p;
  }

  // The FP8 plan for this M: the tuned bucket's backend (make_fp8_copy decided which plan
  // runs each bucket), else the primary.
  Fp8Candidate& fp8_for(int64_t m) {
    if (tuned && !bucket_plan.empty())
      if (const TunedBucket* b = tuned->bucket_for(m))
        return fp8_plans[bucket_plan[static_cast<size_t>(b - tuned->buckets.data())]];
    return fp8_plans.front();
  }

  // For explain(): the tuned row and bucket behind this decision, or why there is none.
  std::string tuned_row_text(int64_t m, const std::string& fp8_backend_used) const {
    const std::string shape = std::to_string(n) + "x" + std::to_string(k);
    if (!tuned) {
      if (!opt.fp8 || !eligible || !arch_ok) return "";
      if (!tuned_source.empty()) return "; no tuned row for " + shape + " in " + tuned_source;
      return space == MemorySpace::device && opt.use_tune_table ? "; no tuned table for this GPU" : "";
    }
    std::string t = "; tuned row " + shape + " (" + tuned_source + ")";
    const TunedBucket* b = tuned->bucket_for(m);
    if (!b) return t + ", beyond its buckets";
    char times[96];
    std::snprintf(times, sizeof times, ": bf16 %.1f us, FP8 %.1f us", b->bf16_us, b->fp8_us);
    t += " bucket [" + std::to_string(b->m_lo) + ", " + std::to_string(b->m_hi) + "]" + times + ", FP8 via " +
         b->fp8_backend + (b->fp8_config.empty() ? "" : " [" + b->fp8_config + "]");
    if (!fp8_backend_used.empty() && fp8_backend_used != b->fp8_backend)
      t += " -- runs on " + fp8_backend_used + " here (" +
           (opt.fp8_backend != "auto" ? "backend forced to " + opt.fp8_backend : "the tuned backend is unavailable") +
           ")";
    return t;
  }

  void check_io(const void* x, int64_t m, const void* y) const {
    FP8PROJ_CHECK(m >= 0, opt.name, ": M must be >= 0, got ", m);
    if (m == 0) return;
    FP8PROJ_CHECK(x != nullptr && y != nullptr, opt.name, ": input or output pointer is null (M=", m, ")");
    if (space == MemorySpace::device)
      FP8PROJ_CHECK(aligned16(x) && aligned16(y), opt.name, ": device input and output must be 16-byte aligned");
  }

  void make_fp8_copy() {
    const GemmBackend* primary = &resolve_backend(opt.fp8_backend, GemmKind::fp8_block, space, n, k, opt.name);
    fp8_values = Buffer(space, static_cast<size_t>(n * k));
    fp8_scales = Buffer(space, static_cast<size_t>(ceil_div(n, 128) * ceil_div(k, 128)) * sizeof(float));
    const Fp8WeightOut out{fp8_values.data<uint8_t>(), fp8_scales.data<float>(), n, k};
    ops->quantize_weight(weight, n, k, out, nullptr);
    ops->synchronize(nullptr);  // the copy must be complete before any stream uses it

    // Which backend runs each tuned bucket: the bucket's own when it can run here (and no
    // backend was forced), else the primary with its heuristic -- said once in the log.
    std::vector<const GemmBackend*> wanted = {primary};
    std::vector<std::pair<const GemmBackend*, std::string>> per_bucket;  // parallel to tuned->buckets
    if (tuned)
      for (const auto& b : tuned->buckets) {
        const GemmBackend* be = find_backend(b.fp8_backend, GemmKind::fp8_block);
        std::string why;
        if (opt.fp8_backend != "auto") {
          if (b.fp8_backend != primary->name()) be = nullptr;  // a forced backend wins; explain() says so
        } else {
          why = !be                    ? "not available in this process"
                : be->space() != space ? "not for this memory space"
                                       : be->unsupported_reason(n, k);
        }
        if (!why.empty()) {
          log_once(LogLevel::warn, "tuned-backend:" + opt.name + ":" + b.fp8_backend,
                   opt.name + ": tuned table names FP8 backend '" + b.fp8_backend + "' for M in [" +
                       std::to_string(b.m_lo) + ", " + std::to_string(b.m_hi) + "], which is " + why + "; using " +
                       std::string(primary->name()) + " there");
          be = nullptr;
        }
        if (!be) {
          per_bucket.emplace_back(primary, "");
          continue;
        }
        per_bucket.emplace_back(be, b.fp8_config);
        if (std::find(wanted.begin(), wanted.end(), be) == wanted.end()) wanted.push_back(be);
      }
    for (const GemmBackend* be : wanted) {
      GemmPlanOptions po;
      po.max_m = ws->max_tokens();
      if (tuned) {
        std::vector<std::optional<std::string>> runs;
        for (const auto& [bucket_be, config] : per_bucket)
          runs.push_back(bucket_be == be ? std::optional<std::string>(config) : std::nullopt);
        po.config_by_m = tuned_config_by_m(*tuned, runs);
      }
      fp8_plans.push_back({be, be->plan_fp8(out.view(), po)});
    }
    for (const auto& pb : per_bucket)
      bucket_plan.push_back(static_cast<size_t>(std::find(wanted.begin(), wanted.end(), pb.first) - wanted.begin()));
  }
};

ProjectionLayer::ProjectionLayer(MemorySpace space, const bf16* weight, int64_t n, int64_t k,
                                 ProjectionOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.space = space;
  s.weight = weight;
  s.n = n;
  s.k = k;
  s.opt = options.apply_env ? options.with_env() : options;
  const std::string& name = s.opt.name;
  FP8PROJ_CHECK(n > 0 && k > 0, name, ": weight shape must be positive, got ", n, "x", k);
  FP8PROJ_CHECK(weight != nullptr, name, ": bf16 weight pointer is null");
  FP8PROJ_CHECK(s.opt.max_tokens > 0 && s.opt.max_tokens % 4 == 0, name,
                ": max_tokens must be a positive multiple of 4, got ", s.opt.max_tokens);
  FP8PROJ_CHECK(s.opt.decode_ceiling >= 0, name, ": decode ceiling must be >= 0");
  if (space == MemorySpace::device) {
    FP8PROJ_CHECK(gpu_available(), name, ": device layer asked for, but ", current_device().why_absent);
    FP8PROJ_CHECK(aligned16(weight), name, ": device weight must be 16-byte aligned");
  }
  s.ops = &quant_ops(space);

  s.bf16_backend = &resolve_backend(s.opt.bf16_backend, GemmKind::bf16, space, n, k, name);
  GemmPlanOptions bo;
  bo.max_m = s.opt.max_tokens;
  s.bf16_plan = s.bf16_backend->plan_bf16(weight, n, k, bo);

  s.eligibility_reason = fp8_block_shape_reason(n, k);
  s.eligible = s.eligibility_reason.empty();
  if (space == MemorySpace::host) {
    s.arch_ok = true;
  } else if (!current_device().is_sm90()) {
    s.arch_reason = "GPU " + current_device().name + " is " + current_device().arch() +
                    "; the FP8 kernels are built for sm_90a (Hopper)";
  } else if (default_backend(GemmKind::fp8_block, space, n, k) == nullptr) {
    s.arch_reason = "no block-scaled FP8 backend can run " + std::to_string(n) + "x" + std::to_string(k);
  } else {
    s.arch_ok = true;
  }

  if (s.opt.tuned) {
    s.tuned = s.opt.tuned;
    s.tuned_source = "ProjectionOptions::tuned";
  } else if (s.opt.use_tune_table && space == MemorySpace::device) {
    if (const TuneTable* t = active_tune_table()) {
      if (const TunedShape* row = t->find(n, k)) s.tuned = *row;
      s.tuned_source = t->source;
    }
  }
  if (s.opt.apply_env && env::min_fp8_tokens()) {
    s.threshold = *s.opt.threshold;
    s.threshold_source = "FP8PROJ_MIN_FP8_TOKENS";
  } else if (s.opt.threshold) {
    s.threshold = *s.opt.threshold;
    s.threshold_source = "option";
  } else if (s.tuned) {
    s.threshold = s.tuned->threshold;
    s.threshold_source = "tuned";
    s.threshold_is_tuned = true;
  }

  const bool want_fp8 = s.opt.fp8 && s.eligible && s.arch_ok;
  if (s.opt.fp8 && !want_fp8)
    log_once(LogLevel::info, "ineligible:" + name,
             name + " stays bf16: " + (s.eligible ? s.arch_reason : s.eligibility_reason));
  if (want_fp8 || s.opt.rmsnorm_input) {
    if (s.opt.workspace) {
      s.ws = s.opt.workspace;
      FP8PROJ_CHECK(s.ws->space() == space && s.ws->max_k() >= round_up(k, 128) &&
                        (!s.opt.rmsnorm_input || s.ws->has_bf16_rows()),
                    name, ": the shared workspace is too small or in the wrong memory space");
    } else {
      s.ws = std::make_shared<ActivationWorkspace>(space, s.opt.max_tokens, round_up(k, 128), s.opt.rmsnorm_input);
      s.owns_ws = true;
    }
  }
  if (want_fp8) s.make_fp8_copy();
}

ProjectionLayer::~ProjectionLayer() = default;
ProjectionLayer::ProjectionLayer(ProjectionLayer&&) noexcept = default;
ProjectionLayer& ProjectionLayer::operator=(ProjectionLayer&&) noexcept = default;

void ProjectionLayer::forward(const bf16* x, int64_t m, bf16* y, StreamHandle stream) {
  Impl& s = *impl_;
  s.check_io(x, m, y);
  switch (s.path(m)) {
    case Path::none: return;
    case Path::bf16: {
      for (int64_t off = 0; off < m; off += s.opt.max_tokens) {
        const int64_t rows = std::min(s.opt.max_tokens, m - off);
        s.bf16_plan->run(x + off * s.k, rows, y + off * s.n, stream);
      }
      return;
    }
    case Path::fp8: {
      const int64_t chunk = s.ws->max_tokens();
      for (int64_t off = 0; off < m; off += chunk) {
        const int64_t rows = std::min(chunk, m - off);
        const Fp8ActivationOut q = s.ws->fp8(rows, s.k);
        s.ops->quantize_activation(x + off * s.k, rows, s.k, q, stream);
        s.fp8_for(rows).plan->run(q.view(), y + off * s.n, stream);
      }
      return;
    }
  }
}

void ProjectionLayer::forward_rmsnorm(const bf16* x, int64_t x_stride, const bf16* norm_weight, float eps, int64_t m,
                                      bf16* y, StreamHandle stream) {
  Impl& s = *impl_;
  s.check_io(x, m, y);
  FP8PROJ_CHECK(m == 0 || norm_weight != nullptr, s.opt.name, ": RMSNorm weight is null");
  FP8PROJ_CHECK(x_stride >= s.k, s.opt.name, ": forward_rmsnorm input row stride ", x_stride, " is below K=", s.k);
  const Path p = s.path(m);
  if (p == Path::none) return;
  FP8PROJ_CHECK(s.ws != nullptr, s.opt.name, ": forward_rmsnorm needs ProjectionOptions::rmsnorm_input");
  const int64_t chunk = s.ws->max_tokens();
  for (int64_t off = 0; off < m; off += chunk) {
    const int64_t rows = std::min(chunk, m - off);
    if (p == Path::fp8) {
      const Fp8ActivationOut q = s.ws->fp8(rows, s.k);
      s.ops->rmsnorm_quantize(x + off * x_stride, x_stride, norm_weight, eps, rows, s.k, q, stream);
      s.fp8_for(rows).plan->run(q.view(), y + off * s.n, stream);
    } else {
      FP8PROJ_CHECK(s.ws->has_bf16_rows(), s.opt.name, ": workspace has no bf16 rows for forward_rmsnorm");
      s.ops->rmsnorm(x + off * x_stride, x_stride, norm_weight, eps, rows, s.k, s.ws->bf16_rows(), stream);
      s.bf16_plan->run(s.ws->bf16_rows(), rows, y + off * s.n, stream);
    }
  }
}

void ProjectionLayer::forward_quantized(const Fp8ActivationView& x, bf16* y, StreamHandle stream) {
  Impl& s = *impl_;
  FP8PROJ_CHECK(!s.fp8_plans.empty(), s.opt.name, ": forward_quantized needs the FP8 copy, which this layer does not ",
                "hold (", s.opt.fp8 ? (s.eligible ? s.arch_reason : s.eligibility_reason) : "FP8 is off", ")");
  FP8PROJ_CHECK(x.k == s.k, s.opt.name, ": quantized input has K=", x.k, ", the layer has K=", s.k);
  s.check_io(x.values, x.m, y);
  const int64_t chunk = s.ws->max_tokens();
  for (int64_t off = 0; off < x.m; off += chunk) {
    const int64_t rows = std::min(chunk, x.m - off);
    // Rows [off, off + rows) of an M-contiguous scale tensor keep its stride: the view moves
    // its start by `off` (a multiple of 4, so device alignment holds).
    const Fp8ActivationView part{x.values + off * x.k, x.scales + off, rows, x.k, x.scale_ld};
    s.fp8_for(rows).plan->run(part, y + off * s.n, stream);
  }
}

Path ProjectionLayer::path_for(int64_t m) const { return impl_->path(m); }

Explanation ProjectionLayer::explain(int64_t m) const {
  const Impl& s = *impl_;
  const GateInput in = s.gate_input(m);
  const GateDecision d = decide_path(in);
  Explanation e;
  e.m = m;
  e.path = s.path(m);
  e.reason = describe(in, d);
  if (e.path == Path::bf16) {
    e.backend = std::string(s.bf16_backend->name());
    e.config = s.bf16_plan->describe(m);
  } else if (e.path == Path::fp8) {
    auto& c = const_cast<Impl&>(s).fp8_for(std::min(m, s.ws->max_tokens()));
    e.backend = std::string(c.backend->name());
    e.config = c.plan->describe(std::min(m, s.ws->max_tokens()));
  }
  e.reason += s.tuned_row_text(m, e.path == Path::fp8 ? e.backend : "");
  return e;
}

ProjectionMemory ProjectionLayer::memory() const {
  const Impl& s = *impl_;
  ProjectionMemory mem;
  mem.bf16_weight = static_cast<size_t>(s.n * s.k) * sizeof(bf16);
  mem.fp8_values = s.fp8_values.bytes();
  mem.fp8_scales = s.fp8_scales.bytes();
  mem.workspace = s.owns_ws ? s.ws->bytes() : 0;
  for (const auto& c : s.fp8_plans) mem.workspace += c.plan->workspace_bytes();
  return mem;
}

const std::string& ProjectionLayer::name() const { return impl_->opt.name; }
int64_t ProjectionLayer::n() const { return impl_->n; }
int64_t ProjectionLayer::k() const { return impl_->k; }
MemorySpace ProjectionLayer::space() const { return impl_->space; }
bool ProjectionLayer::has_fp8_copy() const { return !impl_->fp8_plans.empty(); }
const ProjectionOptions& ProjectionLayer::options() const { return impl_->opt; }
const bf16* ProjectionLayer::bf16_weight() const { return impl_->weight; }
std::optional<Fp8WeightView> ProjectionLayer::fp8_weight() const {
  if (impl_->fp8_values.empty()) return std::nullopt;
  return Fp8WeightView{impl_->fp8_values.data<uint8_t>(), impl_->fp8_scales.data<float>(), impl_->n, impl_->k};
}

}  // namespace fp8proj
