// The C ABI (include/fp8proj/c_api.h) over the GEMM backends: a handle owns one Fp8GemmPlan,
// built as the projection layer builds its FP8 plan (tuned configurations per M bucket);
// every entry point turns an exception into -1 and a per-thread message.
#include "fp8proj/c_api.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/device_fault.hpp"
#include "fp8proj/device.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/gemm.hpp"
#include "fp8proj/memory.hpp"
#include "fp8proj/ops.hpp"
#include "fp8proj/projection.hpp"
#include "fp8proj/quantize.hpp"
#include "fp8proj/tune.hpp"

#if FP8PROJ_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/cuda_check.hpp"
#endif

struct fp8proj_workspace {
  std::shared_ptr<fp8proj::ActivationWorkspace> ws;
};

struct fp8proj_projection {
  std::unique_ptr<fp8proj::ProjectionLayer> layer;
  int64_t id = 0;  // fp8proj_projection_lookup's key
};

struct fp8proj_fp8_gemm {
  const fp8proj::GemmBackend* backend = nullptr;
  std::unique_ptr<fp8proj::Fp8GemmPlan> plan;
  int64_t k = 0, max_m = 0;
};

namespace fp8proj {
namespace {

thread_local std::string last_error;

// Live projections by id: callers that cannot hold a pointer safely (a torch op's int argument)
// name a projection by its id, and a stale id is an error, not a wild pointer. Ids are never
// reused in a process.
struct ProjectionRegistry {
  std::mutex mutex;
  int64_t next_id = 1;
  std::unordered_map<int64_t, fp8proj_projection*> live;
};
ProjectionRegistry& registry() {
  static auto* r = new ProjectionRegistry();  // outlives static destruction (handles freed at exit)
  return *r;
}

template <typename F>
int guarded(F&& f) noexcept {
  try {
    f();
    last_error.clear();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown C++ exception";
  }
  return -1;
}

// The entry points that would use the GPU: after a sticky CUDA error they fail at once with the
// first fault's text (core/device_fault.hpp), before any argument is looked at.
template <typename F>
int guarded_gpu(F&& f) noexcept {
  return guarded([&] {
    check_device_usable();
    f();
  });
}

// Pointers reach kernels as TMA base addresses and vector loads: they must be device memory
// (or managed) and 16-byte aligned. A host pointer would otherwise fault on the GPU, and the
// fault would poison the caller's context.
void check_device_pointer(const void* p, const char* what) {
  FP8PROJ_CHECK(p != nullptr, what, " is null");
  FP8PROJ_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, what, " is not 16-byte aligned");
#if FP8PROJ_WITH_CUDA
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, p);
  if (cuda_error_is_sticky(err)) CUDA_CHECK(err);  // a dead context, not a bad pointer
  if (err != cudaSuccess) (void)cudaGetLastError();  // not sticky; clear it
  FP8PROJ_CHECK(err == cudaSuccess && (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged),
                what, " is not device memory (the FP8 GEMM reads and writes device buffers only)");
#endif
}

// The projection layer's rule: the tuned buckets that name this backend run their
// configuration, every other M the backend's heuristic (one plan runs every M here).
GemmPlanOptions plan_options(const GemmBackend& backend, int64_t n, int64_t k, int64_t max_m) {
  GemmPlanOptions po;
  po.max_m = max_m;
  const TuneTable* table = active_tune_table();
  if (const TunedShape* row = table ? table->find(n, k) : nullptr) {
    std::vector<std::optional<std::string>> runs;
    for (const TunedBucket& b : row->buckets) runs.emplace_back(b.fp8_backend == backend.name() ? b.fp8_config : "");
    po.config_by_m = tuned_config_by_m(*row, runs);
  }
  return po;
}

