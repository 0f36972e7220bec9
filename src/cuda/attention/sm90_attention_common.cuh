// Building blocks of the sm90 attention kernels (prefill_attention.cu, decode_attention.cu):
// cp.async loads into 128-byte-swizzled shared-memory tiles, WGMMA descriptors for those tiles,
// the online softmax on a warpgroup's 64-row score fragment, and the epilogue that writes a
// normalized output tile through shared memory.
//
// Shared-memory tile ("SW128 tile"), R rows x C bf16 columns, C % 64 == 0, R % 8 == 0, base
// 1024-byte aligned: C/64 column panels of R rows x 128 bytes, one after another; inside a panel,
// the 16-byte unit u (columns 8u..8u+7 of the panel) of row r sits at r*128 + ((u ^ (r%8)) * 16).
//   Example, R = 64, C = 256 (a K tile of 64 keys x d_qk 256): element (r=9, c=200) lies in panel
//   3 (cols 192..255), unit 1, so at byte 3*8192 + 9*128 + ((1 ^ 1) * 16) + 0*2 = 25728.
// This is the layout the hardware's 128-byte swizzle (Swizzle<3,4,3> on byte addresses) expects,
// so one tile serves WGMMA as either operand kind:
//   K-major (rows = M or N, columns = K):   S = Q.K^T reads Q and K tiles this way; a k16 step
//     kk starts at panel kk/4, byte (kk%4)*32; 8-row groups are 1024 B apart (SBO).
//   N-major (rows = K, columns = N):        O += P.V reads the V tile (rows = keys) this way; a
//     k16 step is 16 rows = 2048 B; 8-key groups are 1024 B apart (SBO); 64-column panels are
//     R*128 B apart (LBO).
// Rows past the end of a sequence are zero-filled by cp.async (src-size 0), never read from
// global memory: finite zeros keep 0 * V finite and the masked scores exact.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/attention/sm90_wgmma_bf16.cuh"
#include "cuda/kernels/ptx/fence.cuh"
#include "cuda/kernels/ptx/wgmma.cuh"
#include "fp8proj/bf16.hpp"

namespace fp8proj::gpu::attn {

constexpr int kWarpgroupThreads = 128;
// Usable dynamic shared memory per block on sm_90 (227 KB), less the 1 KB we keep to round the
// dynamic base up to the 1024-byte alignment the 128-byte swizzle needs.
constexpr int kSmemLimitBytes = 227 * 1024 - 1024;

// ---- PTX wrappers -----------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1 (.cg); src_bytes = 0 zero-fills without reading.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// cp.async writes shared memory through the generic proxy and WGMMA reads it through the async
// proxy: each thread fences its completed copies (ptx::fence_proxy_async_shared) before the
// barrier that hands them over. The wgmma fence/commit/wait trio and that fence are the GEMM's
// PTX layer (src/cuda/kernels/ptx/), shared rather than written twice.
using sm90::ptx::fence_proxy_async_shared;
using sm90::ptx::wgmma_commit_group;
using sm90::ptx::wgmma_fence;
using sm90::ptx::wgmma_wait_group;

// Pins register values to a point in the instruction stream (CUTLASS's
// warpgroup_fence_operand): after the wait the accumulators were written asynchronously and must
// not be read earlier; before wgmma_fence the registers a wgmma reads (O after its rescale, P)
// must be final, since the fence orders only accesses that precede it.
template <int N>
__device__ __forceinline__ void reg_fence(float (&d)[N]) {
  sm90::ptx::fence_operands(d);
}

template <int N>
__device__ __forceinline__ void reg_fence(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// 2^x on the MUFU unit; 2^-inf = +0, which the masking relies on.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (low half) = lo
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- SW128 tiles and their descriptors -----------------------------------------------------------

template <int R>
__device__ __forceinline__ uint32_t sw128_offset(int row, int unit) {
  return static_cast<uint32_t>((unit >> 3) * (R * 128) + row * 128 + (((unit & 7) ^ (row & 7)) << 4));
}

// Descriptor bits (PTX ISA "matrix descriptor"): 0-13 start address >> 4, 16-29 leading byte
// offset >> 4, 32-45 stride byte offset >> 4, 49-51 base offset (0: tiles are 1024-aligned),
// 62-63 layout (1 = 128-byte swizzle). Shared addresses are < 228 KB, so 14 bits hold them.
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo_bytes >> 4) & 0x3FFF) << 32) | (uint64_t{1} << 62);
}
// K-major operand: the leading offset is unused for swizzled K-major layouts (set to 1 unit).
__device__ __forceinline__ uint64_t desc_kmajor(uint32_t addr) { return make_desc(addr, 16, 1024); }
// N-major operand (V): LBO = distance between 64-column panels, SBO = 8 rows of 128 B.
__device__ __forceinline__ uint64_t desc_nmajor(uint32_t addr, uint32_t panel_bytes) {
  return make_desc(addr, panel_bytes, 1024);
}
// The same descriptor `bytes` further on: only the start-address field moves. Building each
// k-step's descriptor from a base this way costs one 64-bit add of an immediate instead of the
// ~12 uniform instructions of make_desc (measured in the SASS of the decode loop: 36 k-steps).
// No carry leaves the 14-bit field: every address stays inside the 228 KB shared window.
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// Issues the cp.async of rows [0, R) x columns [0, C) of a row-major bf16 matrix into an SW128
// tile: row r is read from src + r * row_stride (elements); rows r >= valid_rows are zero-filled.
// Thread t copies unit t % 8 of rows t / 8 + j * (kThreads / 8) in every panel: a warp reads 4
// full 128-byte row segments per copy, and all of a thread's copies are one base address plus
// constant offsets (a general index -> (row, unit) walk kept 18 addresses live in the decode
// kernel and spilled).
template <int R, int C, int kThreads>
__device__ __forceinline__ void load_tile(uint32_t tile, const bf16* src, int64_t row_stride, int valid_rows,
                                          int tid) {
  static_assert(C % 64 == 0 && R % 8 == 0, "SW128 tiles are 64-column panels of 8-row groups");
  constexpr int kRowsPerStep = kThreads / 8;
  static_assert(kRowsPerStep % 8 == 0 && R % kRowsPerStep == 0, "row steps keep row % 8 (the swizzle phase)");
  const int u = tid % 8, r0 = tid / 8;
  const uint32_t dst0 = tile + r0 * 128 + ((u ^ (r0 & 7)) << 4);
#pragma unroll
  for (int j = 0; j < R / kRowsPerStep; ++j) {
    const int r = r0 + j * kRowsPerStep;
    const bool valid = r < valid_rows;
    const bf16* row = src + r * row_stride + u * 8;
#pragma unroll
    for (int panel = 0; panel < C / 64; ++panel)
      cp_async_16(dst0 + panel * (R * 128) + j * (kRowsPerStep * 128), valid ? row + panel * 64 : src, valid ? 16 : 0);
  }
}

