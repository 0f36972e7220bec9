// Test seams, not part of the installed API.
//
// simulate_device_for_testing: make this process's DeviceInfo report another architecture, so
// that the unsupported-GPU behaviour (bf16 everywhere, one reason) is exercised on the GPU at
// hand. Must run before anything reads current_device().
//
// reset_device_fault_for_testing: reopen the device-fault latch (core/device_fault.hpp), so
// that CPU tests can close it with a synthetic text (latch_device_fault) one case after
// another. A real fault leaves the context dead whatever the latch says.
//
// set_pdl_for_testing: launch with or without programmatic dependent launch (core/pdl.hpp)
// regardless of FP8PROJ_PDL, so that one process can compare both; nullopt returns to the knob.
#pragma once

#include <optional>
#include <string>

namespace fp8proj {

// Reports cc_major.cc_minor and `name` instead of the real device (which must be present).
// Returns false, changing nothing, when current_device() was already read.
bool simulate_device_for_testing(int cc_major, int cc_minor, const std::string& name);

void reset_device_fault_for_testing();

void set_pdl_for_testing(std::optional<bool> on);

}  // namespace fp8proj