void create(const void* w_values, const float* w_scales, int64_t n, int64_t k, int64_t max_m, const char* name,
            fp8proj_fp8_gemm** out) {
  FP8PROJ_CHECK(out != nullptr, "out (the handle's address) is null");
  *out = nullptr;
  check_context_alive();  // making a plan may not touch the context: it must not succeed on a dead one
  const std::string shape_reason = fp8_block_shape_reason(n, k);
  FP8PROJ_CHECK(shape_reason.empty(), "weight shape ", n, "x", k, ": ", shape_reason);
  FP8PROJ_CHECK(max_m > 0, "max_m must be > 0, got ", max_m);
  FP8PROJ_CHECK(gpu_available(), "no usable CUDA GPU in this process: the C API runs device backends only");
  check_device_pointer(w_values, "w_values");
  check_device_pointer(w_scales, "w_scales");

  const GemmBackend* be =
      &resolve_backend(name && *name ? name : "auto", GemmKind::fp8_block, MemorySpace::device, n, k);
  auto g = std::make_unique<fp8proj_fp8_gemm>();
  g->backend = be;
  g->k = k;
  g->max_m = max_m;
  g->plan = be->plan_fp8(Fp8WeightView{static_cast<const uint8_t*>(w_values), w_scales, n, k},
                         plan_options(*be, n, k, max_m));
  *out = g.release();
}

void run(fp8proj_fp8_gemm* g, const void* x_values, const float* x_scales, int64_t x_scale_ld, int64_t m, void* y,
         void* stream) {
  FP8PROJ_CHECK(g != nullptr, "gemm handle is null");
  FP8PROJ_CHECK(m >= 0 && m <= g->max_m, "m=", m, " is outside [0, max_m=", g->max_m, "]");
  const Fp8ActivationView x{static_cast<const uint8_t*>(x_values), x_scales, m, g->k, x_scale_ld};
  check_gemm_fp8_args(x, g->k, static_cast<const bf16*>(y), g->max_m);
  if (m == 0) return;
  check_device_pointer(x_values, "x_values");
  check_device_pointer(x_scales, "x_scales");
  check_device_pointer(y, "y");
  g->plan->run(x, static_cast<bf16*>(y), stream);
}

// Every entry point that launches work checks for a device first, so that a CPU-only build or
// a machine without a GPU gets a sentence instead of a CUDA error code.
void check_gpu(const char* what) {
  FP8PROJ_CHECK(gpu_available(), what, ": no usable CUDA GPU in this process (", current_device().why_absent, ")");
}

void check_scale_ld(int64_t scale_ld, int64_t m) {
  FP8PROJ_CHECK(scale_ld >= m && scale_ld % 4 == 0, "scale_ld=", scale_ld, " must be >= m=", m,
                " and a multiple of 4 (the M-major scale layout)");
}

// FP8PROJ_SCALES_* -> ScaleMode; anything else is an error naming the argument.
ScaleMode scale_mode_of(int scale_format, const char* what) {
  FP8PROJ_CHECK(scale_format == FP8PROJ_SCALES_UE8M0 || scale_format == FP8PROJ_SCALES_FLOAT, what, "=",
                scale_format, " is not FP8PROJ_SCALES_UE8M0 (", FP8PROJ_SCALES_UE8M0, ") or FP8PROJ_SCALES_FLOAT (",
                FP8PROJ_SCALES_FLOAT, ")");
  return scale_format == FP8PROJ_SCALES_UE8M0 ? ScaleMode::ue8m0 : ScaleMode::fp32;
}

void quantize_activation(const void* x, int64_t x_stride, int64_t m, int64_t k, void* values, float* scales,
                         int64_t scale_ld, void* stream, ScaleMode mode = ScaleMode::ue8m0) {
  FP8PROJ_CHECK(m >= 0, "m must be >= 0, got ", m);
  FP8PROJ_CHECK(k > 0 && k % 128 == 0, "k=", k, " must be a positive multiple of 128 (1x128 groups)");
  FP8PROJ_CHECK(x_stride == k, "activation quantization reads dense rows: x_stride=", x_stride,
                " must equal k=", k, " (make the input contiguous)");
  check_scale_ld(scale_ld, m);
  if (m == 0) return;
  check_gpu("quantize_activation");
  check_device_pointer(x, "x");
  check_device_pointer(values, "values");
  check_device_pointer(scales, "scales");
  quant_ops(MemorySpace::device)
      .quantize_activation(static_cast<const bf16*>(x), m, k,
                           Fp8ActivationOut{static_cast<uint8_t*>(values), scales, m, k, scale_ld}, mode, stream);
}

