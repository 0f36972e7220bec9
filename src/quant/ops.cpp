// QuantOps for the host (the CPU reference) and the dispatch to the device implementation.
#include "fp8proj/ops.hpp"

#include "fp8proj/error.hpp"
#include "fp8proj/quantize.hpp"
#include "quant/device_ops.hpp"

namespace fp8proj {

namespace {
class HostQuantOps final : public QuantOps {
 public:
  MemorySpace space() const override { return MemorySpace::host; }
  using QuantOps::quantize_activation;  // the overloads without a mode stay callable here too
  using QuantOps::quantize_weight;
  using QuantOps::rmsnorm_quantize;
  void quantize_activation(const bf16* x, int64_t m, int64_t k, Fp8ActivationOut out, ScaleMode mode,
                           StreamHandle) const override {
    cpu::quantize_activation(x, m, k, out, mode);
  }
  void rmsnorm(const bf16* x, int64_t x_stride, const bf16* w, float eps, int64_t m, int64_t k, bf16* y,
               StreamHandle) const override {
    cpu::rmsnorm(x, x_stride, w, eps, m, k, y);
  }
  void rmsnorm_quantize(const bf16* x, int64_t x_stride, const bf16* w, float eps, int64_t m, int64_t k,
                        Fp8ActivationOut out, ScaleMode mode, StreamHandle) const override {
    cpu::rmsnorm_quantize(x, x_stride, w, eps, m, k, out, mode);
  }
  void silu_mul_quantize(const bf16* gate, const bf16* up, int64_t stride, int64_t m, int64_t k,
                         Fp8ActivationOut out, ScaleMode mode, StreamHandle) const override {
    cpu::silu_mul_quantize(gate, up, stride, m, k, out, mode);
  }
  void quantize_weight(const bf16* w, int64_t n, int64_t k, Fp8WeightOut out, ScaleMode mode,
                       StreamHandle) const override {
    cpu::quantize_weight(w, n, k, out, mode);
  }
  void synchronize(StreamHandle) const override {}
};
}  // namespace

const QuantOps& quant_ops(MemorySpace space) {
  static const HostQuantOps host;
  if (space == MemorySpace::host) return host;
#if FP8PROJ_WITH_CUDA
  return cuda_quant_ops();
#else
  FP8PROJ_FAIL("device quantization asked for, but this build has no CUDA");
#endif
}

}  // namespace fp8proj
