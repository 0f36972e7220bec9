#include <cstring>
#include <type_traits>

#include "core/parallel.hpp"
#include "core/random_hash.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/random.hpp"

namespace fp8proj {

#if FP8PROJ_WITH_CUDA
void fill_normal_device(bf16* data, int64_t count, uint64_t seed, float stddev);
void fill_normal_device(float* data, int64_t count, uint64_t seed, float stddev);
void fill_bytes_device(void* data, size_t bytes, uint8_t value);
#endif

namespace {
template <typename T>
void fill_host(T* data, int64_t count, uint64_t seed, float stddev) {
  parallel_for(count, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float v = stddev * detail::normal_at(seed, static_cast<uint64_t>(i));
      if constexpr (std::is_same_v<T, bf16>) data[i] = float_to_bf16(v);
      else data[i] = v;
    }
  });
}

template <typename T>
void fill(MemorySpace space, T* data, int64_t count, uint64_t seed, float stddev) {
  FP8PROJ_CHECK(count >= 0 && (count == 0 || data != nullptr), "fill_normal: null data or negative count");
  if (space == MemorySpace::host) return fill_host(data, count, seed, stddev);
#if FP8PROJ_WITH_CUDA
  fill_normal_device(data, count, seed, stddev);
#else
  FP8PROJ_FAIL("fill_normal on the device, but this build has no CUDA");
#endif
}
}  // namespace

void fill_normal(MemorySpace space, bf16* data, int64_t count, uint64_t seed, float stddev) {
  fill(space, data, count, seed, stddev);
}
void fill_normal(MemorySpace space, float* data, int64_t count, uint64_t seed, float stddev) {
  fill(space, data, count, seed, stddev);
}

void fill_bytes(MemorySpace space, void* data, size_t bytes, uint8_t value) {
  if (bytes == 0) return;
  FP8PROJ_CHECK(data != nullptr, "fill_bytes: null data");
  if (space == MemorySpace::host) {
    std::memset(data, value, bytes);
    return;
  }
#if FP8PROJ_WITH_CUDA
  fill_bytes_device(data, bytes, value);
#else
  FP8PROJ_FAIL("fill_bytes on the device, but this build has no CUDA");
#endif
}

}  // namespace fp8proj
