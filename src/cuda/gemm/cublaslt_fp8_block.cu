// Backend `cublaslt_fp8_block`: y[M, N] (bf16) = dequant(x)[M, K] . dequant(W)[N, K]^T through
// cuBLASLt's own block scaling on Hopper (cuBLASLt >= 12.9, sm_90): 1x128 groups for x
// (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F) and 128x128 blocks for W (..._BLK128x128_32F).
// A second baseline next to our kernel, and the fallback where ours cannot run.
//
// Mapping (cublaslt.hpp): D^T[N, M] = A . B with A = W (K x N, op T, scale mode BLK128x128) and
// B = x (K x M, op N, scale mode VEC128). Mixed 1D x 2D scaling is what NVIDIA's own users pass
// (TransformerEngine, PyTorch's scaled_mm; 2D x 2D is not supported).
//
// Scale layouts cuBLASLt expects. No stride attribute exists: the layout follows from the
// operand's shape. Taken from NVIDIA's own code — the cuBLASLt sample LtBlk128x128Fp8Matmul
// (Common/helpers.h getScaleTensorSize: VEC128 ceil(inner/128) * outer floats, BLK128x128
// round_up(ceil(inner/128), 4) * ceil(outer/128)) and TransformerEngine (pytorch/csrc/
// quantizer.cpp Float8BlockQuantizer::get_scale_shape, the "GEMM-ready" layouts it hands
// cuBLASLt unchanged) — and PyTorch's stride checks (is_blockwise_{1x128,128x128}_scaling).
// The cuBLAS documentation page itself was not available when this was written; the GPU tests
// (tests/gpu/gemm_gpu_test.cu, K/128 = 3 and 5, odd M, sub-views) are the check.
//   A, BLK128x128  [ceil(N/128), ceil(K/128)] : [round_up(ceil(K/128), 4), 1] — K blocks
//                  contiguous, each row padded to a multiple of 4 floats (16 bytes).
//                  Ours (tensor.hpp) is the same with stride ceil(K/128): identical whenever
//                  K/128 is a multiple of 4 (every model shape), otherwise the plan restages
//                  them into a padded buffer on the stream before every call (N/128 x K/128
//                  floats), so that scales changed in place are read as they are now.
//   B, VEC128      [K/128, M] : [M, 1] — M-contiguous ("MN-major"), exactly our activation
//                  layout when scale_ld == M. TransformerEngine (common/gemm/cublaslt_gemm.cu)
//                  requires, from observation, the outer dimension of a VEC128 B operand — our
//                  M — to be a multiple of 8 (and pads to it). With M % 8 == 0 the two readings
//                  of the stride (M, or TE's round_up(M, 4)) also coincide.
// Hence run():
//   M % 8 == 0 and scale_ld == M   one cublasLtMatmul on the caller's buffers (the common case:
//                                  the layer's workspace gives scale_ld = round_up(M, 4)).
//   otherwise                      rows [0, M8), M8 = M - M % 8, run in place with their scales
//                                  restaged to stride M8 (K/128 x M8 floats, 1/32 of x's bytes);
//                                  the last M % 8 rows are copied into a plan-owned 8-row tile,
//                                  multiplied, and their M % 8 output rows copied back.
//                                  Stream-ordered async copies only: still graph-capturable.
#include <memory>
#include <string>

#include "cuda/common/alignment.hpp"
#include "core/cuda_check.hpp"
#include "core/device_fault.hpp"
#include "cuda/gemm/cublaslt.hpp"
#include "fp8proj/device.hpp"
#include "fp8proj/formats.hpp"
#include "fp8proj/memory.hpp"

namespace fp8proj {

namespace {

constexpr const char* kName = "cublaslt_fp8_block";
constexpr int64_t kRowMultiple = 8;  // see the header comment (VEC128 B operand)
constexpr size_t kMinCublasLtVersion = 120900;

size_t align256(size_t bytes) { return static_cast<size_t>(round_up(static_cast<int64_t>(bytes), 256)); }

class CublasLtFp8Plan final : public Fp8GemmPlan {
 public:
  CublasLtFp8Plan(const Fp8WeightView& w, int64_t max_m)
      : n_(w.n), k_(w.k), kb_(w.k / kScaleBlock), max_m_(max_m), matmul_(kName, CUDA_R_8F_E4M3, w.n, w.k, w.values) {
    const cublasLtMatmulMatrixScale_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const cublasLtMatmulMatrixScale_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    matmul_.desc().set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, a_mode);
    matmul_.desc().set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, b_mode);

