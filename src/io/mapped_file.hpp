// A whole file mapped read-only into memory (POSIX mmap). Pages are read from disk when first
// touched, so mapping a multi-GB checkpoint shard costs nothing until its tensors are read.
#pragma once

#include <cstddef>
#include <span>
#include <string>

namespace fp8proj::io {

// The whole of a small regular file (a table, an index, an id file): refuses directories,
// FIFOs and devices without blocking on them, and files larger than max_bytes. Throws
// fp8proj::Error naming the path.
std::string read_regular_file(const std::string& path, size_t max_bytes);

class MappedFile {
 public:
  // Throws fp8proj::Error naming the path when it cannot be opened, is not a regular file
  // (checked before opening: a FIFO or device is never opened), or cannot be mapped. An empty file is valid and maps to an empty span.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  size_t size() const { return size_; }

 private:
  void release() noexcept;

  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace fp8proj::io