// ---- online softmax on one warpgroup's 64 x N score fragment -----------------------------------
//
// Each thread holds two rows (h = 0, 1: rows g and g + 8 of its warp's 16); the four threads of
// a quad (lanes 4g..4g+3) hold the rest of those rows, so row reductions are two xor-shuffles.
// m is the running row maximum of scale*log2(e)*s (exact: multiplying by a positive constant
// commutes with max), l the thread's share of the row sum, both fp32.
struct SoftmaxRows {
  float m[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.0f, 0.0f};
};

// The maxima of the thread's two rows over a 64 x N score fragment, unscaled (quad-reduced).
template <int N>
__device__ __forceinline__ void row_max(const float (&s)[N / 2], float (&mx)[2]) {
  mx[0] = mx[1] = -INFINITY;
#pragma unroll
  for (int i = 0; i < N / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) mx[h] = fmaxf(mx[h], fmaxf(s[4 * i + 2 * h], s[4 * i + 2 * h + 1]));
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
  }
}

// Multiplies the thread's two rows of an output accumulator by alpha (the rescale of the online
// softmax). kSkipUnchanged: not where every row of the warp kept its maximum (alpha == 1 exactly,
// the product would be the same bits) -- the decode kernel, whose running maxima settle after a
// few key blocks; the prefill kernel's causal tiles measured slower with the vote (docs/decode.md).
template <bool kSkipUnchanged, int NO>
__device__ __forceinline__ void rescale_rows(float (&o)[NO], const float (&alpha)[2]) {
  if constexpr (kSkipUnchanged) {
    if (!__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
  }
#pragma unroll
  for (int i = 0; i < NO / 4; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      o[4 * i + 2 * h] *= alpha[h];
      o[4 * i + 2 * h + 1] *= alpha[h];
    }
}

// Turns the scores s (masked entries already -inf) into probabilities packed as the bf16 A
// fragments of P.V, rescales the output accumulators o, and updates the row state; alpha returns
// the rescale factors of the thread's two rows (for a warpgroup that accumulates other output
// columns of the same rows).
template <int N, int NO, bool kSkipUnchanged = false>
__device__ __forceinline__ void online_softmax(float (&s)[N / 2], float (&o)[NO], SoftmaxRows& st, float scale_log2,
                                               uint32_t (&p)[N / 4], float (&alpha)[2]) {
  float mx[2], base[2];
  row_max<N>(s, mx);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float m_new = fmaxf(st.m[h], mx[h] * scale_log2);
    // A row with every score so far masked keeps m = -inf; subtracting 0 instead keeps
    // exp2(-inf - m) = 0 rather than NaN.
    base[h] = m_new == -INFINITY ? 0.0f : m_new;
    alpha[h] = fast_exp2(st.m[h] - base[h]);
    st.m[h] = m_new;
    st.l[h] *= alpha[h];
  }
#pragma unroll
  for (int i = 0; i < N / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float& x = s[4 * i + 2 * h + c];
        x = fast_exp2(fmaf(x, scale_log2, -base[h]));
        st.l[h] += x;
      }
  rescale_rows<kSkipUnchanged>(o, alpha);
#pragma unroll
  for (int j = 0; j < N / 4; ++j) p[j] = pack_bf16x2(s[2 * j], s[2 * j + 1]);
}

