// What the two cuBLASLt backends (cublaslt_bf16.cu, cublaslt_fp8_block.cu) share: the handle,
// RAII descriptors, and the per-M algorithm cache.
//
// Our row-major problem y[M, N] = x[M, K] . W[N, K]^T is handed to cuBLASLt (column-major) as
//   D^T[N, M] = op(A) . op(B),   A = W seen as K x N (ld K), op T;   B = x seen as K x M (ld K),
//   op N;   D = y seen as N x M (ld N).
// That is the "TN" layout, the only one Hopper's FP8 kernels accept, and it needs no copy.
//
// Algorithm choice: cublasLtMatmulAlgoGetHeuristic is asked once per (M, alignment of x and y)
// on first use and its answer is cached with the M-dependent layout descriptors. The lookup is a
// host-only call (no device work, no allocation of device memory, no synchronisation), so a
// first call for a new M inside a CUDA-graph capture is still legal; later calls cost one
// cublasLtMatmul. GemmPlanOptions::config_by_m does not apply: cuBLASLt's heuristic chooses.
//
// A plan runs on the device that was current when it was built, and one call at a time (the
// FP8 plan sets the activation-scale pointer on its matmul descriptor before each call).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "fp8proj/error.hpp"
#include "fp8proj/gemm.hpp"

namespace fp8proj {

// The registry's view of the backends (src/cuda/registry_cuda.cu).
const GemmBackend& cublaslt_bf16_backend();
const GemmBackend& cublaslt_fp8_block_backend();
// Why the backend cannot run in this process at all ("" when it can).
std::string cublaslt_bf16_unusable_reason();
std::string cublaslt_fp8_block_unusable_reason();

namespace lt {

// 32 MiB: what NVIDIA recommends for Hopper; split-K and stream-K kernels need it.
inline constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// One handle per device for the whole process. Never destroyed: it holds host resources only,
// and destroying it from a static destructor may run after the CUDA runtime has shut down.
cublasLtHandle_t handle();

// cuBLASLt's version as a number, e.g. 130100 for 13.1.0.
size_t version();

// Largest power of two <= 256 dividing both the address and the row pitch in bytes: the
// alignment cuBLASLt may assume for every row of the operand.
uint32_t alignment(const void* p, int64_t pitch_bytes);

class MatmulDesc {
 public:
  MatmulDesc(cublasOperation_t trans_a, cublasOperation_t trans_b);
  ~MatmulDesc();
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
  template <typename T>
  void set(cublasLtMatmulDescAttributes_t attr, const T& value);
  cublasLtMatmulDesc_t get() const { return desc_; }

 private:
  cublasLtMatmulDesc_t desc_ = nullptr;
};

class Layout {
 public:
  Layout() = default;
  Layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld);
  ~Layout();
  Layout(Layout&& other) noexcept;
  Layout& operator=(Layout&& other) noexcept;
  cublasLtMatrixLayout_t get() const { return layout_; }

 private:
  cublasLtMatrixLayout_t layout_ = nullptr;
};

// D^T[N, M] = W . x^T for one weight: A's layout is fixed, B's and D's depend on M.
class TnMatmul {
 public:
  // `what` names the backend in error messages; weight is A ([N, K] row-major, device memory).
  TnMatmul(std::string what, cudaDataType_t ab_type, int64_t n, int64_t k, const void* weight);

  MatmulDesc& desc() { return desc_; }

  struct Algo {
    cublasLtMatmulAlgo_t algo{};
    Layout b, d;
    std::string description;
  };
  // The cached algorithm for this M and these operand addresses; looked up on first use.
  const Algo& algo(int64_t m, const void* x, const void* y) const;
  // D = W . x^T; beta = 0, so C aliases D.
  void run(const Algo& algo, const void* x, void* y, void* workspace, cudaStream_t stream) const;
  std::string describe(int64_t m) const;

 private:
  std::string what_;
  cudaDataType_t ab_type_;
  int64_t n_, k_;
  const void* weight_;
  uint32_t align_a_;
  cublasLtHandle_t handle_;
  MatmulDesc desc_;
  Layout a_;
  mutable std::mutex mutex_;
  mutable std::map<std::tuple<int64_t, uint32_t, uint32_t>, Algo> cache_;  // (M, align x, align y)
};

template <typename T>
void MatmulDesc::set(cublasLtMatmulDescAttributes_t attr, const T& value) {
  const cublasStatus_t status = cublasLtMatmulDescSetAttribute(desc_, attr, &value, sizeof(T));
  FP8PROJ_CHECK(status == CUBLAS_STATUS_SUCCESS, "cublasLtMatmulDescSetAttribute(", static_cast<int>(attr),
                ") failed: ", cublasGetStatusString(status), " (cuBLASLt ", version(), " too old?)");
}

}  // namespace lt
}  // namespace fp8proj
