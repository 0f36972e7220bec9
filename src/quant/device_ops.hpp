// Internal: where quant_ops(MemorySpace::device) (include/fp8proj/ops.hpp) comes from. The
// device implementation lives in src/cuda/quant/device_ops.cu and exists in CUDA builds only.
#pragma once

#include "fp8proj/ops.hpp"

namespace fp8proj {

#if FP8PROJ_WITH_CUDA
const QuantOps& cuda_quant_ops();
#endif

}  // namespace fp8proj