template <int N, int NO>
__device__ __forceinline__ void online_softmax(float (&s)[N / 2], float (&o)[NO], SoftmaxRows& st, float scale_log2,
                                               uint32_t (&p)[N / 4]) {
  float alpha[2];
  online_softmax<N, NO>(s, o, st, scale_log2, p, alpha);
}

// Full row sums (the quad's shares added), after the last key block.
__device__ __forceinline__ void finish_rows(SoftmaxRows& st) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 1);
    st.l[h] += __shfl_xor_sync(0xffffffffu, st.l[h], 2);
  }
}

// ---- epilogue ------------------------------------------------------------------------------------

// Writes a warpgroup's 64 x NV accumulator tile, each row multiplied by inv_l, as bf16 into a
// row-major staging area (rows 0..63 of `stage`, columns col0.., `pitch` bytes per row). A pitch
// of 16 * (odd number) bytes puts the 8 rows a warp writes per instruction on distinct banks
// (e.g. NV = 256: pitch 528 B = 132 words, rows 4 banks apart).
template <int NV>
__device__ __forceinline__ void stage_tile_bf16(uint8_t* stage, int pitch, int col0, const float (&o)[NV / 2],
                                                const float (&inv_l)[2], int wg_tid) {
  const int w = wg_tid / 32, lane = wg_tid % 32, g = lane / 4, q = lane % 4;
#pragma unroll
  for (int i = 0; i < NV / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * w + g + 8 * h, col = col0 + 8 * i + 2 * q;
      *reinterpret_cast<uint32_t*>(stage + row * pitch + col * 2) =
          pack_bf16x2(o[4 * i + 2 * h] * inv_l[h], o[4 * i + 2 * h + 1] * inv_l[h]);
    }
}

// Copies rows [0, valid_rows) x COLS bf16 of the staging area to dst (row r at dst + r *
// dst_stride elements) with 16-byte stores.
template <int ROWS, int COLS, int kThreads>
__device__ __forceinline__ void store_staged_rows(const uint8_t* stage, int pitch, bf16* dst, int64_t dst_stride,
                                                  int valid_rows, int tid) {
  constexpr int kUnitsPerRow = COLS / 8;
  constexpr int kUnits = ROWS * kUnitsPerRow;
  static_assert(kUnits % kThreads == 0, "every thread stores the same number of units");
#pragma unroll
  for (int i = 0; i < kUnits / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    const int r = idx / kUnitsPerRow, u = idx % kUnitsPerRow;
    if (r < valid_rows)
      *reinterpret_cast<uint4*>(dst + r * dst_stride + u * 8) =
          *reinterpret_cast<const uint4*>(stage + r * pitch + u * 16);
  }
}

// O += P . V for one key block of kBlockN keys: P as online_softmax left it (bf16 pairs in the
// A-fragment order), V N-major in shared memory behind v_desc, kDv output columns for this
// warpgroup. The register fences keep the rescaled O and P final before the wgmma reads them
// and the accumulators untouched until it has written them.
template <int kBlockN, int kDv>
__device__ __forceinline__ void pv_accumulate(uint32_t (&pf)[kBlockN / 4], uint64_t v_desc, float (&o)[kDv / 2]) {
  reg_fence(o);
  reg_fence(pf);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    const uint32_t a[4] = {pf[4 * kk], pf[4 * kk + 1], pf[4 * kk + 2], pf[4 * kk + 3]};
    WgmmaRSTransB<kDv>::mma(a, desc_advance(v_desc, kk * 16 * 128), o, 1);
  }
  wgmma_commit_group();
  wgmma_wait_group<0>();
  reg_fence(o);
}

}  // namespace fp8proj::gpu::attn
