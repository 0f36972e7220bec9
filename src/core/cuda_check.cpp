// The failure paths of CUDA_CHECK and CUBLAS_CHECK (core/cuda_check.hpp): the message, and the
// device-fault latch for sticky errors.
#include "core/cuda_check.hpp"

namespace fp8proj {

bool cuda_error_is_sticky(cudaError_t status) noexcept {
  switch (status) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorContained:
    case cudaErrorMpsClientTerminated:
    case cudaErrorExternalDevice:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
      return true;
    default:
      return false;
  }
}

cudaError_t sticky_cuda_error_now() noexcept {
  cudaError_t e = cudaPeekAtLastError();
  if (cuda_error_is_sticky(e)) return e;
  // A call that needs the context (no stream operation, allowed during graph capture): a dead
  // context answers with its sticky error even where this thread's last-error slot is clean
  // (the failing call was made by another library's copy of the runtime, e.g. cuBLAS's).
  size_t free_bytes = 0, total_bytes = 0;
  e = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (cuda_error_is_sticky(e)) return e;
  if (e != cudaSuccess) (void)cudaGetLastError();  // not sticky: leave no trace of the probe
  return cudaSuccess;
}

void check_context_alive() {
  check_device_usable();
  if (const cudaError_t e = sticky_cuda_error_now(); e != cudaSuccess) CUDA_CHECK(e);
}

std::string cuda_error_text(cudaError_t status) {
  return detail::concat("CUDA error ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
}

void note_cuda_error(cudaError_t status, const std::string& what) {
  if (cuda_error_is_sticky(status)) latch_device_fault(what);
}

namespace detail {

namespace {
// A sticky error: the latch's text (the first fault's, with the watchdog report if a kernel hung)
// and the one sentence a user needs.
[[noreturn]] void throw_sticky(const char* file, int line, const std::string& what) {
  if (const std::string* earlier = device_fault()) throw Error(device_unusable_message(*earlier));
  const std::string& text = latch_device_fault(located(file, line, what));
  throw Error("fp8proj: " + text + " -- a sticky error: the CUDA context is unusable; restart the process");
}
}  // namespace

void throw_cuda_error(const char* file, int line, cudaError_t status, const char* call) {
  const std::string what = cuda_error_text(status) + " in " + call;
  if (cuda_error_is_sticky(status)) throw_sticky(file, line, what);
  throw_error(file, line, what);
}

void throw_cublas_error(const char* file, int line, cublasStatus_t status, const char* call) {
  std::string what = concat("cuBLAS error ", cublasGetStatusName(status), " (", cublasGetStatusString(status),
                            ") in ", call);
  const cudaError_t sticky = sticky_cuda_error_now();
  if (sticky == cudaSuccess) throw_error(file, line, what);
  throw_sticky(file, line, what + " after " + cuda_error_text(sticky));
}

}  // namespace detail

}  // namespace fp8proj
