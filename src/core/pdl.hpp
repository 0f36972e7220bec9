// Programmatic dependent launch (PDL, Hopper): whether fp8proj launches its kernels with
// cudaLaunchAttributeProgrammaticStreamSerialization (FP8PROJ_PDL, env.hpp).
//
// With it, a kernel may be scheduled while the kernel before it in the stream is still running:
// its CTAs run their prologue (barrier init, tensor-map prefetch, shared-memory carve-up) and
// then stop in `griddepcontrol.wait` until the previous grid has completed and its memory is
// visible. At decode (M <= 64) a GEMM reads a few MB in 7-9 us, much of it fixed per-kernel cost
// (issue #40), which the overlap hides. The device side and its rule are in cuda/common/pdl.cuh;
// the launch helper in cuda/common/launch.hpp. Under stream capture the attribute becomes a
// programmatic edge of the CUDA graph, so graph replay gets the same overlap.
#pragma once

namespace fp8proj {

// FP8PROJ_PDL (default env::kDefaultPdl), read at the first call of the process; a malformed
// value throws fp8proj::Error naming the variable (at the first launch that asks). The testing
// override (core/device_testing.hpp) wins while set.
bool pdl_enabled();

}  // namespace fp8proj
