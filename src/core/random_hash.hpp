// The counter-based generator behind fill_normal, shared by the host and device versions.
#pragma once

#include <cmath>
#include <cstdint>

#include "fp8proj/bf16.hpp"

namespace fp8proj::detail {

// SplitMix64 finaliser: a bijective 64-bit mix, good enough for test data.
FP8PROJ_HD uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Box-Muller on two 24-bit uniforms in (0, 1).
FP8PROJ_HD float normal_at(uint64_t seed, uint64_t i) {
  const uint64_t h = mix64(seed * 0x2545f4914f6cdd1dull ^ i);
  const float u1 = (static_cast<float>(h >> 40) + 0.5f) * (1.0f / 16777216.0f);
  const float u2 = (static_cast<float>((h >> 16) & 0xffffffu) + 0.5f) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}

}  // namespace fp8proj::detail
