#include <string>

#include "fp8proj/error.hpp"
#include "fp8proj/gemm.hpp"
#include "gemm/backends.hpp"

namespace fp8proj {

std::unique_ptr<Bf16GemmPlan> GemmBackend::plan_bf16(const bf16*, int64_t, int64_t, const GemmPlanOptions&) const {
  FP8PROJ_FAIL("backend ", name(), " has no bf16 GEMM");
}
std::unique_ptr<Fp8GemmPlan> GemmBackend::plan_fp8(const Fp8WeightView&, const GemmPlanOptions&) const {
  FP8PROJ_FAIL("backend ", name(), " has no block-scaled FP8 GEMM");
}

std::vector<std::pair<std::string, std::string>> backend_status() {
  std::vector<std::pair<std::string, std::string>> out = {{"cpu_reference", ""}};
#if FP8PROJ_WITH_CUDA
  for (const auto& [backend, why] : cuda_backends()) out.emplace_back(std::string(backend->name()), why);
#else
  for (const char* name : kDeviceBackendNames) out.emplace_back(name, "this build has no CUDA (FP8PROJ_CUDA=OFF)");
#endif
  return out;
}

std::vector<const GemmBackend*> available_backends() {
  std::vector<const GemmBackend*> out = {&cpu_reference_backend(GemmKind::bf16),
                                         &cpu_reference_backend(GemmKind::fp8_block)};
#if FP8PROJ_WITH_CUDA
  for (const auto& [backend, why] : cuda_backends())
    if (why.empty()) out.push_back(backend);
#endif
  return out;
}

const GemmBackend* find_backend(std::string_view name) {
  for (const GemmBackend* b : available_backends())
    if (b->name() == name) return b;
  return nullptr;
}

const GemmBackend* find_backend(std::string_view name, GemmKind kind) {
  for (const GemmBackend* b : available_backends())
    if (b->name() == name && b->kind() == kind) return b;
  return nullptr;
}

const GemmBackend& resolve_backend(std::string_view name, GemmKind kind, MemorySpace space, int64_t n, int64_t k,
                                   std::string_view who) {
  const std::string pre = who.empty() ? std::string() : std::string(who) + ": ";
  const char* kind_name = kind == GemmKind::bf16 ? "bf16" : "FP8";
  const char* space_name = space == MemorySpace::host ? "the host" : "the device";
  if (name == "auto") {
    const GemmBackend* b = default_backend(kind, space, n, k);
    FP8PROJ_CHECK(b != nullptr, pre, "no ", kind_name, " backend can run ", n, "x", k, " on ", space_name);
    return *b;
  }
  if (const GemmBackend* b = find_backend(name, kind)) {
    FP8PROJ_CHECK(b->space() == space, pre, kind_name, " backend '", name, "' runs on ",
                  b->space() == MemorySpace::host ? "the host" : "the device", ", not on ", space_name);
    const std::string why = b->unsupported_reason(n, k);
    FP8PROJ_CHECK(why.empty(), pre, kind_name, " backend '", name, "' cannot run ", n, "x", k, ": ", why);
    return *b;
  }
  std::string known;
  for (const auto& [nm, reason] : backend_status()) {
    if (nm == name)
      FP8PROJ_FAIL(pre, kind_name, " backend '", name, "' is unusable: ",
                   reason.empty() ? std::string("it is not a ") + (kind == GemmKind::bf16 ? "bf16" : "block-scaled FP8") +
                                        " backend"
                                  : reason);
    known += (known.empty() ? "" : ", ") + nm;
  }
  FP8PROJ_FAIL(pre, "unknown ", kind_name, " backend '", name, "' (known: ", known, ")");
}

const GemmBackend* default_backend(GemmKind kind, MemorySpace space, int64_t n, int64_t k) {
  if (space == MemorySpace::host) return &cpu_reference_backend(kind);
  // Device preference: our kernel first, cuBLASLt's blockwise path as the fallback.
  const char* order_fp8[] = {"sm90_fp8_block", "cublaslt_fp8_block"};
  const char* order_bf16[] = {"cublaslt_bf16"};
  auto try_names = [&](auto& names) -> const GemmBackend* {
    for (const char* nm : names)
      if (const GemmBackend* b = find_backend(nm); b && b->kind() == kind && b->unsupported_reason(n, k).empty())
        return b;
    return nullptr;
  };
  return kind == GemmKind::fp8_block ? try_names(order_fp8) : try_names(order_bf16);
}

void check_gemm_bf16_args(const bf16* x, int64_t m, int64_t k_expected, const bf16* y, int64_t max_m) {
  FP8PROJ_CHECK(m >= 0, "GEMM rows M must be >= 0, got ", m);
  FP8PROJ_CHECK(m <= max_m, "GEMM rows M=", m, " exceed the plan's max_m=", max_m);
  if (m == 0) return;
  FP8PROJ_CHECK(x != nullptr && y != nullptr, "GEMM input or output pointer is null (M=", m, " K=", k_expected, ")");
}

void check_gemm_fp8_args(const Fp8ActivationView& x, int64_t k_expected, const bf16* y, int64_t max_m) {
  FP8PROJ_CHECK(x.m >= 0, "GEMM rows M must be >= 0, got ", x.m);
  FP8PROJ_CHECK(x.m <= max_m, "GEMM rows M=", x.m, " exceed the plan's max_m=", max_m);
  FP8PROJ_CHECK(x.k == k_expected, "FP8 activation has K=", x.k, " but the weight has K=", k_expected);
  FP8PROJ_CHECK(x.scale_ld >= activation_scale_ld(x.m) && x.scale_ld % 4 == 0, "activation scale stride ",
                x.scale_ld, " must be a multiple of 4 and >= round_up(M=", x.m, ", 4)");
  if (x.m == 0) return;
  FP8PROJ_CHECK(x.values && x.scales && y, "FP8 GEMM input values, scales or output pointer is null");
}

}  // namespace fp8proj
