// The gated projection layer (include/fp8proj/projection.hpp).
#include "fp8proj/projection.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "core/device_fault.hpp"
#include "fp8proj/device.hpp"
#include "fp8proj/env.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/gemm.hpp"
#include "fp8proj/log.hpp"
#include "fp8proj/memory.hpp"
#include "fp8proj/ops.hpp"
#include "fp8proj/selection.hpp"

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
  if (auto w = env::weight_scales()) o.weight_scales = *w;
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

  Buffer fp8_values, fp8_scales;
  std::shared_ptr<ActivationWorkspace> ws;
  bool owns_ws = false;
  const QuantOps* ops = nullptr;
  std::optional<Selector> selector;

  ProblemDesc problem(int64_t m, InputLayout input = InputLayout::bf16_rows) const { return {m, n, k, input}; }

  // Device layers: after a sticky CUDA error every call fails with it (core/device_fault.hpp),
  // M = 0 included, before any work.
  void check_usable() const {
    if (space == MemorySpace::device) check_device_usable();
  }

  void check_io(const void* x, int64_t m, const void* y) const {
    FP8PROJ_CHECK(m >= 0, opt.name, ": M must be >= 0, got ", m);
    if (m == 0) return;
    FP8PROJ_CHECK(x != nullptr && y != nullptr, opt.name, ": input or output pointer is null (M=", m, ")");
    if (space == MemorySpace::device)
      FP8PROJ_CHECK(aligned16(x) && aligned16(y), opt.name, ": device input and output must be 16-byte aligned");
  }

  // One FP8 launch of `rows` rows of a call that selected FP8: its own choice when the chunk is
  // shorter than the call's launches.
  void run_fp8(const Selection& call, const Fp8ActivationView& q, bf16* y, StreamHandle stream) const {
    const Selection l = q.m == call.rows ? call : selector->launch(call, q.m);
    selector->fp8_plan(l.route).run_with(q, y, l.config, stream);
  }

  // The tuned row of (N, K) and its typed configurations: an explicit row's names are parsed
  // here, a table's were parsed when it loaded.
  void find_tuned(SelectorSpec& spec) const {
    if (opt.tuned) {
      spec.tuned = opt.tuned;
      spec.tuned_source = "ProjectionOptions::tuned";
      for (const TunedBucket& b : spec.tuned->buckets) {
        try {
          spec.tuned_configs.push_back(parse_gemm_config(b.fp8_backend, b.fp8_config));
        } catch (const Error& e) {
          FP8PROJ_FAIL(opt.name, ": ProjectionOptions::tuned bucket [", b.m_lo, ", ", b.m_hi, "]: ", e.what());
        }
      }
    } else if (opt.use_tune_table && space == MemorySpace::device) {
      spec.table_expected = true;
      if (const TuneTable* t = active_tune_table()) {
        if (const TunedShape* row = t->find(n, k)) {
          spec.tuned = *row;
          for (const TunedBucket& b : row->buckets) spec.tuned_configs.push_back(b.config);
        }
        spec.tuned_source = t->source;
      }
    }
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
    check_device_usable();
    FP8PROJ_CHECK(gpu_available(), name, ": device layer asked for, but ", current_device().why_absent);
    FP8PROJ_CHECK(aligned16(weight), name, ": device weight must be 16-byte aligned");
  }
  s.ops = &quant_ops(space);

  // What the selection reads, fixed now.
  SelectorSpec spec;
  spec.name = name;
  spec.n = n;
  spec.k = k;
  spec.fp8 = s.opt.fp8;
  spec.policy = s.opt.policy;
  spec.decode_ceiling = s.opt.decode_ceiling;
  spec.fp8_backend = s.opt.fp8_backend;
  if (space == MemorySpace::device && !current_device().is_sm90())
    spec.arch_reason = "GPU " + current_device().name + " is " + current_device().arch() +
                       "; the FP8 kernels are built for sm_90a (Hopper)";
  else if (space == MemorySpace::device && default_backend(GemmKind::fp8_block, space, n, k) == nullptr)
    spec.arch_reason = "no block-scaled FP8 backend can run " + std::to_string(n) + "x" + std::to_string(k);
  s.find_tuned(spec);
  if (s.opt.apply_env && env::min_fp8_tokens()) {
    spec.threshold = *s.opt.threshold;
    spec.threshold_source = ThresholdSource::env;
  } else if (s.opt.threshold) {
    spec.threshold = *s.opt.threshold;
    spec.threshold_source = ThresholdSource::option;
  } else if (spec.tuned) {
    spec.threshold = spec.tuned->threshold;
    spec.threshold_source = ThresholdSource::tuned;
    spec.tuned_decides = true;
  }

  const GemmBackend& bf16_backend = resolve_backend(s.opt.bf16_backend, GemmKind::bf16, space, n, k, name);
  GemmPlanOptions bo;
  bo.max_m = s.opt.max_tokens;
  std::unique_ptr<Bf16GemmPlan> bf16_plan = bf16_backend.plan_bf16(weight, n, k, bo);

  const bool eligible = fp8_eligible(n, k);
  const bool want_fp8 = s.opt.fp8 && eligible && spec.arch_reason.empty();
  if (s.opt.fp8 && !want_fp8)
    log_once(LogLevel::info, "ineligible:" + name,
             name + " stays bf16: " + (!spec.arch_reason.empty() ? spec.arch_reason : fp8_block_shape_reason(n, k)));
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

  // The FP8 copy (e4m3 + 128x128 scales) and one plan per FP8 backend the buckets route to.
  Fp8Routing routing;
  std::vector<std::unique_ptr<Fp8GemmPlan>> fp8_plans;
  if (want_fp8) {
    spec.max_rows = s.ws->max_tokens();
    const GemmBackend& primary = resolve_backend(s.opt.fp8_backend, GemmKind::fp8_block, space, n, k, name);
    s.fp8_values = Buffer(space, static_cast<size_t>(n * k));
    s.fp8_scales = Buffer(space, static_cast<size_t>(ceil_div(n, 128) * ceil_div(k, 128)) * sizeof(float));
    const Fp8WeightOut out{s.fp8_values.data<uint8_t>(), s.fp8_scales.data<float>(), n, k};
    s.ops->quantize_weight(weight, n, k, out, s.opt.weight_scales, nullptr);
    s.ops->synchronize(nullptr);  // the copy must be complete before any stream uses it
    routing = route_fp8(spec, primary, space,
                        [](std::string_view nm) { return find_backend(nm, GemmKind::fp8_block); });
    for (size_t r = 0; r < routing.backends.size(); ++r) {
      GemmPlanOptions po;
      po.max_m = s.ws->max_tokens();
      po.configs_by_m = plan_configs(spec, routing, r);
      fp8_plans.push_back(routing.backends[r]->plan_fp8(out.view(), po));
    }
  }
  s.selector.emplace(std::move(spec), bf16_backend, std::move(bf16_plan), std::move(routing), std::move(fp8_plans));
}