void rmsnorm_quantize(const void* x, int64_t x_stride, const void* weight, float eps, int64_t m, int64_t k,
                      void* values, float* scales, int64_t scale_ld, void* stream, ScaleMode mode = ScaleMode::ue8m0) {
  FP8PROJ_CHECK(m >= 0, "m must be >= 0, got ", m);
  FP8PROJ_CHECK(k > 0 && k % 128 == 0, "k=", k, " must be a positive multiple of 128 (1x128 groups)");
  FP8PROJ_CHECK(x_stride >= k && x_stride % 8 == 0, "x_stride=", x_stride, " must be >= k=", k,
                " and a multiple of 8 elements (16-byte rows)");
  FP8PROJ_CHECK(eps >= 0.0f, "eps must be >= 0, got ", eps);
  check_scale_ld(scale_ld, m);
  if (m == 0) return;
  check_gpu("rmsnorm_quantize");
  check_device_pointer(x, "x");
  check_device_pointer(weight, "weight");
  check_device_pointer(values, "values");
  check_device_pointer(scales, "scales");
  quant_ops(MemorySpace::device)
      .rmsnorm_quantize(static_cast<const bf16*>(x), x_stride, static_cast<const bf16*>(weight), eps, m, k,
                        Fp8ActivationOut{static_cast<uint8_t*>(values), scales, m, k, scale_ld}, mode, stream);
}

void silu_mul_quantize(const void* gate, const void* up, int64_t stride, int64_t m, int64_t k, void* values,
                       float* scales, int64_t scale_ld, void* stream, ScaleMode mode) {
  FP8PROJ_CHECK(m >= 0, "m must be >= 0, got ", m);
  FP8PROJ_CHECK(k > 0 && k % 128 == 0, "k=", k, " must be a positive multiple of 128 (1x128 groups)");
  FP8PROJ_CHECK(stride >= k && stride % 8 == 0, "stride=", stride, " must be >= k=", k,
                " and a multiple of 8 elements (16-byte rows)");
  check_scale_ld(scale_ld, m);
  if (m == 0) return;
  check_gpu("silu_mul_quantize");
  check_device_pointer(gate, "gate");
  check_device_pointer(up, "up");
  check_device_pointer(values, "values");
  check_device_pointer(scales, "scales");
  quant_ops(MemorySpace::device)
      .silu_mul_quantize(static_cast<const bf16*>(gate), static_cast<const bf16*>(up), stride, m, k,
                         Fp8ActivationOut{static_cast<uint8_t*>(values), scales, m, k, scale_ld}, mode, stream);
}

void quantize_weight(const void* w, int64_t n, int64_t k, void* values, float* scales, void* stream,
                     ScaleMode mode = ScaleMode::ue8m0) {
  FP8PROJ_CHECK(n > 0 && k > 0, "weight shape ", n, "x", k, " must be positive");
  check_gpu("quantize_weight");
  check_device_pointer(w, "w");
  check_device_pointer(values, "values");
  check_device_pointer(scales, "scales");
  quant_ops(MemorySpace::device)
      .quantize_weight(static_cast<const bf16*>(w), n, k, Fp8WeightOut{static_cast<uint8_t*>(values), scales, n, k},
                       mode, stream);
}

fp8proj_projection_options default_projection_options() {
  fp8proj_projection_options o{};
  o.name = nullptr;
  o.enabled = 0;
  o.policy = nullptr;
  o.threshold = -1;
  o.decode_ceiling = -1;
  o.max_tokens = 0;
  o.rmsnorm_input = 0;
  o.apply_env = 1;
  o.fp8_backend = nullptr;
  o.workspace = nullptr;
  return o;
}

