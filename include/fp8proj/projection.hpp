// The gated projection layer: y[M, N] = x[M, K] . W[N, K]^T.
//
// Holds the bf16 weight (always; not copied, it must outlive the layer) and, when FP8 is
// enabled and the layer is eligible (fp8_eligible: N, K multiples of 128) and the device can
// run an FP8 backend, a private FP8 copy (e4m3 + 128x128 scales) made at construction in the
// memory space of the weight. Each call picks its path, backend and configuration by M through
// the selection (selection.hpp): bf16 for decode-sized batches, FP8 for prefill -- explain(M)
// says which and why.
//
// forward() neither allocates nor synchronises: workspaces are sized at construction for
// `max_tokens` rows (larger M runs in chunks of that size), so calls can be captured in a
// CUDA graph. All pointers live in the layer's memory space; device pointers must be
// 16-byte aligned.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "fp8proj/bf16.hpp"
#include "fp8proj/formats.hpp"
#include "fp8proj/selection.hpp"
#include "fp8proj/tensor.hpp"
#include "fp8proj/tune.hpp"

namespace fp8proj {

// Activation scratch that several layers may share (calls on one stream are ordered).
class ActivationWorkspace {
 public:
  ActivationWorkspace(MemorySpace space, int64_t max_tokens, int64_t max_k, bool with_bf16_rows);
  ~ActivationWorkspace();

  MemorySpace space() const;
  int64_t max_tokens() const;
  int64_t max_k() const;
  bool has_bf16_rows() const;
  size_t bytes() const;
  // Quantized activations for m <= max_tokens rows of k <= max_k columns.
  Fp8ActivationOut fp8(int64_t m, int64_t k) const;
  bf16* bf16_rows() const;  // [max_tokens, max_k], nullptr unless with_bf16_rows

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct ProjectionOptions {
  std::string name = "projection";  // shown in logs and explain(), e.g. "layers.0.q_b_proj"
  bool fp8 = false;                 // opt-in (FP8PROJ_PREFILL_FP8)
  Fp8Policy policy = Fp8Policy::prefill;
  std::optional<int64_t> threshold;  // FP8 when M > threshold; overrides the tuned table
  int64_t decode_ceiling = kDefaultDecodeCeiling;
  int64_t max_tokens = 8192;         // workspace rows; larger M runs in chunks
  bool rmsnorm_input = false;        // size the workspace for forward_rmsnorm()
  std::string bf16_backend = "auto";
  std::string fp8_backend = "auto";  // "auto" | backend name (FP8PROJ_FP8_BACKEND)
  // Scale format of the private FP8 copy (formats.hpp): UE8M0 powers of two or fp32 amax/448
  // (FP8PROJ_WEIGHT_SCALES=ue8m0|float). The GEMM takes either; activations stay UE8M0.
  ScaleMode weight_scales = ScaleMode::ue8m0;
  bool use_tune_table = true;        // look up (N, K) in the tuned table for this GPU
  std::optional<TunedShape> tuned;   // explicit table row (takes precedence over lookup)
  std::shared_ptr<ActivationWorkspace> workspace;  // shared scratch; made if null
  bool apply_env = true;             // FP8PROJ_* knobs override these options

  // These options with the FP8PROJ_* environment knobs applied on top.
  ProjectionOptions with_env() const;
};

struct Explanation {
  int64_t m = 0;
  Path path = Path::bf16;
  std::string backend;  // backend that runs ("" for Path::none)
  std::string config;   // its plan's description for this M
  std::string reason;   // why this path
  std::string to_string() const;
};

struct ProjectionMemory {
  size_t bf16_weight = 0;   // held by the caller, counted for the ratio
  size_t fp8_values = 0;
  size_t fp8_scales = 0;
  size_t workspace = 0;     // activation scratch (0 if shared and owned elsewhere) + plans
  double fp8_overhead() const {  // extra bytes of the FP8 copy relative to the bf16 weight
    return bf16_weight ? double(fp8_values + fp8_scales) / double(bf16_weight) : 0.0;
  }
};

class ProjectionLayer {
 public:
  ProjectionLayer(MemorySpace space, const bf16* weight, int64_t n, int64_t k,
                  ProjectionOptions options = {});
  ~ProjectionLayer();
  ProjectionLayer(ProjectionLayer&&) noexcept;
  ProjectionLayer& operator=(ProjectionLayer&&) noexcept;

  // y = x . W^T. M = 0 is a no-op.
  void forward(const bf16* x, int64_t m, bf16* y, StreamHandle stream = nullptr);
  // y = rmsnorm(x) . W^T. On the FP8 path the norm and the quantization are one pass. Row r of
  // x starts at x + r * x_stride (x_stride >= K; on the device a multiple of 8), so x can be a
  // view into wider rows, e.g. the q_a columns of fused_qkv_a's output.
  void forward_rmsnorm(const bf16* x, int64_t x_stride, const bf16* norm_weight, float eps, int64_t m, bf16* y,
                       StreamHandle stream = nullptr);
  // y = dequant(x) . W^T for activations quantized by the caller (e.g. in its own epilogue).
  // Requires has_fp8_copy().
  void forward_quantized(const Fp8ActivationView& x, bf16* y, StreamHandle stream = nullptr);

  // The path and its reasons for a call of M rows through forward() (bf16_rows) or, with
  // InputLayout::bf16_rmsnorm, through forward_rmsnorm().
  Path path_for(int64_t m, InputLayout input = InputLayout::bf16_rows) const;
  // The selection's typed choice for a problem (p.n, p.k: the layer's); explain() prints it.
  Selection select(const ProblemDesc& p) const;
  Explanation explain(int64_t m, InputLayout input = InputLayout::bf16_rows) const;
  ProjectionMemory memory() const;

  const std::string& name() const;
  int64_t n() const;
  int64_t k() const;
  MemorySpace space() const;
  bool has_fp8_copy() const;
  const ProjectionOptions& options() const;
  const bf16* bf16_weight() const;
  std::optional<Fp8WeightView> fp8_weight() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp8proj
