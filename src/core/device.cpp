#include "fp8proj/device.hpp"

#include <string>

#include "core/device_testing.hpp"
#include "fp8proj/memory.hpp"
#include "fp8proj_git_commit.hpp"  // FP8PROJ_GIT_COMMIT, generated at build time (cmake/git_stamp.cmake)

#if FP8PROJ_WITH_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>
#endif

#ifndef FP8PROJ_VERSION
#define FP8PROJ_VERSION "0.0.0"
#endif

namespace fp8proj {

namespace {
#if FP8PROJ_WITH_CUDA
std::string cuda_version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }
#endif

DeviceInfo query() {
  DeviceInfo d;
#if FP8PROJ_WITH_CUDA
  int runtime = 0, driver = 0;
  cudaRuntimeGetVersion(&runtime);
  d.runtime_version = cuda_version_string(runtime);
  d.cublaslt_version = [] {
    const size_t v = cublasLtGetVersion();  // e.g. 130100 for 13.1.0
    return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
  }();
  if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) {
    d.why_absent = "no NVIDIA driver found";
    cudaGetLastError();
    return d;
  }
  d.driver_version = cuda_version_string(driver);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    d.why_absent = "no CUDA device visible";
    cudaGetLastError();
    return d;
  }
  int dev = 0;
  cudaGetDevice(&dev);
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
    d.why_absent = "cudaGetDeviceProperties failed";
    cudaGetLastError();
    return d;
  }
  d.present = true;
  d.index = dev;
  d.name = p.name;
  d.cc_major = p.major;
  d.cc_minor = p.minor;
  d.sm_count = p.multiProcessorCount;
  d.l2_bytes = p.l2CacheSize;
  d.global_mem_bytes = static_cast<int64_t>(p.totalGlobalMem);
  d.smem_optin_bytes = static_cast<int64_t>(p.sharedMemPerBlockOptin);
  cudaDeviceGetAttribute(&d.sm_clock_khz, cudaDevAttrClockRate, dev);
  cudaDeviceGetAttribute(&d.mem_clock_khz, cudaDevAttrMemoryClockRate, dev);
#else
  d.why_absent = "this build has no CUDA (FP8PROJ_CUDA=OFF)";
#endif
  return d;
}
}  // namespace

std::string DeviceInfo::arch() const {
  return present ? "sm_" + std::to_string(cc_major) + std::to_string(cc_minor) : "none";
}

namespace {
struct Simulated {
  bool on = false;
  int cc_major = 0, cc_minor = 0;
  std::string name;
};
Simulated& simulated() {
  static Simulated s;
  return s;
}
bool& device_read() {
  static bool read = false;
  return read;
}
}  // namespace

const DeviceInfo& current_device() {
  static const DeviceInfo info = [] {
    device_read() = true;
    DeviceInfo d = query();
    const Simulated& s = simulated();
    if (s.on && d.present) {
      d.cc_major = s.cc_major;
      d.cc_minor = s.cc_minor;
      d.name = s.name;
    }
    return d;
  }();
  return info;
}

bool simulate_device_for_testing(int cc_major, int cc_minor, const std::string& name) {
  if (device_read()) return false;
  simulated() = Simulated{true, cc_major, cc_minor, name};
  return true;
}

bool gpu_available() { return current_device().present; }

bool built_with_cuda() { return FP8PROJ_WITH_CUDA != 0; }

std::string fp8proj_version() { return std::string(FP8PROJ_VERSION) + "+" + FP8PROJ_GIT_COMMIT; }

}  // namespace fp8proj
