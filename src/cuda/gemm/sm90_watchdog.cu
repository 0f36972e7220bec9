// The host side of the sm90 GEMM watchdog (gemm/sm90_watchdog.hpp): the record in mapped pinned
// memory, the kernels' parameter, and the report the CUDA error messages append.
#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "core/device_fault.hpp"
#include "fp8proj/log.hpp"
#include "gemm/sm90_watchdog.hpp"

namespace fp8proj::sm90 {

namespace {

// Set once, when the watchdog is armed; read by watchdog_report() from any thread.
std::atomic<const WatchdogRecord*> host_record{nullptr};
std::atomic<uint64_t> armed_timeout_ns{0};

// Once per process. Portable + mapped: one record serves every device (with unified
// addressing the host address is the device address). Never freed: a kernel of any launch may
// write it, and the host reads it after the context is gone.
WatchdogParams arm() {
  WatchdogParams out;
  const uint64_t timeout_ns = watchdog_timeout_ns_from_env();
  if (timeout_ns == 0) return out;  // off: waits are unbounded
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, sizeof(WatchdogRecord), cudaHostAllocMapped | cudaHostAllocPortable);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    log(LogLevel::warn, std::string("the GEMM watchdog is off: its record could not be allocated in mapped host "
                                    "memory (") + cudaGetErrorName(e) + "); a hung kernel would hang its caller");
    return out;
  }
  auto* record = static_cast<WatchdogRecord*>(p);
  *record = WatchdogRecord{};
  void* device_ptr = nullptr;
  if (cudaHostGetDevicePointer(&device_ptr, p, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    device_ptr = p;  // unified addressing (every sm_90 system): the same address
  }
  out.record = static_cast<WatchdogRecord*>(device_ptr);
  out.timeout_ns = timeout_ns;
  armed_timeout_ns.store(timeout_ns, std::memory_order_relaxed);
  host_record.store(record, std::memory_order_release);
  set_device_fault_detail(&watchdog_report);
  return out;
}

}  // namespace

WatchdogParams watchdog_params() {
  static const WatchdogParams params = arm();
  return params;
}

std::string watchdog_report() {
  const WatchdogRecord* r = host_record.load(std::memory_order_acquire);
  if (r == nullptr) return "";
  // The kernel writes the fields, fences (system scope), then the magic: a complete record or none.
  const auto* src = reinterpret_cast<const volatile uint32_t*>(r);
  if (src[offsetof(WatchdogRecord, magic) / 4] != kWatchdogMagic) return "";  // none, or half written
  WatchdogRecord copy;
  auto* dst = reinterpret_cast<uint32_t*>(&copy);
  for (size_t i = 0; i < sizeof(WatchdogRecord) / 4; ++i) dst[i] = src[i];
  return format_watchdog_record(copy, armed_timeout_ns.load(std::memory_order_relaxed));
}

}  // namespace fp8proj::sm90
