// Registry of the device backends: every backend this CUDA build knows, with the reason it
// cannot run in this process ("" when it can).
#include "cuda/gemm/cublaslt.hpp"
#include "fp8proj/device.hpp"
#include "gemm/backends.hpp"

namespace fp8proj {

const GemmBackend& sm90_fp8_block_backend();  // src/cuda/gemm/sm90_fp8_block.cu

namespace {
std::string sm90_unusable_reason() {
  const DeviceInfo& d = current_device();
  if (!d.present) return "no GPU: " + d.why_absent;
  if (!d.is_sm90()) return "needs compute capability 9.0 (sm_90a build); this GPU is " + d.arch();
  return "";
}
}  // namespace

std::vector<std::pair<const GemmBackend*, std::string>> cuda_backends() {
  return {
      {&cublaslt_bf16_backend(), cublaslt_bf16_unusable_reason()},
      {&cublaslt_fp8_block_backend(), cublaslt_fp8_block_unusable_reason()},
      {&sm90_fp8_block_backend(), sm90_unusable_reason()},
  };
}

}  // namespace fp8proj
