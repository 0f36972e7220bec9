// Reproducible random test data, generated where it lives (a device kernel for device
// memory: filling gigabytes on the host would dominate a benchmark's set-up time).
// Values are N(0, stddev^2) from a counter-based hash: element i depends only on (seed, i).
#pragma once

#include <cstdint>

#include "fp8proj/bf16.hpp"
#include "fp8proj/tensor.hpp"

namespace fp8proj {

void fill_normal(MemorySpace space, bf16* data, int64_t count, uint64_t seed, float stddev = 1.0f);
void fill_normal(MemorySpace space, float* data, int64_t count, uint64_t seed, float stddev = 1.0f);
// Fills bytes with a pattern (e.g. 0xff: bf16 NaN) to catch outputs that are never written.
void fill_bytes(MemorySpace space, void* data, size_t bytes, uint8_t value);

}  // namespace fp8proj
