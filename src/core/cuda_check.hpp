// CUDA_CHECK / CUBLAS_CHECK / CU_CHECK: the CUDA side of the error vocabulary in
// include/fp8proj/error.hpp. Each throws fp8proj::Error with file:line, the call that failed
// and the library's own error string.
//
// A sticky error (the context is dead: cuda_error_is_sticky) also closes the device-fault
// latch (core/device_fault.hpp) with that text, plus the GEMM watchdog's report when a kernel
// hung (gemm/sm90_watchdog.hpp), so that every later call fails at once with it. When the
// latch is already closed, the error thrown is the latched one: the first fault is the cause.
#pragma once

#include <cublasLt.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <string>

#include "core/device_fault.hpp"
#include "fp8proj/error.hpp"

namespace fp8proj {

// The errors after which "any further CUDA work will return the same error" (driver_types.h,
// CUDA 13): 700 illegal address, 702 launch timeout, 710 device assert, 714 hardware stack
// error, 715 illegal instruction, 716 misaligned address, 717 invalid address space, 718
// invalid PC, 719 launch failure (a trap), 721 tensor memory leak, 226 contained error, 810 MPS
// client terminated, 911 external device; and the uncorrectable ECC (214) and NVLink (220)
// errors, after which the context's memory cannot be trusted either.
bool cuda_error_is_sticky(cudaError_t status) noexcept;

// For the failure path of calls that report no cudaError_t (cuBLAS, NCCL): the context's sticky
// error if it has one, else cudaSuccess. Neither blocks nor synchronises; it may clear a pending
// non-sticky error of this thread.
cudaError_t sticky_cuda_error_now() noexcept;

// "CUDA error cudaErrorLaunchFailure (unspecified launch failure)"
std::string cuda_error_text(cudaError_t status);

// Where a sticky `status` is seen outside CUDA_CHECK (a polling loop, a pointer query):
// closes the latch with `what` (the caller's text, its location included). No-op otherwise.
void note_cuda_error(cudaError_t status, const std::string& what);

namespace detail {
[[noreturn]] void throw_cuda_error(const char* file, int line, cudaError_t status, const char* call);
[[noreturn]] void throw_cublas_error(const char* file, int line, cublasStatus_t status, const char* call);
}  // namespace detail

}  // namespace fp8proj

#define CUDA_CHECK(call)                                                                   \
  do {                                                                                     \
    cudaError_t status_ = (call);                                                          \
    if (status_ != cudaSuccess) [[unlikely]]                                               \
      ::fp8proj::detail::throw_cuda_error(__FILE__, __LINE__, status_, #call);             \
  } while (0)

// After a kernel launch: reports launch-configuration errors at the launch site.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(call)                                                                 \
  do {                                                                                     \
    cublasStatus_t status_ = (call);                                                       \
    if (status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                     \
      ::fp8proj::detail::throw_cublas_error(__FILE__, __LINE__, status_, #call);           \
  } while (0)

// Driver API results (tensor-map encoding goes through cudaGetDriverEntryPoint, so the
// binary does not link libcuda and still loads on machines without a driver).
#define CU_CHECK(call)                                                                    \
  do {                                                                                    \
    CUresult status_ = (call);                                                            \
    if (status_ != CUDA_SUCCESS) [[unlikely]]                                             \
      FP8PROJ_FAIL("CUDA driver error ", static_cast<int>(status_), " in ", #call);       \
  } while (0)
