// Pointer alignment checks shared by the device ops and backends: the kernels and cuBLASLt move
// 16 bytes per access, so every device operand must start on a 16-byte boundary (cudaMalloc
// gives 256; sub-views keep 16 when their offsets are multiples of 16 bytes).
#pragma once

#include <cstdint>

namespace fp8proj {

inline bool is_aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace fp8proj
