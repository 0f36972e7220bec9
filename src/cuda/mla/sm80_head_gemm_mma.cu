// The absorbed MLA decode projections: one small GEMM per head, on the tensor cores.
//
//   y[b, h, n] = bf16( sum_k x[b, h, k] * w[h, n, k] )        fp32 accumulation
//   x [rows, heads, k] : [x_row_stride, x_head_stride, 1]   bf16
//   w [heads, n, k]    : [n*k, k, 1]                          bf16
//   y [rows, heads, n] : [y_row_stride, y_head_stride, 1]   bf16
//   q_latent = q_nope . W_UK:    k = nope (192 for GLM-5), n = kv_lora (512), w = W_UK^T per head
//   out      = out_latent . W_UV^T: k = kv_lora (512),   n = v (256),       w = W_UV per head
//
// Decode has few rows (B <= a few hundred) and the weights are read once per step (GLM-5 TP 1:
// 12.6 MB of W_UK^T + 16.8 MB of W_UV, ~9 us at 3.3 TB/s), so the kernel is built to stream w
// once at full width: every CTA owns one head and 64 columns of n and loops over all rows.
//
// Launch: grid (ceil(n / 64), heads), 128 threads = 4 warps; warp w computes columns
// [64*bx + 16w, +16) as two 8-column tiles of mma.sync.m16n8k16 (bf16 in, fp32 accumulate;
// sm_80+, runs on our sm_90a build), for up to 64 rows at a time (4 row tiles, 32 fp32
// accumulators per thread); more rows loop, re-reading the CTA's w slice from L2.
//
// K order. mma.sync wants thread (g = lane/4, t = lane%4) to hold k = {2t, 2t+1, 2t+8, 2t+9}
// of a 16-wide step. A dot product does not care in which order k is summed as long as x and
// w agree, so each thread instead loads 8 *consecutive* k (one 16-byte vector) of a 32-wide
// step and feeds elements {0,1},{2,3} to the first mma and {4,5},{6,7} to the second:
// logical k 2t+e <-> physical 8t+e (+4 for the second mma), logical 2t+8+e <-> physical 8t+2+e.
// Both operands use that one bijection, so the product is unchanged and every load is a
// 16-byte vector (a warp reads 64 contiguous bytes of 8 rows per instruction).
// Example: k = 0..31, thread t = 1 loads physical k 8..15; its first mma sees them as logical
// k {2,3} (b0/a0,a1) and {10,11} (b1/a2,a3).
//
// NOTES: k must be a multiple of 32 and n of 8 (MlaConfig::validate: nope and kv_lora
// multiples of 32, v of 8); rows past `rows` load zeros and are not stored.
#include <cuda_runtime.h>

#include "core/cuda_check.hpp"
#include "cuda/common/launch.hpp"
#include "cuda/common/pdl.cuh"
#include "cuda/mla/mla_kernels.hpp"

namespace fp8proj::mla::gpu {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kColsPerWarp = 16;                   // two n8 tiles
constexpr int kColsPerCta = kColsPerWarp * kWarps;  // 64
constexpr int kRowTiles = 4;                        // 64 rows per pass
constexpr int kKStep = 32;                          // two k16 mma steps per 16-byte load
static_assert(kKStep == 4 * 8, "each of the 4 threads of a row group loads 8 consecutive k");

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 ld16(const bf16* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

__device__ __forceinline__ uint32_t pack(float a, float b) {
  return static_cast<uint32_t>(float_to_bf16(a).bits) | (static_cast<uint32_t>(float_to_bf16(b).bits) << 16);
}

__global__ void __launch_bounds__(kThreads) head_gemm_kernel(const HeadGemmArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int h = blockIdx.y;
  const int n0 = blockIdx.x * kColsPerCta + warp * kColsPerWarp;
  fp8proj::gpu::pdl_wait_then_release();  // before the early exit and any load (cuda/common/pdl.cuh)
  if (n0 >= a.n) return;  // warp-uniform; n % 8 == 0, so tile 0 is whole
  const bool tile1 = n0 + 8 < a.n;
  const bf16* w = a.w + static_cast<int64_t>(h) * a.n * a.k;
  const bf16* w0 = w + static_cast<int64_t>(n0 + g) * a.k + t * 8;
  const bf16* w1 = w0 + 8 * static_cast<int64_t>(a.k);
  const bf16* x = a.x + static_cast<int64_t>(h) * a.x_head_stride + t * 8;
  bf16* y = a.y + static_cast<int64_t>(h) * a.y_head_stride + n0 + 2 * t;

  for (int r0 = 0; r0 < a.rows; r0 += 16 * kRowTiles) {
    float acc[kRowTiles][2][4] = {};
    bool row_ok[kRowTiles][2];
    const bf16* xr[kRowTiles][2];
#pragma unroll
    for (int m = 0; m < kRowTiles; ++m)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = r0 + 16 * m + g + 8 * half;
        row_ok[m][half] = r < a.rows;
        xr[m][half] = x + static_cast<int64_t>(row_ok[m][half] ? r : 0) * a.x_row_stride;
      }

#pragma unroll 2
    for (int k0 = 0; k0 < a.k; k0 += kKStep) {
      const uint4 b0 = ld16(w0 + k0);
      const uint4 b1 = tile1 ? ld16(w1 + k0) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int m = 0; m < kRowTiles; ++m) {
        if (r0 + 16 * m >= a.rows) break;  // uniform: whole row tiles past the end
        const uint4 lo = row_ok[m][0] ? ld16(xr[m][0] + k0) : make_uint4(0, 0, 0, 0);
        const uint4 hi = row_ok[m][1] ? ld16(xr[m][1] + k0) : make_uint4(0, 0, 0, 0);
        mma_bf16_16816(acc[m][0], lo.x, hi.x, lo.y, hi.y, b0.x, b0.y);
        mma_bf16_16816(acc[m][0], lo.z, hi.z, lo.w, hi.w, b0.z, b0.w);
        mma_bf16_16816(acc[m][1], lo.x, hi.x, lo.y, hi.y, b1.x, b1.y);
        mma_bf16_16816(acc[m][1], lo.z, hi.z, lo.w, hi.w, b1.z, b1.w);
      }
    }

    // C fragment: c[0], c[1] at (row g, columns 2t, 2t+1); c[2], c[3] at row g + 8.
#pragma unroll
    for (int m = 0; m < kRowTiles; ++m)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        if (!row_ok[m][half]) continue;
        bf16* yr = y + static_cast<int64_t>(r0 + 16 * m + g + 8 * half) * a.y_row_stride;
        *reinterpret_cast<uint32_t*>(yr) = pack(acc[m][0][2 * half], acc[m][0][2 * half + 1]);
        if (tile1) *reinterpret_cast<uint32_t*>(yr + 8) = pack(acc[m][1][2 * half], acc[m][1][2 * half + 1]);
      }
  }
}

}  // namespace

void launch_head_gemm(const HeadGemmArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(a.n, kColsPerCta)), static_cast<unsigned>(a.heads));
  fp8proj::gpu::launch_kernel({grid, dim3(kThreads), 0, stream}, head_gemm_kernel, a);
}

}  // namespace fp8proj::mla::gpu
