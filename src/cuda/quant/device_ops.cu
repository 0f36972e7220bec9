// QuantOps for MemorySpace::device (include/fp8proj/ops.hpp): checks the arguments on the host
// (and, first, that no sticky CUDA error left the context unusable: core/device_fault.hpp),
// then launches the kernels of src/cuda/quant/ on the caller's stream. No allocation and no
// synchronisation (except synchronize()), so every call can be captured in a CUDA graph.
#include <cstdint>

#include "cuda/common/alignment.hpp"
#include "core/cuda_check.hpp"
#include "core/device_fault.hpp"
#include "cuda/quant/quant_kernels.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/ops.hpp"
#include "fp8proj/quantize.hpp"
#include "quant/device_ops.hpp"

namespace fp8proj {

namespace {

void check_aligned(const void* p, const char* what) {
  FP8PROJ_CHECK(is_aligned16(p), what, " must be 16-byte aligned for the device kernels (got address ", p, ")");
}

void check_rows(int64_t m) {
  FP8PROJ_CHECK(m <= gpu::kMaxQuantRows, "device quantization handles at most ", gpu::kMaxQuantRows,
                " rows per call, got M=", m, "; split the batch");
}

void check_activation_out(const Fp8ActivationOut& out) {
  check_aligned(out.values, "FP8 activation values");
  check_aligned(out.scales, "FP8 activation scales");
}

void check_norm_args(const bf16* weight, float eps) {
  FP8PROJ_CHECK(weight != nullptr, "RMSNorm weight pointer is null");
  FP8PROJ_CHECK(eps >= 0.0f, "RMSNorm eps must be >= 0, got ", eps);
  check_aligned(weight, "RMSNorm weight");
}

// Strided input rows: every row must start on a 16-byte boundary too.
void check_row_stride(int64_t x_stride, int64_t k, const char* what = "rmsnorm input") {
  FP8PROJ_CHECK(x_stride >= k && x_stride % 8 == 0, what, " row stride must be >= K=", k,
                " and a multiple of 8 elements (16 bytes), got ", x_stride);
}

cudaStream_t as_cuda(StreamHandle s) { return static_cast<cudaStream_t>(s); }

class DeviceQuantOps final : public QuantOps {
 public:
  MemorySpace space() const override { return MemorySpace::device; }

  using QuantOps::quantize_activation;  // the overloads without a mode stay callable here too
  using QuantOps::quantize_weight;
  using QuantOps::rmsnorm_quantize;

  void quantize_activation(const bf16* x, int64_t m, int64_t k, Fp8ActivationOut out, ScaleMode mode,
                           StreamHandle stream) const override {
    check_device_usable();
    check_activation_args(x, m, k, out);
    if (m == 0) return;
    check_rows(m);
    check_aligned(x, "activation input");
    check_activation_out(out);
    gpu::launch_activation_quant(x, m, k, out, mode, as_cuda(stream));
  }

  void rmsnorm(const bf16* x, int64_t x_stride, const bf16* weight, float eps, int64_t m, int64_t k, bf16* y,
               StreamHandle stream) const override {
    check_device_usable();
    FP8PROJ_CHECK(m >= 0 && k > 0 && k % 8 == 0, "rmsnorm needs M >= 0 and K a positive multiple of 8, got M=", m,
                  " K=", k);
    if (m == 0) return;
    FP8PROJ_CHECK(x != nullptr && y != nullptr, "rmsnorm input or output pointer is null");
    check_norm_args(weight, eps);
    check_aligned(x, "rmsnorm input");
    check_row_stride(x_stride, k);
    check_aligned(y, "rmsnorm output");
    gpu::launch_rmsnorm(x, x_stride, weight, eps, m, k, y, as_cuda(stream));
  }

  void rmsnorm_quantize(const bf16* x, int64_t x_stride, const bf16* weight, float eps, int64_t m, int64_t k,
                        Fp8ActivationOut out, ScaleMode mode, StreamHandle stream) const override {
    check_device_usable();
    check_activation_args(x, m, k, out);
    if (m == 0) return;
    FP8PROJ_CHECK(k <= gpu::kMaxRmsnormQuantK, "fused rmsnorm+quantize supports K <= ", gpu::kMaxRmsnormQuantK,
                  ", got K=", k, "; run rmsnorm and quantize_activation separately");
    check_rows(m);
    check_norm_args(weight, eps);
    check_aligned(x, "rmsnorm input");
    check_row_stride(x_stride, k);
    check_activation_out(out);
    gpu::launch_rmsnorm_quant(x, x_stride, weight, eps, m, k, out, mode, as_cuda(stream));
  }

  void silu_mul_quantize(const bf16* gate, const bf16* up, int64_t stride, int64_t m, int64_t k,
                         Fp8ActivationOut out, ScaleMode mode, StreamHandle stream) const override {
    check_device_usable();
    check_activation_args(gate, m, k, out);
    if (m == 0) return;
    FP8PROJ_CHECK(up != nullptr, "silu_mul_quantize: up pointer is null");
    check_rows(m);
    check_aligned(gate, "silu_mul_quantize gate");
    check_aligned(up, "silu_mul_quantize up");
    check_row_stride(stride, k, "silu_mul_quantize");
    check_activation_out(out);
    gpu::launch_silu_mul_quant(gate, up, stride, m, k, out, mode, as_cuda(stream));
  }

  void quantize_weight(const bf16* w, int64_t n, int64_t k, Fp8WeightOut out, ScaleMode mode,
                       StreamHandle stream) const override {
    check_device_usable();
    check_weight_args(w, n, k, out);
    check_aligned(w, "weight");
    check_aligned(out.values, "FP8 weight values");
    FP8PROJ_CHECK(reinterpret_cast<uintptr_t>(out.scales) % alignof(float) == 0, "FP8 weight scales are misaligned");
    FP8PROJ_CHECK(ceil_div(n, kScaleBlock) <= 65535, "weight has too many 128-row blocks (N=", n, ")");
    gpu::launch_weight_quant(w, n, k, out, mode, as_cuda(stream));
  }

  void synchronize(StreamHandle stream) const override {
    check_device_usable();
    CUDA_CHECK(cudaStreamSynchronize(as_cuda(stream)));
  }
};

}  // namespace

const QuantOps& cuda_quant_ops() {
  static const DeviceQuantOps ops;
  return ops;
}

}  // namespace fp8proj
