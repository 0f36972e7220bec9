// Helpers shared by the CPU tests: random data and independent (naive, fp64) references.
#pragma once

#include <cmath>
#include <random>
#include <vector>

#include "fp8proj/bf16.hpp"
#include "fp8proj/formats.hpp"

namespace fp8proj::testing {

inline std::vector<bf16> random_bf16(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<bf16> v(n);
  for (auto& x : v) x = float_to_bf16(d(rng));
  return v;
}

// Nearest e4m3 value by exhaustive search over the 126 non-negative finite codes (ties to the
// even code), after saturation: independent of float_to_e4m3's bit manipulation.
inline uint8_t naive_e4m3(double x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::min(std::fabs(x), 448.0);
  int best = 0;
  double best_d = INFINITY;
  for (int c = 0; c <= 0x7e; ++c) {
    const double d = std::fabs(static_cast<double>(e4m3_to_float(static_cast<uint8_t>(c))) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return static_cast<uint8_t>(sign | best);
}

// The scale rule through frexp: the smallest power of two >= fl32(max(amax, eps) / 448).
inline float naive_ue8m0_scale(float amax, float eps) {
  const float q = (amax > eps ? amax : eps) / 448.0f;
  int e;
  const float mant = std::frexp(q, &e);
  return std::ldexp(1.0f, mant == 0.5f ? e - 1 : e);
}

// The fp32 ("float") scale rule through fp64: fl32(max(amax, eps) / 448). A quotient of two
// floats computed in double and rounded once to float is the correctly rounded fp32 quotient
// (53 >= 2 * 24 + 2 bits), so this is an independent oracle of the IEEE fp32 division.
inline float naive_fp32_scale(float amax, float eps) {
  return static_cast<float>(double(amax > eps ? amax : eps) / 448.0);
}
// e4m3(fl32(x / s)) by the same route.
inline uint8_t naive_fp32_code(float x, float s) { return naive_e4m3(double(static_cast<float>(double(x) / s))); }

}  // namespace fp8proj::testing
