// CUDA_CHECK / CUBLAS_CHECK / CU_CHECK: the CUDA side of the error vocabulary in
// include/fp8proj/error.hpp. Each throws fp8proj::Error with file:line, the call
// that failed and the library's own error string.
#pragma once

#include <cublasLt.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include "fp8proj/error.hpp"

#define CUDA_CHECK(call)                                                                  \
  do {                                                                                    \
    cudaError_t status_ = (call);                                                         \
    if (status_ != cudaSuccess) [[unlikely]]                                              \
      FP8PROJ_FAIL("CUDA error ", cudaGetErrorName(status_), " (",                        \
                   cudaGetErrorString(status_), ") in ", #call);                         \
  } while (0)

// After a kernel launch: reports launch-configuration errors at the launch site.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(call)                                                                \
  do {                                                                                    \
    cublasStatus_t status_ = (call);                                                      \
    if (status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                    \
      FP8PROJ_FAIL("cuBLAS error ", cublasGetStatusName(status_), " (",                   \
                   cublasGetStatusString(status_), ") in ", #call);                      \
  } while (0)

// Driver API results (tensor-map encoding goes through cudaGetDriverEntryPoint, so the
// binary does not link libcuda and still loads on machines without a driver).
#define CU_CHECK(call)                                                                    \
  do {                                                                                    \
    CUresult status_ = (call);                                                            \
    if (status_ != CUDA_SUCCESS) [[unlikely]]                                             \
      FP8PROJ_FAIL("CUDA driver error ", static_cast<int>(status_), " in ", #call);       \
  } while (0)