ProjectionLayer::~ProjectionLayer() = default;
ProjectionLayer::ProjectionLayer(ProjectionLayer&&) noexcept = default;
ProjectionLayer& ProjectionLayer::operator=(ProjectionLayer&&) noexcept = default;

void ProjectionLayer::forward(const bf16* x, int64_t m, bf16* y, StreamHandle stream) {
  Impl& s = *impl_;
  s.check_usable();
  s.check_io(x, m, y);
  const Selection sel = s.selector->select(s.problem(m));
  switch (sel.path) {
    case Path::none: return;
    case Path::bf16: {
      for (int64_t off = 0; off < m; off += s.opt.max_tokens) {
        const int64_t rows = std::min(s.opt.max_tokens, m - off);
        s.selector->bf16_plan().run(x + off * s.k, rows, y + off * s.n, stream);
      }
      return;
    }
    case Path::fp8: {
      const int64_t chunk = s.ws->max_tokens();
      for (int64_t off = 0; off < m; off += chunk) {
        const int64_t rows = std::min(chunk, m - off);
        const Fp8ActivationOut q = s.ws->fp8(rows, s.k);
        s.ops->quantize_activation(x + off * s.k, rows, s.k, q, stream);
        s.run_fp8(sel, q.view(), y + off * s.n, stream);
      }
      return;
    }
  }
}