void projection_create(const void* weight, int64_t n, int64_t k, const fp8proj_projection_options* options,
                       fp8proj_projection** out, ScaleMode weight_scales = ScaleMode::ue8m0) {
  FP8PROJ_CHECK(out != nullptr, "out (the handle's address) is null");
  *out = nullptr;
  check_context_alive();
  const fp8proj_projection_options o = options ? *options : default_projection_options();
  ProjectionOptions po;
  if (o.name && *o.name) po.name = o.name;
  FP8PROJ_CHECK(n > 0 && k > 0, po.name, ": weight shape ", n, "x", k, " must be positive");
  po.fp8 = o.enabled != 0;
  const std::string policy = o.policy && *o.policy ? o.policy : "prefill";
  FP8PROJ_CHECK(policy == "prefill" || policy == "all", po.name, ": policy must be \"prefill\" or \"all\", got \"",
                policy, "\"");
  po.policy = policy == "all" ? Fp8Policy::all : Fp8Policy::prefill;
  if (o.threshold >= 0) po.threshold = o.threshold;
  if (o.decode_ceiling >= 0) po.decode_ceiling = o.decode_ceiling;
  if (o.max_tokens > 0) po.max_tokens = o.max_tokens;
  po.rmsnorm_input = o.rmsnorm_input != 0;
  po.apply_env = o.apply_env != 0;
  if (o.fp8_backend && *o.fp8_backend) po.fp8_backend = o.fp8_backend;
  po.weight_scales = weight_scales;  // FP8PROJ_WEIGHT_SCALES overrides it under apply_env
  if (o.workspace) {
    FP8PROJ_CHECK(o.workspace->ws != nullptr, po.name, ": workspace handle is empty");
    po.workspace = o.workspace->ws;
    po.max_tokens = po.workspace->max_tokens();
  }
  check_gpu(po.name.c_str());
  check_device_pointer(weight, "weight");
  auto p = std::make_unique<fp8proj_projection>();
  p->layer = std::make_unique<ProjectionLayer>(MemorySpace::device, static_cast<const bf16*>(weight), n, k, po);
  {
    ProjectionRegistry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    p->id = r.next_id++;
    r.live.emplace(p->id, p.get());
  }
  *out = p.release();
}

ProjectionLayer& layer_of(fp8proj_projection* p) {
  FP8PROJ_CHECK(p != nullptr && p->layer, "projection handle is null");
  return *p->layer;
}
const ProjectionLayer& layer_of(const fp8proj_projection* p) {
  FP8PROJ_CHECK(p != nullptr && p->layer, "projection handle is null");
  return *p->layer;
}

void projection_forward(fp8proj_projection* p, const void* x, int64_t m, void* y, void* stream) {
  ProjectionLayer& l = layer_of(p);
  FP8PROJ_CHECK(m >= 0, l.name(), ": m must be >= 0, got ", m);
  if (m == 0) return;
  check_device_pointer(x, "x");
  check_device_pointer(y, "y");
  l.forward(static_cast<const bf16*>(x), m, static_cast<bf16*>(y), stream);
}

void projection_forward_rmsnorm(fp8proj_projection* p, const void* x, int64_t x_stride, const void* norm_weight,
                                float eps, int64_t m, void* y, void* stream) {
  ProjectionLayer& l = layer_of(p);
  FP8PROJ_CHECK(m >= 0, l.name(), ": m must be >= 0, got ", m);
  FP8PROJ_CHECK(x_stride >= l.k() && x_stride % 8 == 0, l.name(), ": x_stride=", x_stride, " must be >= K=", l.k(),
                " and a multiple of 8 elements");
  FP8PROJ_CHECK(eps >= 0.0f, l.name(), ": eps must be >= 0, got ", eps);
  if (m == 0) return;
  check_device_pointer(x, "x");
  check_device_pointer(norm_weight, "norm_weight");
  check_device_pointer(y, "y");
  l.forward_rmsnorm(static_cast<const bf16*>(x), x_stride, static_cast<const bf16*>(norm_weight), eps, m,
                    static_cast<bf16*>(y), stream);
}

void write_string(const std::string& s, char* buf, size_t size) {
  FP8PROJ_CHECK(buf != nullptr && size > 0, "buf is null or size is 0");
  const size_t len = std::min(s.size(), size - 1);
  std::memcpy(buf, s.data(), len);
  buf[len] = '\0';
}

}  // namespace
}  // namespace fp8proj

