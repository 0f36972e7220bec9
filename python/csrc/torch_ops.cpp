// CUDA kernels of the fp8proj torch ops, registered through libtorch's stable ABI.
//
// The ops' schemas and fake implementations are defined in Python (python/fp8proj/ops.py); this
// library adds their CUDA implementations as C++ kernels over the C ABI (libfp8proj_c.so), so an
// eager call costs one dispatcher hop and one allocation instead of a Python frame. It uses only
// the stable C shim (aoti_torch_* / torch_*), so one build loads into every torch release from
// the one it was built with (TORCH_TARGET_VERSION) on; where it is absent or does not load,
// ops.py keeps its own Python implementations.
//
// Checks read metadata only (no device memory, no synchronisation): every op can be captured in
// a CUDA graph. Errors throw std::runtime_error, which torch turns into a RuntimeError carrying
// the message.
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/tensor.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "fp8proj/c_api.h"

namespace {

using torch::stable::Tensor;

[[noreturn]] void fail(const char* op, const std::string& msg) {
  throw std::runtime_error(std::string("fp8proj.") + op + ": " + msg);
}
[[noreturn]] void fail_c(const char* op) { fail(op, fp8proj_last_error()); }

// After a sticky CUDA error every op fails at once with the first fault's text (c_api.h), before
// it allocates or looks at its arguments: one call into libfp8proj_c, an atomic load there.
void check_device(const char* op) {
  if (const char* fault = fp8proj_device_fault()) [[unlikely]]
    fail(op, std::string("the CUDA context is unusable after an earlier error: ") + fault + "; restart the process");
}

// The message is built only when the check fails: a passing call allocates nothing here.
#define OP_CHECK(cond, op, msg) \
  do {                          \
    if (!(cond)) fail(op, msg); \
  } while (0)

int32_t dtype_bf16() { static const int32_t v = aoti_torch_dtype_bfloat16(); return v; }
int32_t dtype_e4m3() { static const int32_t v = aoti_torch_dtype_float8_e4m3fn(); return v; }
int32_t dtype_f32() { static const int32_t v = aoti_torch_dtype_float32(); return v; }
int32_t device_cuda() { static const int32_t v = aoti_torch_device_type_cuda(); return v; }

int32_t dtype_of(const Tensor& t) {
  int32_t d = 0;
  aoti_torch_get_dtype(t.get(), &d);
  return d;
}

const char* dtype_name(int32_t d) {
  if (d == dtype_bf16()) return "torch.bfloat16";
  if (d == dtype_e4m3()) return "torch.float8_e4m3fn";
  if (d == dtype_f32()) return "torch.float32";
  return "another dtype";
}

void check_tensor(const Tensor& t, const char* op, const char* what, int32_t dtype, bool contiguous = true) {
  const int32_t d = dtype_of(t);
  if (d != dtype) fail(op, std::string(what) + " must be " + dtype_name(dtype) + ", got " + dtype_name(d));
  if (!t.is_cuda()) fail(op, std::string(what) + " is not a CUDA tensor; the fp8proj ops run on CUDA tensors");
  if (contiguous && !t.is_contiguous()) fail(op, std::string(what) + " must be contiguous");
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op, const char* what) {
  if (a.get_device_index() != b.get_device_index())
    fail(op, std::string(what) + " is on cuda:" + std::to_string(b.get_device_index()) + ", x on cuda:" +
                 std::to_string(a.get_device_index()));
}

Tensor empty(std::initializer_list<int64_t> sizes, int32_t dtype, int32_t device_index) {
  std::array<int64_t, 8> sz{}, st{};
  const int64_t nd = static_cast<int64_t>(sizes.size());
  int64_t i = 0;
  for (int64_t s : sizes) sz[i++] = s;
  int64_t stride = 1;
  for (int64_t d = nd - 1; d >= 0; --d) {
    st[d] = stride;
    stride *= sz[d] > 1 ? sz[d] : 1;
  }
  AtenTensorHandle h = nullptr;
  if (aoti_torch_empty_strided(nd, sz.data(), st.data(), dtype, device_cuda(), device_index, &h) != AOTI_TORCH_SUCCESS)
    throw std::runtime_error("fp8proj: could not allocate an output tensor");
  return Tensor(h);
}

Tensor empty_like_rows(const Tensor& x, int64_t last, int32_t dtype) {  // x.shape[:-1] + (last,)
  std::array<int64_t, 8> sz{}, st{};
  const int64_t nd = x.dim();
  OP_CHECK(nd >= 1 && nd <= 8, "op", "x must have 1 to 8 dimensions");
  for (int64_t d = 0; d < nd; ++d) sz[d] = x.size(d);
  sz[nd - 1] = last;
  int64_t stride = 1;
  for (int64_t d = nd - 1; d >= 0; --d) {
    st[d] = stride;
    stride *= sz[d] > 1 ? sz[d] : 1;
  }
  AtenTensorHandle h = nullptr;
  if (aoti_torch_empty_strided(nd, sz.data(), st.data(), dtype, device_cuda(), x.get_device_index(), &h) !=
      AOTI_TORCH_SUCCESS)
    throw std::runtime_error("fp8proj: could not allocate an output tensor");
  return Tensor(h);
}

void* stream_of(int32_t device_index) {
  void* s = nullptr;
  aoti_torch_get_current_cuda_stream(device_index, &s);
  return s;
}

int64_t ceil4(int64_t m) { return (m + 3) / 4 * 4; }

// x[..., K] with unit column stride as rows a fixed stride apart: (m, k, row stride).
std::tuple<int64_t, int64_t, int64_t> rows_of(const Tensor& x, const char* op) {
  const int64_t nd = x.dim();
  OP_CHECK(nd >= 1, op, "x must have at least one dimension");
  const int64_t k = x.size(nd - 1);
  OP_CHECK(x.stride(nd - 1) == 1 || k == 1, op, "x's last dimension must have stride 1");
  int64_t m = 1;
  for (int64_t d = 0; d < nd - 1; ++d) m *= x.size(d);
  if (nd == 1 || m <= 1) return {m, k, k};
  // Leading dimensions must collapse into one row index (x.view(-1, K) succeeds).
  const int64_t row = x.stride(nd - 2);
  int64_t expect = row * x.size(nd - 2);
  for (int64_t d = nd - 3; d >= 0; --d) {
    if (x.size(d) != 1 && x.stride(d) != expect)
      fail(op, "x is not rows of K elements a fixed stride apart; pass x.contiguous() or a 2-D row-strided view");
    expect *= x.size(d);
  }
  return {m, k, row};
}

// The ops' int argument names a live projection (an id, never a pointer): a stale or unknown id
// is an error message, not a wild pointer. `weight` must be the tensor it was made from.
struct Projection {
  fp8proj_projection* handle = nullptr;
  int64_t n = 0, k = 0;
};
Projection projection(int64_t id, const Tensor& weight, const char* op) {
  Projection p;
  const void* w = nullptr;
  if (fp8proj_projection_lookup(id, &p.handle, &w, &p.n, &p.k) != 0) fail_c(op);
  if (weight.data_ptr() != w)
    fail(op, "weight is not the tensor this projection was made from (moved or replaced since); rebuild the module");
  return p;
}

Tensor linear(Tensor x, Tensor weight, int64_t handle) {
  const char* op = "linear";
  check_device(op);
  check_tensor(x, op, "x", dtype_bf16());
  check_tensor(weight, op, "weight", dtype_bf16());
  check_same_device(x, weight, op, "weight");
  const Projection p = projection(handle, weight, op);
  const auto [m, k, stride] = rows_of(x, op);
  (void)stride;
  OP_CHECK(k == p.k, op, "x has K=" + std::to_string(k) + ", the projection has K=" + std::to_string(p.k));
  Tensor y = empty_like_rows(x, p.n, dtype_bf16());
  if (m > 0 && fp8proj_projection_forward(p.handle, x.data_ptr(), m, y.data_ptr(), stream_of(x.get_device_index())) != 0)
    fail_c(op);
  return y;
}

Tensor rmsnorm_linear(Tensor x, Tensor norm_weight, double eps, Tensor weight, int64_t handle) {
  const char* op = "rmsnorm_linear";
  check_device(op);
  check_tensor(x, op, "x", dtype_bf16(), /*contiguous=*/false);
  check_tensor(norm_weight, op, "norm_weight", dtype_bf16());
  check_tensor(weight, op, "weight", dtype_bf16());
  check_same_device(x, norm_weight, op, "norm_weight");
  check_same_device(x, weight, op, "weight");
  const Projection p = projection(handle, weight, op);
  const auto [m, k, stride] = rows_of(x, op);
  OP_CHECK(k == p.k, op, "x has K=" + std::to_string(k) + ", the projection has K=" + std::to_string(p.k));
  OP_CHECK(norm_weight.dim() == 1 && norm_weight.size(0) == k, op,
        "norm_weight must have shape (" + std::to_string(k) + ",)");
  Tensor y = empty_like_rows(x, p.n, dtype_bf16());
  if (m > 0 && fp8proj_projection_forward_rmsnorm(p.handle, x.data_ptr(), stride, norm_weight.data_ptr(),
                                                  static_cast<float>(eps), m, y.data_ptr(),
                                                  stream_of(x.get_device_index())) != 0)
    fail_c(op);
  return y;
}

// The ops' scale_fmt argument: "ue8m0" (the default) or "float" (fp32 amax/448;
// include/fp8proj/formats.hpp), as transformers' FineGrainedFP8Config spells them.
int scale_format_of(const std::string& fmt, const char* op) {
  if (fmt == "ue8m0") return FP8PROJ_SCALES_UE8M0;
  if (fmt == "float") return FP8PROJ_SCALES_FLOAT;
  fail(op, "scale_fmt must be \"ue8m0\" or \"float\", got \"" + fmt + "\"");
}

std::tuple<Tensor, Tensor> quantize_rows(const char* op, const Tensor& x, const Tensor* norm_weight, double eps,
                                         int scale_format = FP8PROJ_SCALES_UE8M0) {
  check_device(op);
  check_tensor(x, op, "x", dtype_bf16(), /*contiguous=*/norm_weight == nullptr);
  const auto [m, k, stride] = rows_of(x, op);
  OP_CHECK(k > 0 && k % 128 == 0, op, "K=" + std::to_string(k) + " must be a positive multiple of 128 (1x128 scale groups)");
  if (norm_weight) {
    check_tensor(*norm_weight, op, "weight", dtype_bf16());
    check_same_device(x, *norm_weight, op, "weight");
    OP_CHECK(norm_weight->dim() == 1 && norm_weight->size(0) == k, op, "weight must have shape (" + std::to_string(k) + ",)");
  }
  const int32_t dev = x.get_device_index();
  Tensor values = empty_like_rows(x, k, dtype_e4m3());
  const int64_t ld = ceil4(m);
  Tensor scales = empty({k / 128, ld}, dtype_f32(), dev);
  if (m == 0) return {values, scales};
  const int rc = norm_weight ? fp8proj_rmsnorm_quantize_scaled(x.data_ptr(), stride, norm_weight->data_ptr(),
                                                               static_cast<float>(eps), m, k, scale_format,
                                                               values.data_ptr(),
                                                               static_cast<float*>(scales.data_ptr()), ld,
                                                               stream_of(dev))
                             : fp8proj_quantize_activation_scaled(x.data_ptr(), k, m, k, scale_format,
                                                                  values.data_ptr(),
                                                                  static_cast<float*>(scales.data_ptr()), ld,
                                                                  stream_of(dev));
  if (rc != 0) fail_c(op);
  return {values, scales};
}

std::tuple<Tensor, Tensor> quantize_activation(Tensor x, std::string scale_fmt) {
  return quantize_rows("quantize_activation", x, nullptr, 0.0, scale_format_of(scale_fmt, "quantize_activation"));
}

std::tuple<Tensor, Tensor> rmsnorm_quantize(Tensor x, Tensor weight, double eps, std::string scale_fmt) {
  return quantize_rows("rmsnorm_quantize", x, &weight, eps, scale_format_of(scale_fmt, "rmsnorm_quantize"));
}

// A gated MLP's down_proj input: quantize_activation(bf16(bf16(silu(gate)) * up)) in one pass;
// gate and up are row views with one row stride (the two halves of one GEMM output, or dense).
std::tuple<Tensor, Tensor> silu_mul_quantize(Tensor gate, Tensor up, std::string scale_fmt) {
  const char* op = "silu_mul_quantize";
  check_device(op);
  const int scale_format = scale_format_of(scale_fmt, op);
  check_tensor(gate, op, "gate", dtype_bf16(), /*contiguous=*/false);
  check_tensor(up, op, "up", dtype_bf16(), /*contiguous=*/false);
  check_same_device(gate, up, op, "up");
  bool same = gate.dim() == up.dim();
  for (int64_t d = 0; same && d < gate.dim(); ++d) same = gate.size(d) == up.size(d);
  OP_CHECK(same, op, "gate and up differ in shape");
  const auto [m, k, stride] = rows_of(gate, op);
  const auto [um, uk, ustride] = rows_of(up, op);
  (void)um, (void)uk;
  OP_CHECK(k > 0 && k % 128 == 0, op, "K=" + std::to_string(k) + " must be a positive multiple of 128 (1x128 scale groups)");
  OP_CHECK(m <= 1 || ustride == stride, op, "gate and up must have one row stride, got " + std::to_string(stride) +
           " and " + std::to_string(ustride) + "; pass .contiguous() copies");
  const int32_t dev = gate.get_device_index();
  Tensor values = empty_like_rows(gate, k, dtype_e4m3());
  const int64_t ld = ceil4(m);
  Tensor scales = empty({k / 128, ld}, dtype_f32(), dev);
  if (m == 0) return {values, scales};
  if (fp8proj_silu_mul_quantize(gate.data_ptr(), up.data_ptr(), stride, m, k, scale_format,
                                values.data_ptr(), static_cast<float*>(scales.data_ptr()), ld, stream_of(dev)) != 0)
    fail_c(op);
  return {values, scales};
}

// The load-time weight quantization (128x128 blocks): the same C call the modules make at
// construction, so a model loader that quantizes through the op pays no Python frame per weight.
std::tuple<Tensor, Tensor> quantize_weight(Tensor w, std::string scale_fmt) {
  const char* op = "quantize_weight";
  check_device(op);
  const int scale_format = scale_format_of(scale_fmt, op);
  check_tensor(w, op, "w", dtype_bf16());
  OP_CHECK(w.dim() == 2, op, "w must be 2-D [N, K], got " + std::to_string(w.dim()) + " dimensions");
  const int64_t n = w.size(0), k = w.size(1);
  const int32_t dev = w.get_device_index();
  Tensor values = empty({n, k}, dtype_e4m3(), dev);
  Tensor scales = empty({(n + 127) / 128, (k + 127) / 128}, dtype_f32(), dev);
  if (n == 0 || k == 0) return {values, scales};
  if (fp8proj_quantize_weight_scaled(w.data_ptr(), n, k, scale_format, values.data_ptr(),
                                     static_cast<float*>(scales.data_ptr()), stream_of(dev)) != 0)
    fail_c(op);
  return {values, scales};
}

// fp8_gemm's plans, one per FP8 weight (values, scales, shape, device), made at the first call
// for that weight (it allocates: not inside a graph capture) for up to max(8192, M) rows.
struct PlanKey {
  const void* wv;
  const void* ws;
  int64_t n, k;
  int32_t device;
  bool operator==(const PlanKey&) const = default;
};
struct PlanKeyHash {
  size_t operator()(const PlanKey& p) const {
    return std::hash<const void*>()(p.wv) ^ (std::hash<const void*>()(p.ws) << 1) ^ std::hash<int64_t>()(p.n * 131 + p.k);
  }
};
struct Plan {
  fp8proj_fp8_gemm* gemm = nullptr;
  int64_t max_m = 0;
};
std::mutex plans_mutex;
std::unordered_map<PlanKey, Plan, PlanKeyHash>& plans() {
  static auto* m = new std::unordered_map<PlanKey, Plan, PlanKeyHash>();  // outlives static destruction
  return *m;
}

std::vector<fp8proj_fp8_gemm*>& retired_plans() {
  static auto* v = new std::vector<fp8proj_fp8_gemm*>();  // kept for the process: see plan_for
  return *v;
}

fp8proj_fp8_gemm* plan_for(const Tensor& wv, const Tensor& ws, int64_t m, int32_t dev) {
  const PlanKey key{wv.data_ptr(), ws.data_ptr(), wv.size(0), wv.size(1), dev};
  std::lock_guard<std::mutex> lock(plans_mutex);
  auto& table = plans();
  auto it = table.find(key);
  if (it != table.end() && it->second.max_m >= m) return it->second.gemm;
  // Making a plan allocates, which a CUDA graph capture refuses: the C ABI then fails with the
  // CUDA error, and the message says to run fp8_gemm once before capturing.
  const int64_t max_m = m > 8192 ? ceil4(m) : 8192;
  fp8proj_fp8_gemm* g = nullptr;
  if (fp8proj_fp8_gemm_create(key.wv, static_cast<const float*>(key.ws), key.n, key.k, max_m, nullptr, &g) != 0)
    fail("fp8_gemm", std::string(fp8proj_last_error()) + " (a plan for a new weight or a larger M is made at the "
                     "first call, outside CUDA graph capture: run fp8_gemm once before capturing)");
  // The smaller plan is retired, not destroyed: a CUDA graph captured with it (a decode step
  // before a longer prefill grew the plan) still launches its kernels on its split-K workspace.
  if (it != table.end()) retired_plans().push_back(it->second.gemm);
  table[key] = Plan{g, max_m};
  return g;
}

Tensor fp8_gemm(Tensor xv, Tensor xs, Tensor wv, Tensor ws) {
  const char* op = "fp8_gemm";
  check_device(op);
  check_tensor(xv, op, "xv", dtype_e4m3());
  check_tensor(xs, op, "xs", dtype_f32());
  check_tensor(wv, op, "wv", dtype_e4m3());
  check_tensor(ws, op, "ws", dtype_f32());
  check_same_device(xv, xs, op, "xs");
  check_same_device(xv, wv, op, "wv");
  check_same_device(xv, ws, op, "ws");
  OP_CHECK(xv.dim() == 2 && xs.dim() == 2 && wv.dim() == 2 && ws.dim() == 2, op,
        "xv [M, K], xs [K/128, ld], wv [N, K] and ws [ceil(N/128), K/128] must be 2-D");
  const int64_t m = xv.size(0), k = xv.size(1), n = wv.size(0);
  OP_CHECK(wv.size(1) == k, op, "xv has K=" + std::to_string(k) + ", wv has K=" + std::to_string(wv.size(1)));
  OP_CHECK(xs.size(0) == (k + 127) / 128 && xs.size(1) >= m && xs.size(1) % 4 == 0, op,
        "xs must be [K/128, ld >= M, ld a multiple of 4]");
  OP_CHECK(ws.size(0) == (n + 127) / 128 && ws.size(1) == (k + 127) / 128, op, "ws must be [ceil(N/128), ceil(K/128)]");
  const int32_t dev = xv.get_device_index();
  Tensor y = empty({m, n}, dtype_bf16(), dev);
  if (m == 0) return y;
  fp8proj_fp8_gemm* g = plan_for(wv, ws, m, dev);
  if (fp8proj_fp8_gemm_run(g, xv.data_ptr(), static_cast<const float*>(xs.data_ptr()), xs.size(1), m, y.data_ptr(),
                           stream_of(dev)) != 0)
    fail_c(op);
  return y;
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(fp8proj, CUDA, m) {
  m.impl("linear", TORCH_BOX(&linear));
  m.impl("rmsnorm_linear", TORCH_BOX(&rmsnorm_linear));
  m.impl("quantize_activation", TORCH_BOX(&quantize_activation));
  m.impl("rmsnorm_quantize", TORCH_BOX(&rmsnorm_quantize));
  m.impl("silu_mul_quantize", TORCH_BOX(&silu_mul_quantize));
  m.impl("quantize_weight", TORCH_BOX(&quantize_weight));
  m.impl("fp8_gemm", TORCH_BOX(&fp8_gemm));
}
