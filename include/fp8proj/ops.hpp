// The element-wise passes around the GEMMs, behind one interface per memory space:
// the host implementation is the CPU reference (fp8proj::cpu), the device one launches the
// kernels in src/cuda/quant/ on the given stream (no allocation, no synchronisation).
#pragma once

#include <cstdint>

#include "fp8proj/bf16.hpp"
#include "fp8proj/formats.hpp"
#include "fp8proj/tensor.hpp"

namespace fp8proj {

class QuantOps {
 public:
  virtual ~QuantOps() = default;
  virtual MemorySpace space() const = 0;

  // 1x128 groups; `mode` picks the scale format (formats.hpp), UE8M0 unless asked otherwise.
  virtual void quantize_activation(const bf16* x, int64_t m, int64_t k, Fp8ActivationOut out, ScaleMode mode,
                                   StreamHandle stream) const = 0;
  void quantize_activation(const bf16* x, int64_t m, int64_t k, Fp8ActivationOut out, StreamHandle stream) const {
    quantize_activation(x, m, k, out, ScaleMode::ue8m0, stream);
  }
  // RMSNorm over rows of x that are x_stride >= k elements apart (a view into wider rows, e.g.
  // the q_a columns of fused_qkv_a's output); y and out are dense [m, k].
  virtual void rmsnorm(const bf16* x, int64_t x_stride, const bf16* weight, float eps, int64_t m,
                       int64_t k, bf16* y, StreamHandle stream) const = 0;
  // quantize_activation(rmsnorm(x)) in one pass; `mode` as for quantize_activation.
  virtual void rmsnorm_quantize(const bf16* x, int64_t x_stride, const bf16* weight, float eps,
                                int64_t m, int64_t k, Fp8ActivationOut out, ScaleMode mode,
                                StreamHandle stream) const = 0;
  void rmsnorm_quantize(const bf16* x, int64_t x_stride, const bf16* weight, float eps, int64_t m,
                        int64_t k, Fp8ActivationOut out, StreamHandle stream) const {
    rmsnorm_quantize(x, x_stride, weight, eps, m, k, out, ScaleMode::ue8m0, stream);
  }
  // quantize_activation(bf16(bf16(silu(gate)) * up)) in one pass: a gated MLP's input to down_proj,
  // silu(g) = g / (1 + exp(-g)) in fp32 and the two bf16 roundings of PyTorch's bf16
  // act_fn(gate) * up. gate and up are [m, k] with rows `stride` >= k elements apart (e.g. the
  // two column halves of one [m, 2k] output); `mode` as for quantize_activation.
  virtual void silu_mul_quantize(const bf16* gate, const bf16* up, int64_t stride, int64_t m, int64_t k,
                                 Fp8ActivationOut out, ScaleMode mode, StreamHandle stream) const = 0;
  // 128x128 blocks; `mode` as above (ProjectionOptions::weight_scales for the layer's copy).
  virtual void quantize_weight(const bf16* w, int64_t n, int64_t k, Fp8WeightOut out, ScaleMode mode,
                               StreamHandle stream) const = 0;
  void quantize_weight(const bf16* w, int64_t n, int64_t k, Fp8WeightOut out, StreamHandle stream) const {
    quantize_weight(w, n, k, out, ScaleMode::ue8m0, stream);
  }
  // Waits for the work queued on `stream` (no-op on the host). Used at load time only.
  virtual void synchronize(StreamHandle stream) const = 0;
};

// The implementation for a memory space; throws if the device one is not built/available.
const QuantOps& quant_ops(MemorySpace space);

}  // namespace fp8proj
