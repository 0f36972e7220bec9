// The hang watchdog of the sm90 FP8 GEMM kernels (docs/robustness.md, "Hang watchdog").
//
// A pipeline barrier that never completes (a transaction-byte count that is never reached, a
// lost arrival) would leave the kernel, and every host call that waits for it, stuck forever.
// Each CTA of the sm90 GEMM kernels runs a watchdog on one otherwise idle thread of its
// producer warpgroup (kernels/sm90_fp8_common.cuh, run_watchdog): it samples the phases of the
// CTA's pipeline barriers, and when none has changed for the timeout it writes a
// WatchdogRecord and traps. The waits themselves, and the consumers' main loops, are the same
// instructions as without it. The trap is a sticky CUDA error; the host's CUDA_CHECK then
// appends watchdog_report() (the kernel configuration as Config::name() prints it, the
// problem, the block and the barrier the pipeline stopped at) to its message, and the
// device-fault latch keeps it for every later call (core/device_fault.hpp).
//
// The record lives in pinned host memory mapped into the device (cudaHostAllocMapped), so the
// host can still read it when the context is dead. The kernels learn its address and the
// timeout through a kernel parameter (WatchdogParams): captured CUDA graphs replay with it
// unchanged. A legitimate pipeline flips a barrier every few microseconds; the default limit,
// 10 s (FP8PROJ_WATCHDOG_MS), is far from both.
//
// This header is plain C++ (the struct is also written by device code); the allocation and
// the report are CUDA-side (cuda/gemm/sm90_watchdog.cu).
#pragma once

#include <cstdint>
#include <string>

namespace fp8proj::sm90 {

inline constexpr uint32_t kWatchdogMagic = 0x474f4457u;  // "WDOG": the record is complete
enum WatchdogKernel : uint32_t { kWatchdogGemm1d2d = 1, kWatchdogSwapAB = 2 };

// The kernel configuration (gemm_config.hpp's Config fields) in one 64-bit word, a compile-time
// constant of each kernel. fixed_kb: K / 128 for the kernels compiled for one K (FixedK), else 0.
struct WatchdogConfig {
  uint32_t kernel = 0, block_m = 0, block_n = 0, math_wgs = 0, stages = 0, cluster = 1;
  bool cluster_on_n = false, carry = false;
  uint32_t fixed_kb = 0;
};
constexpr uint64_t pack_watchdog_config(const WatchdogConfig& c) {
  return uint64_t{c.kernel & 0xffu} | uint64_t{c.block_m & 0x3ffu} << 8 | uint64_t{c.block_n & 0x3ffu} << 18 |
         uint64_t{c.math_wgs & 0xfu} << 28 | uint64_t{c.stages & 0xffu} << 32 | uint64_t{c.cluster & 0xfu} << 40 |
         uint64_t{c.cluster_on_n ? 1u : 0u} << 44 | uint64_t{c.carry ? 1u : 0u} << 45 |
         uint64_t{c.fixed_kb & 0xffffu} << 48;
}
constexpr WatchdogConfig unpack_watchdog_config(uint64_t v) {
  WatchdogConfig c;
  c.kernel = static_cast<uint32_t>(v & 0xffu);
  c.block_m = static_cast<uint32_t>(v >> 8 & 0x3ffu);
  c.block_n = static_cast<uint32_t>(v >> 18 & 0x3ffu);
  c.math_wgs = static_cast<uint32_t>(v >> 28 & 0xfu);
  c.stages = static_cast<uint32_t>(v >> 32 & 0xffu);
  c.cluster = static_cast<uint32_t>(v >> 40 & 0xfu);
  c.cluster_on_n = (v >> 44 & 1u) != 0;
  c.carry = (v >> 45 & 1u) != 0;
  c.fixed_kb = static_cast<uint32_t>(v >> 48 & 0xffffu);
  return c;
}

// Written by the kernel's watchdog thread (kernels/sm90_fp8_common.cuh, run_watchdog).
struct WatchdogRecord {
  // kWatchdogMagic once every field below is written (it is written last, after a system-scope
  // fence; the first CTA to find its pipeline stuck writes the record).
  uint32_t magic;
  uint32_t reserved;
  uint64_t config;                 // pack_watchdog_config
  uint32_t m, n, k, split_k;       // the launch's problem, as WatchdogParams holds it
  uint32_t block;                  // blockIdx.x of the CTA whose pipeline stopped
  uint32_t full_parity;            // bit s: the phase parity of full[s] (0: phases 0, 2, ... current)
  uint32_t empty_parity;           // bit s: the same for empty[s]
  uint32_t reserved2;
  uint64_t waited_ns;              // %globaltimer time since any of those barriers last changed phase
};

// The kernels' parameter. record == nullptr or timeout_ns == 0 (FP8PROJ_WATCHDOG_MS=0, the
// default): the launcher runs the kernels built without the watchdog (watchdog_armed), whose
// code is that of the kernels before it, and a hung kernel hangs. The launcher fills in the
// problem for the record.
struct WatchdogParams {
  WatchdogRecord* record = nullptr;
  uint64_t timeout_ns = 0;
  uint32_t m = 0, n = 0, k = 0, split_k = 1;
};

// FP8PROJ_WATCHDOG_MS (env.hpp: default kDefaultWatchdogMs, 0 = off) in nanoseconds. Throws
// fp8proj::Error naming the variable when it is malformed.
uint64_t watchdog_timeout_ns_from_env();

// For a complete record, e.g. "watchdog: sm90_fp8_gemm m128n192_ws2_st4 (M=777 N=24576 K=1536)
// block 17: no pipeline barrier completed a phase for 10.0 s; next: full[2] parity 0, empty[0]
// parity 1 (phase parities full 1100, empty 1111; FP8PROJ_WATCHDOG_MS=10000)". "next" is the
// barrier a pipeline in step completes next -- the one its waiters wait on. timeout_ns: the
// limit the kernel ran with.
std::string format_watchdog_record(const WatchdogRecord& r, uint64_t timeout_ns);

// ---- CUDA builds (cuda/gemm/sm90_watchdog.cu) ----
// The parameter every launch passes (its m, n, k, split_k still to be set): reads
// FP8PROJ_WATCHDOG_MS and allocates the record at the first call of the process -- an
// allocation, so call it before any CUDA graph capture, e.g. from a plan's constructor, as
// Sm90Plan does; later calls only read. When the allocation fails the watchdog is off, said
// once in the log.
WatchdogParams watchdog_params();
// Whether a launch with these parameters runs the kernel built with the watchdog.
inline bool watchdog_armed(const WatchdogParams& p) { return p.record != nullptr && p.timeout_ns != 0; }
// "" until a kernel has written the record, then format_watchdog_record of it.
std::string watchdog_report();

}  // namespace fp8proj::sm90
