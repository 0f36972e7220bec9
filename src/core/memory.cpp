#include "fp8proj/memory.hpp"

#include <cstdlib>
#include <cstring>

#include "core/device_fault.hpp"
#include "fp8proj/error.hpp"

#if FP8PROJ_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_check.hpp"
#endif

namespace fp8proj {

Buffer::Buffer(MemorySpace space, size_t bytes) : space_(space) {
  if (bytes == 0) return;
  if (space == MemorySpace::host) {
    ptr_ = std::aligned_alloc(256, round_up(static_cast<int64_t>(bytes), 256));
    FP8PROJ_CHECK(ptr_ != nullptr, "host allocation of ", bytes, " bytes failed");
  } else {
    check_device_usable();  // no allocation on a context an earlier sticky error left unusable
#if FP8PROJ_WITH_CUDA
    FP8PROJ_CHECK(gpu_available(), "device allocation of ", bytes, " bytes asked for, but no GPU is available");
    CUDA_CHECK(cudaMalloc(&ptr_, bytes));
#else
    FP8PROJ_FAIL("device allocation asked for, but this build has no CUDA (configure with FP8PROJ_CUDA=ON)");
#endif
  }
  bytes_ = bytes;
}

void Buffer::release() noexcept {
  if (ptr_ == nullptr) return;
  if (space_ == MemorySpace::host) {
    std::free(ptr_);
  } else {
#if FP8PROJ_WITH_CUDA
    cudaFree(ptr_);
#endif
  }
  ptr_ = nullptr;
  bytes_ = 0;
}

void copy_bytes(void* dst, MemorySpace dst_space, const void* src, MemorySpace src_space, size_t bytes) {
  if (bytes == 0) return;
  FP8PROJ_CHECK(dst && src, "copy_bytes: null pointer");
  if (dst_space == MemorySpace::host && src_space == MemorySpace::host) {
    std::memcpy(dst, src, bytes);
    return;
  }
  check_device_usable();
#if FP8PROJ_WITH_CUDA
  CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  // cudaMemcpy from pageable host memory may return once the bytes are staged, before they reach
  // the device, and a device-to-device cudaMemcpy does not wait at all (CUDA runtime API,
  // "API synchronization behavior"): work queued next on a non-blocking stream (a graph replay)
  // could read the old bytes. Waiting on the legacy stream, which ran the copy, makes it synchronous.
  CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
#else
  FP8PROJ_FAIL("copy to or from device memory, but this build has no CUDA");
#endif
}

}  // namespace fp8proj
