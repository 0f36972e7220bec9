// Views of the operands that flow between quantizers, GEMM backends and layers, and the
// few index helpers they share. Views never own memory; their pointers live in one
// memory space (host or device) that the owner knows.
//
// Layouts (shape : stride, in elements):
//   weight values     [N, K] : [K, 1]                      e4m3 bytes, row-major
//   weight scales     [ceil(N/128), ceil(K/128)] : [ceil(K/128), 1]   fp32, one per 128x128 block
//   activation values [M, K] : [K, 1]                      e4m3 bytes, row-major
//   activation scales [K/128, M] : [scale_ld, 1]           fp32, one per 1x128 group, M-contiguous
//                     ("MN-major"), scale_ld = round_up(M, 4) as TMA and cuBLASLt want.
//   Example: M = 5, K = 256 -> scale_ld = 8; the scale of token 3, k in [128, 256) is
//   scales[1 * 8 + 3]; entries 5..7 of each row are padding.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fp8proj/bf16.hpp"

namespace fp8proj {

enum class MemorySpace : uint8_t { host, device };

// A cudaStream_t where the memory space is the device; ignored on the host.
using StreamHandle = void*;

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Row stride of the M-contiguous activation scales.
constexpr int64_t activation_scale_ld(int64_t m) { return round_up(m, 4); }

struct Fp8WeightView {
  const uint8_t* values = nullptr;
  const float* scales = nullptr;
  int64_t n = 0, k = 0;

  int64_t scale_rows() const { return ceil_div(n, 128); }
  int64_t scale_cols() const { return ceil_div(k, 128); }
  float scale(int64_t row, int64_t col) const { return scales[(row / 128) * scale_cols() + col / 128]; }
};

struct Fp8ActivationView {
  const uint8_t* values = nullptr;
  const float* scales = nullptr;
  int64_t m = 0, k = 0;
  int64_t scale_ld = 0;

  float scale(int64_t row, int64_t col) const { return scales[(col / 128) * scale_ld + row]; }
};

// The same layout, writable: what a quantizer fills.
struct Fp8ActivationOut {
  uint8_t* values = nullptr;
  float* scales = nullptr;
  int64_t m = 0, k = 0;
  int64_t scale_ld = 0;

  Fp8ActivationView view() const { return {values, scales, m, k, scale_ld}; }
};

struct Fp8WeightOut {
  uint8_t* values = nullptr;
  float* scales = nullptr;
  int64_t n = 0, k = 0;

  Fp8WeightView view() const { return {values, scales, n, k}; }
};

}  // namespace fp8proj