    // Weight scales in cuBLASLt's row stride: where K/128 is not a multiple of 4, a padded buffer
    // that run() refills from the caller's scales before every call (restage_weight_scales).
    nb_ = w.n / kScaleBlock;
    kb4_ = round_up(kb_, 4);
    src_scales_ = w.scales;
    const float* a_scales = w.scales;
    if (kb4_ != kb_) {
      weight_scales_ = Buffer(MemorySpace::device, static_cast<size_t>(nb_ * kb4_) * sizeof(float));
      CUDA_CHECK(cudaMemset(weight_scales_.data(), 0, weight_scales_.bytes()));
      a_scales = weight_scales_.data<float>();
    }
    matmul_.desc().set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scales);

    // Staging for calls that cannot run in place: restaged scales for up to max_m rows, and one
    // 8-row tile (values, scales, output). Zeroed once so the tile's unused rows hold finite data.
    main_scales_bytes_ = align256(static_cast<size_t>(kb_ * max_m_) * sizeof(float));
    tail_values_bytes_ = align256(static_cast<size_t>(kRowMultiple * k_));
    tail_scales_bytes_ = align256(static_cast<size_t>(kb_ * kRowMultiple) * sizeof(float));
    const size_t tail_out_bytes = align256(static_cast<size_t>(kRowMultiple * n_) * sizeof(bf16));
    staging_ = Buffer(MemorySpace::device, main_scales_bytes_ + tail_values_bytes_ + tail_scales_bytes_ + tail_out_bytes);
    CUDA_CHECK(cudaMemset(staging_.data(), 0, staging_.bytes()));
    // cuBLASLt's heuristic answers "unsupported" for a VEC128 operand whose scale pointer is
    // still null (seen on an H200 with cuBLASLt 13.1: every describe() before a first run()
    // failed). run() points it at the real scales before each call; until then, a valid one.
    matmul_.desc().set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const float*>(tail_scales()));
    workspace_ = Buffer(MemorySpace::device, lt::kWorkspaceBytes);
  }

  void run(const Fp8ActivationView& x, bf16* y, StreamHandle stream) override {
    check_device_usable();
    check_gemm_fp8_args(x, k_, y, max_m_);
    if (x.m == 0) return;
    FP8PROJ_CHECK(is_aligned16(x.values) && is_aligned16(x.scales) && is_aligned16(y), kName,
                  ": activation values, scales and output must be 16-byte aligned");
    const auto s = static_cast<cudaStream_t>(stream);
    restage_weight_scales(s);
    const int64_t m = x.m, m8 = m - m % kRowMultiple, tail = m % kRowMultiple;
    if (m8 > 0) {
      const float* scales = x.scales;
      if (tail != 0 || x.scale_ld != m) {
        float* staged = main_scales();
        CUDA_CHECK(cudaMemcpy2DAsync(staged, m8 * sizeof(float), x.scales, x.scale_ld * sizeof(float),
                                     m8 * sizeof(float), kb_, cudaMemcpyDeviceToDevice, s));
        scales = staged;
      }
      multiply(x.values, scales, m8, y, s);
    }
    if (tail != 0) {
      CUDA_CHECK(cudaMemcpyAsync(tail_values(), x.values + m8 * k_, tail * k_, cudaMemcpyDeviceToDevice, s));
      CUDA_CHECK(cudaMemcpy2DAsync(tail_scales(), kRowMultiple * sizeof(float), x.scales + m8,
                                   x.scale_ld * sizeof(float), tail * sizeof(float), kb_, cudaMemcpyDeviceToDevice, s));
      multiply(tail_values(), tail_scales(), kRowMultiple, tail_out(), s);
      CUDA_CHECK(cudaMemcpyAsync(y + m8 * n_, tail_out(), tail * n_ * sizeof(bf16), cudaMemcpyDeviceToDevice, s));
    }
  }

  std::string describe(int64_t m) const override {
    if (m <= 0) return "no-op (M = 0)";
    const int64_t m8 = m - m % kRowMultiple, tail = m % kRowMultiple;
    std::string out;
    if (m8 > 0) out = matmul_.describe(m8) + (tail ? " on the first " + std::to_string(m8) + " rows" : "");
    if (tail) {
      out += (out.empty() ? "" : "; ") + std::to_string(tail) + " row(s) padded to an 8-row tile (cuBLASLt wants M % 8 == 0): " +
             matmul_.describe(kRowMultiple);
    }
    return out;
  }

  size_t workspace_bytes() const override { return workspace_.bytes() + staging_.bytes() + weight_scales_.bytes(); }

 private:
  void multiply(const uint8_t* values, const float* scales, int64_t m, bf16* y, cudaStream_t s) {
    // The descriptor is read when cublasLtMatmul enqueues, so changing the pointer between calls is safe.
    matmul_.desc().set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, scales);
    matmul_.run(matmul_.algo(m, values, y), values, y, workspace_.data(), s);
  }

  // The weight's scales as they are now, in cuBLASLt's padded row stride, ordered on the stream
  // before the call that reads them (a copy node inside a captured graph). A copy made once at
  // construction would go on reading scales the caller has since changed in place.
  void restage_weight_scales(cudaStream_t s) {
    if (weight_scales_.empty()) return;
    CUDA_CHECK(cudaMemcpy2DAsync(weight_scales_.data(), kb4_ * sizeof(float), src_scales_, kb_ * sizeof(float),
                                 kb_ * sizeof(float), nb_, cudaMemcpyDeviceToDevice, s));
  }

  float* main_scales() const { return staging_.data<float>(); }
  uint8_t* tail_values() const { return staging_.data<uint8_t>() + main_scales_bytes_; }
  float* tail_scales() const {
    return reinterpret_cast<float*>(staging_.data<uint8_t>() + main_scales_bytes_ + tail_values_bytes_);
  }
  bf16* tail_out() const {
    return reinterpret_cast<bf16*>(staging_.data<uint8_t>() + main_scales_bytes_ + tail_values_bytes_ +
                                   tail_scales_bytes_);
  }

  int64_t n_, k_, kb_, max_m_;
  int64_t nb_ = 0, kb4_ = 0;
  const float* src_scales_ = nullptr;  // the caller's weight scales (they outlive the plan)
  lt::TnMatmul matmul_;
  Buffer weight_scales_, staging_, workspace_;
  size_t main_scales_bytes_ = 0, tail_values_bytes_ = 0, tail_scales_bytes_ = 0;
};

