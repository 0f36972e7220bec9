// Device side of programmatic dependent launch (core/pdl.hpp), PTX griddepcontrol (sm_90+).
//
// THE RULE, for every kernel launched through cuda/common/launch.hpp:
//   1. Before pdl_wait() a kernel touches no global memory that another kernel writes or reads:
//      only its own parameters (tensor maps included: `prefetch.tensormap` of a __grid_constant__
//      map is fine), shared memory, barriers and index math. No load of an input, no store of
//      an output, no workspace counter, and no weight either: a weight (or its scales) may have
//      been written by a kernel just before (load-time quantization, a checkpoint copy), and a
//      read before the wait would race with it. Prefetching weights early is a separate change
//      that must know the weight is settled.
//   2. Every CTA executes pdl_wait() unconditionally, before any early exit. A grid is complete
//      only when all its CTAs are, so a kernel whose CTAs all waited completes after the kernel
//      it depends on: the chain stays transitive (C waiting on B also sees A's writes).
//   3. pdl_launch_dependents() only lets the NEXT kernel get scheduled and run its own pre-wait
//      prologue; that kernel's wait still waits for this grid's completion and memory flush, so
//      where the trigger sits never affects correctness -- only how early the next prologue may
//      start. We trigger right after the wait: at that point every CTA of this grid is resident
//      (a CTA triggers only once it runs), so the dependents fill SMs this grid leaves free.
//      Except a kernel whose dependent is a GEMM of one-SM CTAs (the activation quantizer, the
//      fused RMSNorm + quantization, the absorbed value projection writing o_proj's FP8 input)
//      when its grid holds more than a quarter of the SMs: the GEMM released then started split
//      around it and lost more than it gained, so it triggers after its stores (launch.hpp,
//      release_dependents_early).
// Without the launch attribute (FP8PROJ_PDL=0) both instructions are no-ops: the same kernels
// serve both modes. In SASS, griddepcontrol.wait is ACQBULK and launch_dependents PREEXIT
// (nvdisasm, CUDA 13; tests/kernels/check_kernels.py checks they are present).
#pragma once

namespace fp8proj::gpu {

// Waits until every grid this one depends on has completed and its writes are visible. The
// "memory" clobber keeps the compiler from moving loads or stores of this thread above it.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// This CTA no longer holds back the scheduling of the dependent grid (first call counts).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Both, in the order rule 3 gives: what a kernel calls where its prologue ends.
__device__ __forceinline__ void pdl_wait_then_release() {
  pdl_wait();
  pdl_launch_dependents();
}

}  // namespace fp8proj::gpu
