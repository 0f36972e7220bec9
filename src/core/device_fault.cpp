#include "core/device_fault.hpp"

#include <mutex>
#include <vector>

#include "core/device_testing.hpp"
#include "fp8proj/device.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/log.hpp"

namespace fp8proj {

namespace {
std::atomic<DeviceFaultDetail> fault_detail{nullptr};
}  // namespace

namespace detail {
std::atomic<const std::string*> device_fault_text{nullptr};

void throw_device_unusable() {
  throw Error(device_unusable_message(*device_fault_text.load(std::memory_order_acquire)));
}
}  // namespace detail

std::string device_unusable_message(const std::string& text) {
  return "fp8proj: the CUDA context is unusable after an earlier error: " + text + "; restart the process";
}

void set_device_fault_detail(DeviceFaultDetail hook) { fault_detail.store(hook, std::memory_order_release); }

const std::string& latch_device_fault(const std::string& text) {
  if (const std::string* earlier = device_fault()) return *earlier;
  std::string full = text;
  if (DeviceFaultDetail hook = fault_detail.load(std::memory_order_acquire)) {
    const std::string more = hook();
    if (!more.empty()) full += "; " + more;
  }
  const std::string* mine = new std::string(std::move(full));
  const std::string* expected = nullptr;
  if (!detail::device_fault_text.compare_exchange_strong(expected, mine, std::memory_order_acq_rel)) {
    delete mine;  // another thread latched first: its text stands
    return *expected;
  }
  log(LogLevel::error, "the CUDA context is unusable: " + *mine +
                           "; every later fp8proj call that would use the GPU fails with this error");
  return *mine;
}

std::string device_fault_text() {
  const std::string* t = device_fault();
  return t ? *t : std::string();
}

void reset_device_fault_for_testing() {
  // The old text is kept, not freed (a thread may still be reading it), and reachable: leak
  // checkers see a retired text, not a leak.
  static auto* retired = new std::vector<const std::string*>();
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (const std::string* old = detail::device_fault_text.exchange(nullptr, std::memory_order_acq_rel))
    retired->push_back(old);
}

#if !FP8PROJ_WITH_CUDA
// No context to probe in a CPU-only build (cuda_check.cpp defines it in CUDA builds).
void check_context_alive() { check_device_usable(); }
#endif

}  // namespace fp8proj