class CublasLtFp8Block final : public GemmBackend {
 public:
  std::string_view name() const override { return kName; }
  GemmKind kind() const override { return GemmKind::fp8_block; }
  MemorySpace space() const override { return MemorySpace::device; }
  std::string unsupported_reason(int64_t n, int64_t k) const override {
    if (n <= 0 || k <= 0) return "N and K must be positive";
    // Stricter than fp8_block_shape_reason (N % 16): a partial last 128-row weight block is
    // neither documented for cuBLASLt's BLK128x128 scaling nor validated here, so fused_qkv_a
    // (N = 2624 / 2112) and kv_a (576) run on sm90_fp8_block only.
    if (n % kScaleBlock != 0 || k % kScaleBlock != 0)
      return "N and K must be multiples of 128 (whole 128x128 weight blocks; a partial last block is not validated "
             "with cuBLASLt's block scaling, sm90_fp8_block runs N % 16 == 0), got N=" +
             std::to_string(n) + " K=" + std::to_string(k);
    return cublaslt_fp8_block_unusable_reason();
  }
  std::unique_ptr<Fp8GemmPlan> plan_fp8(const Fp8WeightView& w, const GemmPlanOptions& options) const override {
    const std::string why = unsupported_reason(w.n, w.k);
    FP8PROJ_CHECK(why.empty(), kName, " cannot run ", w.n, "x", w.k, ": ", why);
    FP8PROJ_CHECK(w.values != nullptr && w.scales != nullptr, kName, ": FP8 weight has a null pointer");
    FP8PROJ_CHECK(is_aligned16(w.values) && is_aligned16(w.scales), kName, ": FP8 weight values and scales must be 16-byte aligned");
    FP8PROJ_CHECK(options.max_m >= 0, kName, ": max_m must be >= 0");
    return std::make_unique<CublasLtFp8Plan>(w, options.max_m);
  }
};

}  // namespace

std::string cublaslt_fp8_block_unusable_reason() {
  const DeviceInfo& d = current_device();
  if (!d.present) return d.why_absent;
  if (!d.is_sm90())
    return "cuBLASLt's 1x128 / 128x128 block scaling runs on sm_90 only; this GPU is " + d.arch();
  if (lt::version() < kMinCublasLtVersion)
    return "needs cuBLASLt >= 12.9 for block scaling, found " + d.cublaslt_version;
  return "";
}

const GemmBackend& cublaslt_fp8_block_backend() {
  static const CublasLtFp8Block backend;
  return backend;
}

}  // namespace fp8proj
