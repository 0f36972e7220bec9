// Test only: the real sm90 1d2d GEMM kernel (sm90_fp8_gemm_1d2d.cuh, configuration
// m128n128_ws2_st5) launched so that it hangs, for the watchdog case of the fault probe
// (tests/gpu/test_faults.py, "hang"). Its B descriptor's box has 64 rows where the kernel's
// expect_tx counts 128: the TMA loads of stage 0 complete 8 KiB less than the full barrier
// waits for, so that barrier never completes and every consumer thread waits on full[0] forever
// -- unless the watchdog (gemm/sm90_watchdog.hpp) ends the kernel. Nothing in the product can
// launch it this way; the test builds the launch here, from the kernel header.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda_check.hpp"
#include "cuda/common/tensor_map.hpp"
#include "cuda/kernels/sm90_fp8_gemm_1d2d.cuh"
#include "gemm/sm90_fp8_heuristic.hpp"
#include "gemm/sm90_watchdog.hpp"

namespace fp8proj::testing {

// Launches the hanging GEMM (M = N = K = 128) on `stream` and returns; the caller waits.
void launch_hanging_gemm(cudaStream_t stream) {
  using T = sm90::kernels::Gemm1d2dTraits<128, 128, 2, 5>;
  constexpr uint32_t m = 128, n = 128, k = 128;
  void *a = nullptr, *b = nullptr, *sa = nullptr, *sb = nullptr, *d = nullptr;
  CUDA_CHECK(cudaMalloc(&a, m * k));
  CUDA_CHECK(cudaMalloc(&b, n * k));
  CUDA_CHECK(cudaMalloc(&sa, m * (k / 128) * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&sb, (n / 128) * (k / 128) * sizeof(float)));
  CUDA_CHECK(cudaMalloc(&d, m * n * 2));
  CUDA_CHECK(cudaMemset(a, 0x38, m * k));
  CUDA_CHECK(cudaMemset(b, 0x38, n * k));
  CUDA_CHECK(cudaMemset(sa, 0, m * (k / 128) * sizeof(float)));
  CUDA_CHECK(cudaMemset(sb, 0, (n / 128) * (k / 128) * sizeof(float)));
  // As sm90_fp8_gemm.cu's make_maps, except the B box: T::kBRowsPerCta / 2 rows.
  const CUtensorMap map_a =
      make_tensor_map_2d(CU_TENSOR_MAP_DATA_TYPE_UINT8, a, k, m, k, 128, T::BLOCK_M, CU_TENSOR_MAP_SWIZZLE_128B, "A");
  const CUtensorMap map_sfa = make_tensor_map_2d(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, sa, m, k / 128, m * 4, T::BLOCK_M, 1,
                                                 CU_TENSOR_MAP_SWIZZLE_NONE, "a_scales");
  const CUtensorMap map_b = make_tensor_map_2d(CU_TENSOR_MAP_DATA_TYPE_UINT8, b, k, n, k, 128, T::kBRowsPerCta / 2,
                                               CU_TENSOR_MAP_SWIZZLE_128B, "B (half box)");
  const CUtensorMap map_d = make_tensor_map_2d(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, d, n, m, n * 2, T::kDSlabCols,
                                               T::kDStoreRows, CU_TENSOR_MAP_SWIZZLE_128B, "D");
  auto kernel = sm90::kernels::sm90_fp8_gemm_1d2d_kernel<T, true>;  // the build with the watchdog
  sm90::Config cfg;  // m128n128_ws2_st5
  const auto smem = static_cast<size_t>(sm90::smem_bytes(cfg, k));
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  sm90::WatchdogParams watchdog = sm90::watchdog_params();
  watchdog.m = m;
  watchdog.n = n;
  watchdog.k = k;
  kernel<<<1, T::kThreads, smem, stream>>>(map_a, map_sfa, map_b, map_d, static_cast<const float*>(sb), m, n, k, 1, 0,
                                           watchdog);
  CUDA_CHECK_LAUNCH();
  // The buffers stay allocated: the kernel still reads them until the watchdog ends it.
}

}  // namespace fp8proj::testing