extern "C" {

int fp8proj_quantize_activation(const void* x, int64_t x_stride, int64_t m, int64_t k, void* values, float* scales,
                                int64_t scale_ld, void* stream) {
  return fp8proj::guarded_gpu(
      [&] { fp8proj::quantize_activation(x, x_stride, m, k, values, scales, scale_ld, stream); });
}

int fp8proj_rmsnorm_quantize(const void* x, int64_t x_stride, const void* weight, float eps, int64_t m, int64_t k,
                             void* values, float* scales, int64_t scale_ld, void* stream) {
  return fp8proj::guarded_gpu(
      [&] { fp8proj::rmsnorm_quantize(x, x_stride, weight, eps, m, k, values, scales, scale_ld, stream); });
}

int fp8proj_quantize_weight(const void* w, int64_t n, int64_t k, void* values, float* scales, void* stream) {
  return fp8proj::guarded_gpu([&] { fp8proj::quantize_weight(w, n, k, values, scales, stream); });
}

int fp8proj_quantize_activation_scaled(const void* x, int64_t x_stride, int64_t m, int64_t k, int scale_format,
                                       void* values, float* scales, int64_t scale_ld, void* stream) {
  return fp8proj::guarded_gpu([&] {
    const fp8proj::ScaleMode mode = fp8proj::scale_mode_of(scale_format, "scale_format");
    fp8proj::quantize_activation(x, x_stride, m, k, values, scales, scale_ld, stream, mode);
  });
}

int fp8proj_rmsnorm_quantize_scaled(const void* x, int64_t x_stride, const void* weight, float eps, int64_t m,
                                    int64_t k, int scale_format, void* values, float* scales, int64_t scale_ld,
                                    void* stream) {
  return fp8proj::guarded_gpu([&] {
    const fp8proj::ScaleMode mode = fp8proj::scale_mode_of(scale_format, "scale_format");
    fp8proj::rmsnorm_quantize(x, x_stride, weight, eps, m, k, values, scales, scale_ld, stream, mode);
  });
}

int fp8proj_silu_mul_quantize(const void* gate, const void* up, int64_t stride, int64_t m, int64_t k,
                              int scale_format, void* values, float* scales, int64_t scale_ld, void* stream) {
  return fp8proj::guarded_gpu([&] {
    const fp8proj::ScaleMode mode = fp8proj::scale_mode_of(scale_format, "scale_format");
    fp8proj::silu_mul_quantize(gate, up, stride, m, k, values, scales, scale_ld, stream, mode);
  });
}

int fp8proj_quantize_weight_scaled(const void* w, int64_t n, int64_t k, int scale_format, void* values, float* scales,
                                   void* stream) {
  return fp8proj::guarded_gpu([&] {
    const fp8proj::ScaleMode mode = fp8proj::scale_mode_of(scale_format, "scale_format");
    fp8proj::quantize_weight(w, n, k, values, scales, stream, mode);
  });
}

int fp8proj_workspace_create(int64_t max_tokens, int64_t max_k, int with_bf16_rows, fp8proj_workspace** out) {
  return fp8proj::guarded([&] {
    FP8PROJ_CHECK(out != nullptr, "out (the handle's address) is null");
    *out = nullptr;
    fp8proj::check_context_alive();
    FP8PROJ_CHECK(max_tokens > 0 && max_tokens % 4 == 0, "max_tokens must be a positive multiple of 4, got ",
                  max_tokens);
    FP8PROJ_CHECK(max_k > 0 && max_k % 128 == 0, "max_k must be a positive multiple of 128, got ", max_k);
    fp8proj::check_gpu("workspace");
    auto w = std::make_unique<fp8proj_workspace>();
    w->ws = std::make_shared<fp8proj::ActivationWorkspace>(fp8proj::MemorySpace::device, max_tokens, max_k,
                                                           with_bf16_rows != 0);
    *out = w.release();
  });
}

int fp8proj_workspace_bytes(const fp8proj_workspace* ws, size_t* bytes) {
  return fp8proj::guarded([&] {
    FP8PROJ_CHECK(ws != nullptr && ws->ws, "workspace handle is null");
    FP8PROJ_CHECK(bytes != nullptr, "bytes is null");
    *bytes = ws->ws->bytes();
  });
}

void fp8proj_workspace_destroy(fp8proj_workspace* ws) { delete ws; }

int fp8proj_projection_options_init(fp8proj_projection_options* options) {
  return fp8proj::guarded([&] {
    FP8PROJ_CHECK(options != nullptr, "options is null");
    *options = fp8proj::default_projection_options();
  });
}

int fp8proj_projection_create(const void* weight, int64_t n, int64_t k, const fp8proj_projection_options* options,
                              fp8proj_projection** out) {
  return fp8proj::guarded([&] { fp8proj::projection_create(weight, n, k, options, out); });
}

int fp8proj_projection_create_scaled(const void* weight, int64_t n, int64_t k,
                                     const fp8proj_projection_options* options, int weight_scales,
                                     fp8proj_projection** out) {
  return fp8proj::guarded([&] {
    if (out) *out = nullptr;
    const fp8proj::ScaleMode mode = fp8proj::scale_mode_of(weight_scales, "weight_scales");
    fp8proj::projection_create(weight, n, k, options, out, mode);
  });
}

int fp8proj_projection_weight_scales(const fp8proj_projection* proj, int* weight_scales) {
  return fp8proj::guarded([&] {
    const fp8proj::ProjectionLayer& l = fp8proj::layer_of(proj);
    FP8PROJ_CHECK(weight_scales != nullptr, "weight_scales is null");
    *weight_scales = l.options().weight_scales == fp8proj::ScaleMode::ue8m0 ? FP8PROJ_SCALES_UE8M0 : FP8PROJ_SCALES_FLOAT;
  });
}

int fp8proj_projection_forward(fp8proj_projection* proj, const void* x, int64_t m, void* y, void* stream) {
  return fp8proj::guarded_gpu([&] { fp8proj::projection_forward(proj, x, m, y, stream); });
}

int fp8proj_projection_forward_rmsnorm(fp8proj_projection* proj, const void* x, int64_t x_stride,
                                       const void* norm_weight, float eps, int64_t m, void* y, void* stream) {
  return fp8proj::guarded_gpu(
      [&] { fp8proj::projection_forward_rmsnorm(proj, x, x_stride, norm_weight, eps, m, y, stream); });
}

int fp8proj_projection_path(const fp8proj_projection* proj, int64_t m, int* path) {
  return fp8proj::guarded([&] {
    const fp8proj::ProjectionLayer& l = fp8proj::layer_of(proj);
    FP8PROJ_CHECK(path != nullptr, "path is null");
    FP8PROJ_CHECK(m >= 0, l.name(), ": m must be >= 0, got ", m);
    *path = static_cast<int>(l.path_for(m));
  });
}

int fp8proj_projection_explain(const fp8proj_projection* proj, int64_t m, char* buf, size_t size) {
  return fp8proj::guarded([&] {
    const fp8proj::ProjectionLayer& l = fp8proj::layer_of(proj);
    FP8PROJ_CHECK(m >= 0, l.name(), ": m must be >= 0, got ", m);
    fp8proj::write_string(l.explain(m).to_string(), buf, size);
  });
}

namespace fp8proj {
namespace {
InputLayout call_input(const ProjectionLayer& l, int input) {
  FP8PROJ_CHECK(input == 0 || input == 1, l.name(), ": input must be 0 (forward) or 1 (forward_rmsnorm), got ", input);
  return input == 1 ? InputLayout::bf16_rmsnorm : InputLayout::bf16_rows;
}
}  // namespace
}  // namespace fp8proj

int fp8proj_projection_path_input(const fp8proj_projection* proj, int64_t m, int input, int* path) {
  return fp8proj::guarded([&] {
    const fp8proj::ProjectionLayer& l = fp8proj::layer_of(proj);
    FP8PROJ_CHECK(path != nullptr, "path is null");
    FP8PROJ_CHECK(m >= 0, l.name(), ": m must be >= 0, got ", m);
    *path = static_cast<int>(l.path_for(m, fp8proj::call_input(l, input)));
  });
}

int fp8proj_projection_explain_input(const fp8proj_projection* proj, int64_t m, int input, char* buf, size_t size) {
  return fp8proj::guarded([&] {
    const fp8proj::ProjectionLayer& l = fp8proj::layer_of(proj);
    FP8PROJ_CHECK(m >= 0, l.name(), ": m must be >= 0, got ", m);
    fp8proj::write_string(l.explain(m, fp8proj::call_input(l, input)).to_string(), buf, size);
  });
}

int fp8proj_projection_memory(const fp8proj_projection* proj, size_t* bf16_weight, size_t* fp8_values,
                              size_t* fp8_scales, size_t* workspace) {
  return fp8proj::guarded([&] {
    const fp8proj::ProjectionMemory mem = fp8proj::layer_of(proj).memory();
    if (bf16_weight) *bf16_weight = mem.bf16_weight;
    if (fp8_values) *fp8_values = mem.fp8_values;
    if (fp8_scales) *fp8_scales = mem.fp8_scales;
    if (workspace) *workspace = mem.workspace;
  });
}

int fp8proj_projection_id(const fp8proj_projection* proj, int64_t* id) {
  return fp8proj::guarded([&] {
    FP8PROJ_CHECK(id != nullptr, "id is null");
    FP8PROJ_CHECK(proj != nullptr && proj->layer, "projection handle is null");
    *id = proj->id;
  });
}

int fp8proj_projection_lookup(int64_t id, fp8proj_projection** out, const void** weight, int64_t* n, int64_t* k) {
  return fp8proj::guarded([&] {
    FP8PROJ_CHECK(out != nullptr, "out is null");
    *out = nullptr;
    fp8proj::ProjectionRegistry& r = fp8proj::registry();
    fp8proj_projection* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(r.mutex);
      auto it = r.live.find(id);
      if (it != r.live.end()) p = it->second;
    }
    FP8PROJ_CHECK(p != nullptr, "projection ", id, " is not live (its owner was destroyed or rebuilt)");
    *out = p;
    if (weight) *weight = p->layer->bf16_weight();
    if (n) *n = p->layer->n();
    if (k) *k = p->layer->k();
  });
}

