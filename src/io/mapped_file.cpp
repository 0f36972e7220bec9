#include "io/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "fp8proj/error.hpp"

namespace fp8proj::io {

namespace {

// Closes the descriptor on every path out of the constructor: the mapping outlives it, so a
// checkpoint of 163 shards (DeepSeek-V3) holds no file descriptors once open.
struct FdGuard {
  int fd;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

MappedFile::MappedFile(const std::string& path) {
  FdGuard fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  FP8PROJ_CHECK(fd.fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  FP8PROJ_CHECK(::fstat(fd.fd, &st) == 0, "cannot stat '", path, "': ", std::strerror(errno));
  FP8PROJ_CHECK(S_ISREG(st.st_mode), "'", path, "' is not a regular file");
  size_ = static_cast<size_t>(st.st_size);
  if (size_ == 0) return;  // mmap rejects a length of 0; callers report the file as too short
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  FP8PROJ_CHECK(p != MAP_FAILED, "cannot map '", path, "' (", size_, " bytes): ", std::strerror(errno));
  data_ = static_cast<const std::byte*>(p);
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::release() noexcept {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace fp8proj::io
