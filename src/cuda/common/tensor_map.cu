#include "cuda/common/tensor_map.hpp"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "core/cuda_check.hpp"
#include "fp8proj/error.hpp"

namespace fp8proj {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &status));
    FP8PROJ_CHECK(status == cudaDriverEntryPointSuccess && ptr != nullptr,
                  "cuTensorMapEncodeTiled not found in the CUDA driver (needs a CUDA 12+ driver)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  }();
  return fn;
}

}  // namespace

CUtensorMap make_tensor_map_2d(CUtensorMapDataType dtype, const void* base, uint64_t inner, uint64_t outer,
                               uint64_t row_bytes, uint32_t box_inner, uint32_t box_outer,
                               CUtensorMapSwizzle swizzle, const char* what) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {inner, outer};
  const cuuint64_t strides[1] = {row_bytes};
  const cuuint32_t box[2] = {box_inner, box_outer};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode_fn()(&map, dtype, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  // The driver answers a dead context with its sticky error (700 after an illegal address): that
  // is the fault to report (and latch), not a bad tensor geometry.
  if (r != CUDA_SUCCESS)
    if (const cudaError_t sticky = sticky_cuda_error_now(); sticky != cudaSuccess) CUDA_CHECK(sticky);
  FP8PROJ_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (CUresult ", static_cast<int>(r), ") for ", what,
                ": dims {", inner, ", ", outer, "}, row stride ", row_bytes, " B, box {", box_inner, ", ",
                box_outer, "}");
  return map;
}

}  // namespace fp8proj
