// An owning, untyped allocation in one memory space. Host memory is 256-byte aligned (so
// vectorised CPU loops and 16-byte GPU copies both work); device memory comes from
// cudaMalloc. Buffers are moved, never copied.
#pragma once

#include <cstddef>
#include <utility>

#include "fp8proj/tensor.hpp"

namespace fp8proj {

class Buffer {
 public:
  Buffer() = default;
  Buffer(MemorySpace space, size_t bytes);
  ~Buffer() { release(); }

  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      release();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
      space_ = other.space_;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  template <typename T = void>
  T* data() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  MemorySpace space() const { return space_; }
  bool empty() const { return bytes_ == 0; }

 private:
  void release() noexcept;

  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  MemorySpace space_ = MemorySpace::host;
};

// Copies between any two spaces (a synchronous cudaMemcpy where the device is involved).
void copy_bytes(void* dst, MemorySpace dst_space, const void* src, MemorySpace src_space,
                size_t bytes);

// True when this build has CUDA and at least one usable GPU.
bool gpu_available();

}  // namespace fp8proj
