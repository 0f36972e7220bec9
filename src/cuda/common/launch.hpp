// Kernel launches with programmatic dependent launch when FP8PROJ_PDL asks for it (core/pdl.hpp):
// cudaLaunchKernelEx with cudaLaunchAttributeProgrammaticStreamSerialization = 1, plus a
// cluster dimension where the kernel needs one. Every kernel launched here follows the rule of
// cuda/common/pdl.cuh (it waits before touching global memory). Off, it is a plain launch.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "core/cuda_check.hpp"
#include "core/pdl.hpp"
#include "fp8proj/device.hpp"

namespace fp8proj::gpu {

struct LaunchShape {
  dim3 grid;
  dim3 block;
  size_t smem = 0;
  cudaStream_t stream = nullptr;
  unsigned cluster = 1;  // CTAs per cluster along x
};

// Whether a kernel whose dependent is a GEMM of one-SM CTAs may release it right after its own
// wait (cuda/common/pdl.cuh, rule 3) or only after its stores: early only from a grid that holds
// at most a quarter of the SMs. Released early from a larger grid, the GEMM's CTAs started split
// around it and lost more than the overlap gained (the activation quantizer before DeepSeek-V3
// o_proj TP 1, M = 33-64: quantize + GEMM 42 -> 56 us; the absorbed value projection writing
// o_proj's FP8 input at TP 1: the decode step 8 us slower; bench/results/decode/pdl-trigger/,
// bench/results/decode/absorb-quant/).
inline bool release_dependents_early(int64_t grid_ctas) { return grid_ctas * 4 <= current_device().sm_count; }

template <class... Params, class... Args>
void launch_kernel(const LaunchShape& s, void (*kernel)(Params...), Args&&... args) {
  cudaLaunchConfig_t lc{};
  lc.gridDim = s.grid;
  lc.blockDim = s.block;
  lc.dynamicSmemBytes = s.smem;
  lc.stream = s.stream;
  cudaLaunchAttribute attrs[2]{};
  unsigned n = 0;
  if (s.cluster > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = s.cluster;
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl_enabled()) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  lc.attrs = attrs;
  lc.numAttrs = n;
  CUDA_CHECK(cudaLaunchKernelEx(&lc, kernel, std::forward<Args>(args)...));
}

}  // namespace fp8proj::gpu
