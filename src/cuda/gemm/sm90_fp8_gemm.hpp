// Host API of our Hopper FP8 block-scaled GEMM (the `sm90_fp8_block` backend).
//
//   D[M,N] (bf16) = sum_kb a_scales[kb][m] * b_scales[n/128][kb] * (A[m, kb-block] . B[n, kb-block])
// N % 16 == 0 and K % 128 == 0 (fp8_block_shape_reason, gemm.hpp): the last 128-row weight
// block may be partial, with its own scale row.
//
// Choosing a configuration is the heuristic's job (gemm/sm90_fp8_heuristic.hpp: candidates,
// rank, choose, forced); run() executes exactly the configuration it is given. run() does
// not allocate and does not synchronise: it can be captured in a CUDA graph. It encodes four
// TMA descriptors on the host per call (~microseconds) through the driver entry point
// obtained with cudaGetDriverEntryPoint, so the library does not link libcuda.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "gemm/sm90_fp8_heuristic.hpp"

namespace fp8proj::sm90 {

struct Fp8GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const uint8_t* a = nullptr;         // e4m3 [m, k] row-major
  const float* a_scales = nullptr;    // [k/128][a_scale_ld], entry (kb, i) scales A[i, 128kb .. 128kb+127]
  int64_t a_scale_ld = 0;             // >= m, multiple of 4 (16-byte TMA row stride); pads never read
  const uint8_t* b = nullptr;         // e4m3 [n, k] row-major (the weight)
  const float* b_scales = nullptr;    // [ceil(n/128)][k/128] row-major
  void* d = nullptr;                  // bf16 [m, n] row-major, fully overwritten
};

// Runs cfg on stream. Throws fp8proj::Error (naming the argument) when N is not a multiple of
// 16 or K not a multiple of 128, a pointer is null or not 16-byte aligned, a_scale_ld is too small or not a
// multiple of 4, cfg cannot run this problem, the split-K workspace is missing or too small,
// or the device is not sm_90; and, before anything else, when an earlier sticky CUDA error left
// the context unusable (core/device_fault.hpp). M = 0 returns without launching.
// Each CTA's pipeline is watched by the hang watchdog (gemm/sm90_watchdog.hpp); the first launch
// of the process arms it (an allocation: make a plan first if that launch may be inside a CUDA
// graph capture).
// workspace: workspace_bytes(cfg, m, n, k) bytes (0 => may be null), 16-byte aligned, and
// zero-filled once when allocated (its tile counters return to zero after every launch).
// Calls on one workspace must be stream-ordered.
void run(const Fp8GemmArgs& args, const Config& cfg, void* workspace, size_t workspace_size, int num_sms,
         cudaStream_t stream);

}  // namespace fp8proj::sm90