void fp8proj_projection_destroy(fp8proj_projection* proj) {
  if (!proj) return;
  {
    fp8proj::ProjectionRegistry& r = fp8proj::registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.live.erase(proj->id);
  }
  delete proj;
}

int fp8proj_device_status(int* fp8_ok, char* buf, size_t size) {
  return fp8proj::guarded([&] {
    FP8PROJ_CHECK(fp8_ok != nullptr, "fp8_ok is null");
    *fp8_ok = 0;
    const fp8proj::DeviceInfo& d = fp8proj::current_device();
    std::string text;
    if (!fp8proj::built_with_cuda()) {
      text = "this build of libfp8proj_c has no CUDA (FP8PROJ_CUDA=OFF)";
    } else if (!d.present) {
      text = d.why_absent;
    } else if (!d.is_sm90()) {
      text = "GPU " + d.name + " is " + d.arch() + "; the FP8 kernels are built for sm_90a (Hopper)";
    } else {
      *fp8_ok = 1;
      text = d.name;
    }
    fp8proj::write_string(text, buf, size);
  });
}


int fp8proj_fp8_gemm_create(const void* w_values, const float* w_scales, int64_t n, int64_t k, int64_t max_m,
                            const char* backend, fp8proj_fp8_gemm** out) {
  return fp8proj::guarded([&] { fp8proj::create(w_values, w_scales, n, k, max_m, backend, out); });
}

