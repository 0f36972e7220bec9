#include "io/mapped_file.hpp"

#include <cstdint>
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

// Opens `path` for reading only if it is a regular file. stat() first, so that a FIFO or a
// device is refused without opening it; O_NONBLOCK, so that a FIFO swapped in between the
// two calls cannot block the open (a regular file ignores the flag); fstat() of the open
// descriptor, which is what is read.
int open_regular(const std::string& path, struct stat& st) {
  FP8PROJ_CHECK(::stat(path.c_str(), &st) == 0, "cannot open '", path, "': ", std::strerror(errno));
  FP8PROJ_CHECK(S_ISREG(st.st_mode), "'", path, "' is not a regular file (",
                S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a named pipe"
                : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "a socket or other special file",
                ")");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  FP8PROJ_CHECK(fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
  FdGuard guard{fd};
  FP8PROJ_CHECK(::fstat(fd, &st) == 0, "cannot stat '", path, "': ", std::strerror(errno));
  FP8PROJ_CHECK(S_ISREG(st.st_mode), "'", path, "' is not a regular file");
  guard.fd = -1;
  return fd;
}

}  // namespace

std::string read_regular_file(const std::string& path, size_t max_bytes) {
  struct stat st {};
  FdGuard fd{open_regular(path, st)};
  FP8PROJ_CHECK(static_cast<uint64_t>(st.st_size) <= max_bytes, "'", path, "' is ", st.st_size,
                " bytes, more than the ", max_bytes, " this kind of file may have");
  std::string text;
  // One byte more than the size: a file that grows while read is noticed, not cut short.
  text.resize(static_cast<size_t>(st.st_size) + 1);
  size_t got = 0;
  for (;;) {
    if (got == text.size()) break;
    const ssize_t r = ::read(fd.fd, text.data() + got, text.size() - got);
    if (r < 0 && errno == EINTR) continue;
    FP8PROJ_CHECK(r >= 0, "cannot read '", path, "': ", std::strerror(errno));
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  FP8PROJ_CHECK(got <= static_cast<size_t>(st.st_size), "'", path, "' grew while it was read");
  text.resize(got);
  return text;
}

MappedFile::MappedFile(const std::string& path) {
  struct stat st {};
  FdGuard fd{open_regular(path, st)};
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
