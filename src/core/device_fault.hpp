// The device-fault latch (docs/robustness.md, "After a sticky CUDA error"). A sticky CUDA error
// (an illegal address, a trap, an assert, ... : cuda_check.cpp lists them) leaves the CUDA
// context unusable: every later CUDA call returns the same error, and outputs the process
// still holds may be half written. The first check that sees one closes this latch with its
// text; from then on every library entry point that would touch the GPU throws that text
// (check_device_usable) before it calls CUDA again -- no stale output, no call that waits on a
// dead context, one message that names the original cause instead of whichever call noticed.
// Host code only: CPU-only builds compile it (the latch then never closes).
#pragma once

#include <atomic>
#include <string>

namespace fp8proj {

namespace detail {
// Null until the latch closes; then the first fault's text, never freed (other threads may
// hold it), never replaced.
extern std::atomic<const std::string*> device_fault_text;
[[noreturn]] void throw_device_unusable();
}  // namespace detail

// Throws fp8proj::Error "the CUDA context is unusable after an earlier error: <text>; restart
// the process" once the latch is closed. Costs one relaxed atomic load while it is open.
inline void check_device_usable() {
  if (detail::device_fault_text.load(std::memory_order_relaxed) != nullptr) [[unlikely]]
    detail::throw_device_unusable();
}

// For constructors and plan-makers, whose work may not touch the context at all (host-side
// configuration, a cached allocation): throws, and closes the latch, when the context is already
// dead (a fault another library's kernel caused, or one no fp8proj check has seen yet), so that
// no object is made that could only fail later. Costs a cudaMemGetInfo in CUDA builds (defined
// in cuda_check.cpp): not for per-call paths. In CPU-only builds: check_device_usable().
void check_context_alive();

// The latched text, or nullptr while the latch is open.
inline const std::string* device_fault() noexcept {
  return detail::device_fault_text.load(std::memory_order_acquire);
}

// Closes the latch with `text` plus "; " and what the detail hook says, if anything (the first
// call wins; later calls keep the first text) and logs it once at error level. Returns the text
// that is latched.
const std::string& latch_device_fault(const std::string& text);

// What can say more about a fault than the CUDA error: the sm90 GEMM watchdog's report (the
// kernel that hung, gemm/sm90_watchdog.hpp) registers itself here when it is armed. Returns ""
// when it has nothing to add.
using DeviceFaultDetail = std::string (*)();
void set_device_fault_detail(DeviceFaultDetail hook);

// The message check_device_usable() throws for a latched `text`.
std::string device_unusable_message(const std::string& text);

}  // namespace fp8proj
