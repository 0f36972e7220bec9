// Device side of fill_normal / fill_bytes (include/fp8proj/random.hpp). Synchronous: these
// prepare test and benchmark data, never run on a hot path.
#include "core/random_hash.hpp"
#include "core/cuda_check.hpp"
#include "fp8proj/bf16.hpp"
#include "fp8proj/tensor.hpp"

namespace fp8proj {

namespace {
template <typename T>
__global__ void fill_normal_kernel(T* data, int64_t count, uint64_t seed, float stddev) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = stddev * detail::normal_at(seed, static_cast<uint64_t>(i));
    if constexpr (std::is_same_v<T, bf16>) data[i] = float_to_bf16(v);
    else data[i] = v;
  }
}

template <typename T>
void launch(T* data, int64_t count, uint64_t seed, float stddev) {
  if (count == 0) return;
  const int blocks = static_cast<int>(std::min<int64_t>(ceil_div(count, 256), 65536));
  fill_normal_kernel<<<blocks, 256>>>(data, count, seed, stddev);
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaDeviceSynchronize());
}
}  // namespace

void fill_normal_device(bf16* data, int64_t count, uint64_t seed, float stddev) { launch(data, count, seed, stddev); }
void fill_normal_device(float* data, int64_t count, uint64_t seed, float stddev) { launch(data, count, seed, stddev); }

void fill_bytes_device(void* data, size_t bytes, uint8_t value) {
  CUDA_CHECK(cudaMemset(data, value, bytes));
  CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace fp8proj