int fp8proj_fp8_gemm_run(fp8proj_fp8_gemm* gemm, const void* x_values, const float* x_scales, int64_t x_scale_ld,
                         int64_t m, void* y, void* stream) {
  return fp8proj::guarded_gpu([&] { fp8proj::run(gemm, x_values, x_scales, x_scale_ld, m, y, stream); });
}

int fp8proj_fp8_gemm_describe(const fp8proj_fp8_gemm* gemm, int64_t m, char* buf, size_t size) {
  return fp8proj::guarded([&] {
    FP8PROJ_CHECK(gemm != nullptr, "gemm handle is null");
    FP8PROJ_CHECK(buf != nullptr && size > 0, "buf is null or size is 0");
    FP8PROJ_CHECK(m > 0 && m <= gemm->max_m, "m=", m, " is outside [1, max_m=", gemm->max_m, "]");
    const std::string s = std::string(gemm->backend->name()) + ":" + gemm->plan->describe(m);
    const size_t len = std::min(s.size(), size - 1);
    std::memcpy(buf, s.data(), len);
    buf[len] = '\0';
  });
}

int fp8proj_fp8_gemm_workspace_bytes(const fp8proj_fp8_gemm* gemm, size_t* bytes) {
  return fp8proj::guarded([&] {
    FP8PROJ_CHECK(gemm != nullptr && gemm->plan, "gemm handle is null");
    FP8PROJ_CHECK(bytes != nullptr, "bytes is null");
    *bytes = gemm->plan->workspace_bytes();
  });
}

void fp8proj_fp8_gemm_destroy(fp8proj_fp8_gemm* gemm) { delete gemm; }

const char* fp8proj_version_string(void) {
  static const std::string v = fp8proj::fp8proj_version();
  return v.c_str();
}

const char* fp8proj_last_error(void) { return fp8proj::last_error.c_str(); }

const char* fp8proj_device_fault(void) {
  const std::string* fault = fp8proj::device_fault();
  return fault ? fault->c_str() : nullptr;
}

}  // extern "C"
