// Internal: how the registry reaches each backend. The CUDA side (src/cuda/) defines
// cuda_backends() only in CUDA builds.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "fp8proj/gemm.hpp"

namespace fp8proj {

const GemmBackend& cpu_reference_backend(GemmKind kind);

// Names of the device backends, known to every build so that `info` can say why one is
// missing.
inline constexpr const char* kDeviceBackendNames[] = {"cublaslt_bf16", "cublaslt_fp8_block", "sm90_fp8_block"};

#if FP8PROJ_WITH_CUDA
// Device backends with the reason each is unusable here ("" when usable).
std::vector<std::pair<const GemmBackend*, std::string>> cuda_backends();
#endif

}  // namespace fp8proj