void ProjectionLayer::forward_rmsnorm(const bf16* x, int64_t x_stride, const bf16* norm_weight, float eps, int64_t m,
                                      bf16* y, StreamHandle stream) {
  Impl& s = *impl_;
  s.check_usable();
  s.check_io(x, m, y);
  FP8PROJ_CHECK(m == 0 || norm_weight != nullptr, s.opt.name, ": RMSNorm weight is null");
  FP8PROJ_CHECK(x_stride >= s.k, s.opt.name, ": forward_rmsnorm input row stride ", x_stride, " is below K=", s.k);
  const Selection sel = s.selector->select(s.problem(m, InputLayout::bf16_rmsnorm));
  if (sel.path == Path::none) return;
  FP8PROJ_CHECK(s.ws != nullptr, s.opt.name, ": forward_rmsnorm needs ProjectionOptions::rmsnorm_input");
  const int64_t chunk = s.ws->max_tokens();
  for (int64_t off = 0; off < m; off += chunk) {
    const int64_t rows = std::min(chunk, m - off);
    if (sel.path == Path::fp8) {
      const Fp8ActivationOut q = s.ws->fp8(rows, s.k);
      s.ops->rmsnorm_quantize(x + off * x_stride, x_stride, norm_weight, eps, rows, s.k, q, stream);
      s.run_fp8(sel, q.view(), y + off * s.n, stream);
    } else {
      FP8PROJ_CHECK(s.ws->has_bf16_rows(), s.opt.name, ": workspace has no bf16 rows for forward_rmsnorm");
      s.ops->rmsnorm(x + off * x_stride, x_stride, norm_weight, eps, rows, s.k, s.ws->bf16_rows(), stream);
      s.selector->bf16_plan().run(s.ws->bf16_rows(), rows, y + off * s.n, stream);
    }
  }
}

void ProjectionLayer::forward_quantized(const Fp8ActivationView& x, bf16* y, StreamHandle stream) {
  Impl& s = *impl_;
  s.check_usable();
  FP8PROJ_CHECK(s.selector->has_fp8(), s.opt.name, ": forward_quantized needs the FP8 copy, which this layer does not ",
                "hold (", s.selector->reason_text(s.selector->select(s.problem(std::max<int64_t>(x.m, 1)))), ")");
  FP8PROJ_CHECK(x.k == s.k, s.opt.name, ": quantized input has K=", x.k, ", the layer has K=", s.k);
  s.check_io(x.values, x.m, y);
  const Selection sel = s.selector->select(s.problem(x.m, InputLayout::fp8_quantized));
  if (sel.path == Path::none) return;
  const int64_t chunk = s.ws->max_tokens();
  for (int64_t off = 0; off < x.m; off += chunk) {
    const int64_t rows = std::min(chunk, x.m - off);
    // Rows [off, off + rows) of an M-contiguous scale tensor keep its stride: the view moves
    // its start by `off` (a multiple of 4, so device alignment holds).
    const Fp8ActivationView part{x.values + off * x.k, x.scales + off, rows, x.k, x.scale_ld};
    s.run_fp8(sel, part, y + off * s.n, stream);
  }
}

Path ProjectionLayer::path_for(int64_t m, InputLayout input) const {
  return impl_->selector->select(impl_->problem(m, input)).path;
}

Selection ProjectionLayer::select(const ProblemDesc& p) const { return impl_->selector->select(p); }

Explanation ProjectionLayer::explain(int64_t m, InputLayout input) const {
  const Selector& sel = *impl_->selector;
  const Selection s = sel.select(impl_->problem(m, input));
  Explanation e;
  e.m = m;
  e.path = s.path;
  e.reason = sel.reason_text(s);
  if (s.backend) e.backend = std::string(s.backend->name());
  e.config = sel.config_text(s);
  return e;
}

ProjectionMemory ProjectionLayer::memory() const {
  const Impl& s = *impl_;
  ProjectionMemory mem;
  mem.bf16_weight = static_cast<size_t>(s.n * s.k) * sizeof(bf16);
  mem.fp8_values = s.fp8_values.bytes();
  mem.fp8_scales = s.fp8_scales.bytes();
  mem.workspace = s.owns_ws ? s.ws->bytes() : 0;
  for (size_t r = 0; r < s.selector->fp8_plan_count(); ++r) mem.workspace += s.selector->fp8_plan(r).workspace_bytes();
  return mem;
}

const std::string& ProjectionLayer::name() const { return impl_->opt.name; }
int64_t ProjectionLayer::n() const { return impl_->n; }
int64_t ProjectionLayer::k() const { return impl_->k; }
MemorySpace ProjectionLayer::space() const { return impl_->space; }
bool ProjectionLayer::has_fp8_copy() const { return impl_->selector->has_fp8(); }
const ProjectionOptions& ProjectionLayer::options() const { return impl_->opt; }
const bf16* ProjectionLayer::bf16_weight() const { return impl_->weight; }
std::optional<Fp8WeightView> ProjectionLayer::fp8_weight() const {
  if (impl_->fp8_values.empty()) return std::nullopt;
  return Fp8WeightView{impl_->fp8_values.data<uint8_t>(), impl_->fp8_scales.data<float>(), impl_->n, impl_->k};
}

}  // namespace fp8proj
