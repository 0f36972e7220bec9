// Test seam: make this process's DeviceInfo report another architecture, so that the
// unsupported-GPU behaviour (bf16 everywhere, one reason) is exercised on the GPU at hand.
// Must run before anything reads current_device(); not part of the installed API.
#pragma once

#include <string>

namespace fp8proj {

// Reports cc_major.cc_minor and `name` instead of the real device (which must be present).
// Returns false, changing nothing, when current_device() was already read.
bool simulate_device_for_testing(int cc_major, int cc_minor, const std::string& name);

}  // namespace fp8proj
