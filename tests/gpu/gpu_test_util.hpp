// Helpers of the GPU tests: the skip-without-GPU fixture, device buffers filled from and read
// back to host vectors, and test data that reaches every corner of the e4m3 grid.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "fp8proj/bf16.hpp"
#include "fp8proj/device.hpp"
#include "fp8proj/memory.hpp"
#include "fp8proj/random.hpp"

namespace fp8proj::testing {

// Every GPU test derives from this: on a machine without a GPU it skips, visibly, with the reason.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!current_device().present) GTEST_SKIP() << "no GPU: " << current_device().why_absent;
  }
};

template <typename T>
Buffer to_device(const std::vector<T>& host) {
  Buffer b(MemorySpace::device, host.size() * sizeof(T));
  copy_bytes(b.data(), MemorySpace::device, host.data(), MemorySpace::host, b.bytes());
  return b;
}

template <typename T>
std::vector<T> to_host(const void* device, size_t count) {
  std::vector<T> host(count);
  copy_bytes(host.data(), MemorySpace::host, device, MemorySpace::device, count * sizeof(T));
  return host;
}

// A device buffer of `bytes` bytes, every byte set to `poison` (0xff: bf16 / fp32 NaN), so that
// an output element the kernel never writes is caught.
inline Buffer poisoned(size_t bytes, uint8_t poison = 0xff) {
  Buffer b(MemorySpace::device, bytes);
  fill_bytes(MemorySpace::device, b.data(), bytes, poison);
  return b;
}

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// bf16 values with random sign, 7 random mantissa bits and exponents spread over ~26 binades
// around a per-row centre (itself spread over 60 binades). Within a 128-value group this gives
// e4m3 normals, subnormals, values that flush to zero, and exact rounding ties (1 value in 16
// has mantissa bits ...1000 below the kept 3 bits); 1 value in 64 is zero.
inline std::vector<bf16> wide_range_bf16(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> centre(127 - 30, 127 + 30), offset(-24, 2), mant(0, 127), coin(0, 63);
  std::vector<bf16> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const int c = centre(rng);
    for (int64_t j = 0; j < cols; ++j) {
      const int roll = coin(rng);
      uint16_t bits = 0;
      if (roll != 0) {
        const int e = std::max(1, std::min(254, c + offset(rng)));
        bits = static_cast<uint16_t>(((roll & 1) << 15) | (e << 7) | mant(rng));
      }
      v[static_cast<size_t>(r * cols + j)] = bf16::from_bits(bits);
    }
  }
  return v;
}

// N(0, stddev^2) rows, each row scaled by its own power of two in [2^-8, 2^8] (activations of
// real layers differ per token by orders of magnitude).
inline std::vector<bf16> normal_rows_bf16(int64_t rows, int64_t cols, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  std::uniform_int_distribution<int> row_exp(-8, 8);
  std::vector<bf16> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float s = std::ldexp(1.0f, row_exp(rng));
    for (int64_t j = 0; j < cols; ++j) v[static_cast<size_t>(r * cols + j)] = float_to_bf16(s * d(rng));
  }
  return v;
}

}  // namespace fp8proj::testing
