// TMA descriptors (CUtensorMap) for 2D row-major tensors, encoded on the host through the
// driver entry point that cudaGetDriverEntryPointByVersion returns, so nothing links libcuda.
// One place for the sm90 GEMM launcher and the GEMM harness's probes.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace fp8proj {

// Tensor [outer][inner] (elements of `dtype`) at `base` with a row stride of `row_bytes`; TMA
// box {box_inner, box_outer}. Out-of-bounds loads read zeros (OOB fill NONE;
// NAN_REQUEST_ZERO_FMA would read NaN), out-of-bounds stores are dropped. Throws
// fp8proj::Error naming `what` and the geometry when the driver rejects it.
CUtensorMap make_tensor_map_2d(CUtensorMapDataType dtype, const void* base, uint64_t inner, uint64_t outer,
                               uint64_t row_bytes, uint32_t box_inner, uint32_t box_outer,
                               CUtensorMapSwizzle swizzle, const char* what);

}  // namespace fp8proj
