// GEMM backends behind one small interface:   D[M, N] (bf16) = A[M, K] . B[N, K]^T
//
// A backend is stateless and describes what it can do; a plan binds it to one weight
// (B) and owns everything a call needs (workspaces, cached algorithms, per-M tile choices),
// all made at construction. Plan::run neither allocates nor synchronises, so it can be
// captured in a CUDA graph. Which backend and configuration a projection runs per call is the
// selection's business (selection.hpp); `fp8proj tune`'s hooks are in tuner.hpp (ConfigSpace).
//
// Backends (name, kind, space):
//   cpu_reference       bf16 + fp8_block   host    the oracle (dequantize, then BLAS sgemm)
//   cublaslt_bf16       bf16               device  baseline and decode path
//   cublaslt_fp8_block  fp8_block          device  cuBLASLt VEC128 x BLK128x128 scaling
//   sm90_fp8_block      fp8_block          device  our TMA + WGMMA kernel (sm_90a)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fp8proj/bf16.hpp"
#include "fp8proj/gemm_config.hpp"
#include "fp8proj/tensor.hpp"

namespace fp8proj {

enum class GemmKind : uint8_t { bf16, fp8_block };

// The shapes the block-scaled FP8 path takes: the one eligibility rule of the layer, the sm90
// backend, the MLA block, tensor parallelism and the tuner.
//   K % 128 == 0: 1x128 activation groups and whole 128-wide weight blocks along K.
//   N % 16 == 0: the last 128-row weight block may be partial (its scale covers the rows that
//     exist; fused_qkv_a's 2624 / 2112 rows, kv_a's 576); 16 keeps the bf16 output rows a
//     multiple of 16 bytes twice over (TMA needs N % 8) and every tile's last column chunk whole.
inline constexpr int64_t kFp8ColumnMultiple = 128;    // K
inline constexpr int64_t kFp8WeightRowMultiple = 16;  // N
constexpr bool fp8_eligible(int64_t n, int64_t k) {
  return n > 0 && k > 0 && n % kFp8WeightRowMultiple == 0 && k % kFp8ColumnMultiple == 0;
}
// "" when fp8_eligible(n, k), else why not.
inline std::string fp8_block_shape_reason(int64_t n, int64_t k) {
  if (n <= 0 || k <= 0) return "N and K must be positive, got N=" + std::to_string(n) + " K=" + std::to_string(k);
  if (k % kFp8ColumnMultiple != 0) return "K=" + std::to_string(k) + " is not a multiple of 128 (1x128 activation groups)";
  if (n % kFp8WeightRowMultiple != 0)
    return "N=" + std::to_string(n) + " is not a multiple of 16 (16-byte output rows, whole column chunks)";
  return "";
}

struct GemmPlanOptions {
  int64_t max_m = 32768;  // workspaces are sized for this many rows
  // Tuned configurations: (largest M of the bucket, configuration), sorted by M. An M is
  // covered by the first entry with M <= its bound. The plan checks at construction that each
  // is one of its backend's, and sizes its workspace so that run_with() can run the covering
  // configuration at every M it covers; run() runs it where it can (the heuristic elsewhere).
  std::vector<std::pair<int64_t, GemmConfig>> configs_by_m;
  // The same by name (what the C ABI passes), parsed once when the plan is built; used when
  // configs_by_m is empty. "" = the backend's heuristic.
  std::vector<std::pair<int64_t, std::string>> config_by_m;
};

class Bf16GemmPlan {
 public:
  virtual ~Bf16GemmPlan() = default;
  // y[m, n] = x[m, k] . w[n, k]^T; m <= max_m.
  virtual void run(const bf16* x, int64_t m, bf16* y, StreamHandle stream) = 0;
  virtual std::string describe(int64_t m) const = 0;
};

class Fp8GemmPlan {
 public:
  virtual ~Fp8GemmPlan() = default;
  // y[m, n] = dequant(x)[m, k] . dequant(w)[n, k]^T; x.m <= max_m. Runs the configuration
  // GemmPlanOptions names for x.m where it can, else the backend's heuristic.
  virtual void run(const Fp8ActivationView& x, bf16* y, StreamHandle stream) = 0;
  // The same with exactly `config` (HeuristicConfig: heuristic_config(x.m)): what the
  // selection passes. A named configuration must be one can_run() accepts for x.m.
  virtual void run_with(const Fp8ActivationView& x, bf16* y, const GemmConfig& config, StreamHandle stream) {
    (void)config;
    run(x, y, stream);
  }
  // The backend's own configuration for m rows: HeuristicConfig when it has none to name
  // (cuBLASLt and the reference choose internally). Cheap and allocation-free once a plan has
  // seen m (sm90: precomputed for decode-sized M).
  virtual GemmConfig heuristic_config(int64_t m) const {
    (void)m;
    return HeuristicConfig{};
  }
  // Whether `config` names a configuration this plan can run with m rows (never for
  // HeuristicConfig). Allocation-free.
  virtual bool can_run(const GemmConfig& config, int64_t m) const {
    (void)config, (void)m;
    return false;
  }
  virtual std::string describe(int64_t m) const = 0;
  // Bytes of device (or host) memory the plan owns beyond the weight.
  virtual size_t workspace_bytes() const { return 0; }
};

class GemmBackend {
 public:
  virtual ~GemmBackend() = default;
  virtual std::string_view name() const = 0;
  virtual GemmKind kind() const = 0;
  virtual MemorySpace space() const = 0;
  // Empty when the backend can run a weight of this shape; otherwise the reason.
  virtual std::string unsupported_reason(int64_t n, int64_t k) const = 0;

  virtual std::unique_ptr<Bf16GemmPlan> plan_bf16(const bf16* w, int64_t n, int64_t k,
                                                  const GemmPlanOptions& options) const;
  virtual std::unique_ptr<Fp8GemmPlan> plan_fp8(const Fp8WeightView& w,
                                                const GemmPlanOptions& options) const;
};

// Every backend usable in this process (built in, and its device present and capable).
std::vector<const GemmBackend*> available_backends();
// Every backend this build knows, with the reason it is unusable ("" when usable).
std::vector<std::pair<std::string, std::string>> backend_status();
// nullptr if no usable backend has that name.
const GemmBackend* find_backend(std::string_view name);
// The same for one kind: cpu_reference is the name of a bf16 and an FP8 backend.
const GemmBackend* find_backend(std::string_view name, GemmKind kind);
// The default backend of a kind for a memory space and weight shape ("auto"), or nullptr.
const GemmBackend* default_backend(GemmKind kind, MemorySpace space, int64_t n, int64_t k);
// The backend a caller names for a kind, memory space and weight shape: "auto" is
// default_backend; any other name must be registered, usable in this process, of this kind
// and memory space, and able to run n x k. Otherwise throws fp8proj::Error saying which of
// these fails (an unknown name lists the known ones), prefixed with `who` when not empty.
const GemmBackend& resolve_backend(std::string_view name, GemmKind kind, MemorySpace space, int64_t n, int64_t k,
                                   std::string_view who = {});

// Argument checks shared by all plans; throw fp8proj::Error naming the bad argument.
void check_gemm_bf16_args(const bf16* x, int64_t m, int64_t k_expected, const bf16* y,
                          int64_t max_m);
void check_gemm_fp8_args(const Fp8ActivationView& x, int64_t k_expected, const bf16* y,
                         int64_t max_m);

}  // namespace fp8proj
