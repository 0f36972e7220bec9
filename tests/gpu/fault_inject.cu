// Test only: a real sticky CUDA fault, made the way an engine's own kernel would make one, for
// the fault probes (tests/gpu/test_faults.py). A shared library with a C entry point, so that the
// C++ probes, the C ABI probe and a Python (ctypes) caller inject the same fault.
//
//   int fp8proj_test_inject_fault(int kind)
//     kind 0: one thread stores to an unmapped address (cudaErrorIllegalAddress)
//     kind 1: one thread executes a trap (cudaErrorLaunchFailure)
//   Launches on the legacy default stream and returns the launch's status (0: launched); the
//   fault itself is reported asynchronously, by the next call that waits for the GPU.
#include <cuda_runtime.h>

#include <cstdint>

namespace {

__global__ void store_to_unmapped(uintptr_t address) { *reinterpret_cast<volatile int*>(address) = 1; }

__global__ void trap_now() { __trap(); }

}  // namespace

extern "C" __attribute__((visibility("default"))) int fp8proj_test_inject_fault(int kind) {
  // 16 bytes into the first page: never mapped for the device (the same address a null-pointer
  // bug dereferences).
  if (kind == 0)
    store_to_unmapped<<<1, 1>>>(uintptr_t{16});
  else
    trap_now<<<1, 1>>>();
  return static_cast<int>(cudaGetLastError());
}
