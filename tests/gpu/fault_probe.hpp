// Shared by the fault probe's scenarios (tests/gpu/fault_probe.cpp, test_faults.py).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace fault_probe {

// One library call after a sticky fault. It must throw (or, for the C ABI, return -1: the
// lambda throws fp8proj_last_error()); returning normally means it did no work, or returned
// stale output, without saying so.
struct Surface {
  std::string name;
  std::function<void()> call;
};

// Runs every surface, the one FAULT_PROBE_FIRST names first (it is the one that meets the fault
// unannounced), and checks each: it fails, within kLimitMs, with a message naming the fault
// (`marker`); every later one with the latched text ("unusable after an earlier error").
// Prints one line per surface; returns 0 when all pass.
int check_surfaces(std::vector<Surface> surfaces, const std::string& marker);

// The fault of FAULT_PROBE_FAULT (0: illegal address, default; 1: trap), made by the test
// library libfp8proj_fault_inject (tests/gpu/fault_inject.cu) and waited for here, as an
// engine waits for its own kernels: the library has not seen it. Returns the CUDA error name
// the later calls must report, or "" (with a message) when no fault happened.
std::string inject_fault();

// Scenarios: the C++ library (the layer probe) and the C ABI (the capi probe).
int sticky_scenario();
#ifndef FP8PROJ_PROBE_CAPI
int hang_scenario();
#endif

}  // namespace fault_probe
