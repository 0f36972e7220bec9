// What this process runs on: the GPU (if any), its architecture and the library versions
// that stamp every benchmark result and tuned table.
#pragma once

#include <cstdint>
#include <string>

namespace fp8proj {

struct DeviceInfo {
  bool present = false;
  std::string why_absent;  // when !present: no CUDA in this build, no driver, no GPU ...
  int index = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int sm_count = 0;
  int64_t l2_bytes = 0;
  int64_t global_mem_bytes = 0;
  int64_t smem_optin_bytes = 0;
  int sm_clock_khz = 0, mem_clock_khz = 0;
  std::string driver_version;   // e.g. "13.0"
  std::string runtime_version;  // CUDA runtime the binary was built against
  std::string cublaslt_version;

  std::string arch() const;   // "sm_90"
  // Our FP8 kernels are built for sm_90a only (wgmma, setmaxnreg).
  bool is_sm90() const { return present && cc_major == 9 && cc_minor == 0; }
};

// The current device (cached after the first call).
const DeviceInfo& current_device();
// "" while the CUDA context is usable; after a sticky CUDA error (docs/robustness.md), the text
// of the first one. Every later call that would use the GPU then throws fp8proj::Error with it:
// the process must be restarted.
std::string device_fault_text();
bool built_with_cuda();
std::string fp8proj_version();

}  // namespace fp8proj
