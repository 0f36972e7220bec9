// RMSNorm, alone (bf16 out) and fused with the 1x128 activation quantization (e4m3 + UE8M0 or
// fp32 amax/448 scales out, the two ScaleModes): the input side of q_b_proj, which follows
// q_a_layernorm (fp32 scales: an FP8 checkpoint's FP8Linear takes its input that way). Bit-identical to
// cpu::rmsnorm / cpu::rmsnorm_quantize (src/quant/quantize_cpu.cpp):
//   ss   W = rmsnorm_warps_per_row(K) warps share a row (1 up to K = 2048, else 4). Thread t =
//        32w + j of the row accumulates with fmaf, in increasing order, the elements of the
//        8-element chunks c = t, t + 32W, t + 64W, ...; in each warp s[j] += s[j ^ off] for off =
//        16..1 (after the butterfly every lane holds the warp's sum, bit for bit: each step adds
//        the same two numbers in both partner lanes); then the warps' sums are added in order,
//        ((w0 + w1) + w2) + w3;
//   r    1.0f / sqrtf(ss / K + eps), IEEE division and square root (no fast math);
//   y    bf16((x * r) * w), rounded to nearest even (cvt.rn.bf16x2.f32 = float_to_bf16, see
//        fp8_group_quant.cuh; NaN outputs are NaN with the GPU's payload);
//   q    the fused kernel quantizes those bf16 values exactly as activation_quant.cu does.
//
// Layouts (shape : stride, elements):
//   x     [M, K] : [x_stride, 1]  bf16 (K a multiple of 8; of 128 for the fused kernel;
//                           x_stride >= K, a multiple of 8: a view into wider rows, e.g. the
//                           q_a columns of fused_qkv_a's output)
//   y     [M, K] : [K, 1]   bf16
//   w     [K] : [1]         bf16 norm weight
//   q     [M, K] : [K, 1]   e4m3; scales [K/128, ld] : [ld, 1], M-contiguous, pads
//                           [M, round_up(M, 4)) written as 1.0f (see activation_quant.cu)
//
// Launch: 256 threads per CTA, W warps per row, 8 / W rows per CTA, grid ceil(M / (8 / W)) (the
// fused kernel: ceil(round_up(M, 4) / (8 / W)), its scale pads included).
//   - The reduction order above fixes the work split: W warps per row, thread t on chunks t mod
//     32W. Each thread keeps up to 8 chunks in registers (K <= 2048 with one warp: the q_lora
//     ranks 1536 and 2048 of DeepSeek-V3 and GLM-5; K <= 8192 with four: the hidden sizes 6144
//     and 7168), so the row is read once; larger K streams the rest of the row twice (the second
//     read mostly hits L2).
//   - Four warps per row above K = 2048: with one, a 6144-wide row was 24 dependent 16-byte loads
//     per lane, and a decode batch of 16 rows two CTAs: the norm + quantization before GLM-5's
//     q_a_proj + kv_a_proj_with_mqa took ~21 us at M = 16 and ~70 us at M = 4096, against a
//     one-pass bf16 norm's 13 and 39 us (bench/results/fp8-checkpoints/).
//   - Fused: in chunk iteration i, lanes 0-15 hold group 2i and lanes 16-31 group 2i+1 (16 lanes
//     x 8 values), so a group's amax takes 4 shuffles inside a half-warp. Codes go out as 8-byte
//     stores, 256 contiguous bytes per warp.
//   - Fused scales: the CTA gathers its rows' K/128 scales in shared memory and writes each
//     group's 8 (or 2) rows as one run instead of scattered 4-byte stores.
//   - M = 4096: 512 CTAs, ~2 waves at 2 CTAs per SM; each row is 4 KB in + 2 KB out at K = 2048.
#include "core/cuda_check.hpp"
#include "cuda/common/launch.hpp"
#include "cuda/common/pdl.cuh"
#include "cuda/quant/fp8_group_quant.cuh"
#include "cuda/quant/quant_kernels.hpp"
#include "cuda/quant/rmsnorm_row.cuh"

namespace fp8proj::gpu {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 8;                   // bf16 values per 16-byte load; the CPU's chunk
constexpr int kCachedChunks = 8;            // per lane: rows of up to 32 * 8 * 8 = 2048 read once
constexpr int kLanesPerGroup = kScaleBlock / kChunk;  // 16

// Where a row's results go: y for the plain norm; q and the CTA's shared scale tile
// ([K/128][kRowsPerCta]) for the fused kernel.
struct RowOut {
  bf16* y;
  uint8_t* q;
  float* tile_scales;
};

// Normalizes (and quantizes) chunk c of the row. Every lane of the warp calls it together;
// `valid` is false for lanes past the end of the row (whole half-warps: K % 128 == 0).
template <bool kQuantize, ScaleMode kMode, int kRowsPerCta>
__device__ __forceinline__ void emit_chunk(const uint4& xv, const bf16* __restrict__ w, float r, int64_t row,
                                           int64_t k, int64_t c, bool valid, int lane, int slot,
                                           const RowOut& out) {
  const uint4 wv = valid ? __ldg(reinterpret_cast<const uint4*>(w) + c) : make_uint4(0, 0, 0, 0);
  uint32_t yw[4];
  normalize(xv, wv, r, yw);
  if constexpr (!kQuantize) {
    if (valid) reinterpret_cast<uint4*>(out.y + row * k)[c] = make_uint4(yw[0], yw[1], yw[2], yw[3]);
  } else {
    uint32_t codes[2];
    const float s = quantize_group<kLanesPerGroup, kMode>(yw, kActAmaxEps, codes);
    if (valid) {
      reinterpret_cast<uint2*>(out.q + row * k)[c] = make_uint2(codes[0], codes[1]);
      if (lane % kLanesPerGroup == 0) out.tile_scales[(c / kLanesPerGroup) * kRowsPerCta + slot] = s;
    }
  }
}

// Min 2 CTAs per SM caps registers at 128. Without the hint ptxas (CUDA 13.0) still used 64
// registers but spilled 4 bytes (8-byte stack frame); with it: 64 registers, no stack.
template <bool kQuantize, int kWarpsPerRow, ScaleMode kMode = ScaleMode::ue8m0>
__global__ void __launch_bounds__(kThreads, 2)
    rmsnorm_kernel(const bf16* __restrict__ x, int64_t x_stride, const bf16* __restrict__ w, float eps, int64_t m,
                   int64_t k, bf16* __restrict__ y, uint8_t* __restrict__ q, float* __restrict__ scales, int64_t ld,
                   bool release_early) {
  constexpr int kRowsPerCta = kWarps / kWarpsPerRow;
  constexpr int kRowThreads = 32 * kWarpsPerRow;
  extern __shared__ float tile_scales[];  // [K/128][kRowsPerCta], fused kernel only
  __shared__ float warp_sums[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int slot = warp / kWarpsPerRow, sub = warp % kWarpsPerRow;  // the row in the CTA; the warp in the row
  const int t = sub * 32 + lane;                                    // the thread in the row
  const int64_t row0 = int64_t{blockIdx.x} * kRowsPerCta;
  const int64_t row = row0 + slot;
  const int64_t chunks = k / kChunk;
  const RowOut out{y, q, tile_scales};
  pdl_wait();  // x comes from the kernel before (cuda/common/pdl.cuh)
  if (release_early) pdl_launch_dependents();

  const bool live = row < m;  // warp-uniform
  const uint4* xr = reinterpret_cast<const uint4*>(x + (live ? row : 0) * x_stride);
  uint4 cache[kCachedChunks];
  float ss = 0.0f;
  if (live) {
#pragma unroll
    for (int i = 0; i < kCachedChunks; ++i) {
      const int64_t c = t + int64_t{kRowThreads} * i;
      cache[i] = c < chunks ? __ldg(xr + c) : make_uint4(0, 0, 0, 0);
      if (c < chunks) ss = add_squares(cache[i], ss);
    }
    for (int64_t c = t + int64_t{kRowThreads} * kCachedChunks; c < chunks; c += kRowThreads)
      ss = add_squares(__ldg(xr + c), ss);
    ss = warp_sum_butterfly(ss);
  }
  if constexpr (kWarpsPerRow > 1) {  // the row's warps' sums, added in warp order
    if (lane == 0) warp_sums[warp] = ss;
    __syncthreads();
    ss = warp_sums[slot * kWarpsPerRow];
#pragma unroll
    for (int i = 1; i < kWarpsPerRow; ++i) ss += warp_sums[slot * kWarpsPerRow + i];
  }

  if (live) {
    const float r = rms_inverse(ss, k, eps);
#pragma unroll
    for (int i = 0; i < kCachedChunks; ++i) {
      if (int64_t{kRowThreads} * i >= chunks) break;  // warp-uniform
      const int64_t c = t + int64_t{kRowThreads} * i;
      emit_chunk<kQuantize, kMode, kRowsPerCta>(cache[i], w, r, row, k, c, c < chunks, lane, slot, out);
    }
    for (int64_t base = int64_t{kRowThreads} * kCachedChunks; base < chunks; base += kRowThreads) {
      const int64_t c = base + t;
      const bool valid = c < chunks;
      emit_chunk<kQuantize, kMode, kRowsPerCta>(valid ? __ldg(xr + c) : make_uint4(0, 0, 0, 0), w, r, row, k, c,
                                                valid, lane, slot, out);
    }
  }

  if constexpr (kQuantize) {
    __syncthreads();
    // Entry e = (group, row-in-CTA): consecutive threads store one group's rows in one run.
    const int64_t entries = (k / kScaleBlock) * kRowsPerCta;
    const int64_t rows_written = round_up(m, 4);  // the grid covers them (launch_rows), pads included
    for (int64_t e = threadIdx.x; e < entries; e += kThreads) {
      const int64_t g = e / kRowsPerCta, rr = row0 + e % kRowsPerCta;
      if (rr < rows_written) scales[g * ld + rr] = rr < m ? tile_scales[e] : 1.0f;
    }
  }
  pdl_launch_dependents();  // where release_early did not already (the first call counts)
}

}  // namespace

namespace {

template <bool kQuantize, int kWarpsPerRow>
void launch_rows(const bf16* x, int64_t x_stride, const bf16* w, float eps, int64_t m, int64_t k, bf16* y,
                 const Fp8ActivationOut* out, ScaleMode mode, cudaStream_t stream) {
  constexpr int kRowsPerCta = kWarps / kWarpsPerRow;
  // The fused kernel's scale tile, [K/128][8 / W] floats: 4 KB at the largest K (65536, four warps per row).
  const size_t smem = kQuantize ? static_cast<size_t>(k / kScaleBlock) * kRowsPerCta * sizeof(float) : 0;
  // The fused kernel also writes the scale pads [m, round_up(m, 4)): with two rows per CTA they
  // can lie past the CTA of row m - 1 (m % 4 = 1 or 2; m = 5: pads 5..7, CTAs of rows 4-5 and 6-7).
  const int64_t rows = kQuantize ? round_up(m, 4) : m;
  const int64_t ctas = ceil_div(rows, kRowsPerCta);
  const LaunchShape shape{dim3(static_cast<unsigned>(ctas)), dim3(kThreads), smem, stream};
  if constexpr (!kQuantize) {
    launch_kernel(shape, rmsnorm_kernel<false, kWarpsPerRow>, x, x_stride, w, eps, m, k, y, nullptr, nullptr,
                  int64_t{0}, true);
  } else {
    // Under PDL the fused kernel's dependent is an FP8 GEMM of one-SM CTAs: released right after the
    // wait only from a small grid, else after the stores, as the activation quantizer
    // (release_dependents_early). Four warps per row make two rows a CTA: more than a quarter of
    // 132 SMs from M = 65 at K > 2048, where one warp per row reached that at M = 265.
    const bool release_early = release_dependents_early(ctas);
    if (mode == ScaleMode::ue8m0)
      launch_kernel(shape, rmsnorm_kernel<true, kWarpsPerRow, ScaleMode::ue8m0>, x, x_stride, w, eps, m, k, nullptr,
                    out->values, out->scales, out->scale_ld, release_early);
    else
      launch_kernel(shape, rmsnorm_kernel<true, kWarpsPerRow, ScaleMode::fp32>, x, x_stride, w, eps, m, k, nullptr,
                    out->values, out->scales, out->scale_ld, release_early);
  }
}

template <bool kQuantize>
void launch_any(const bf16* x, int64_t x_stride, const bf16* w, float eps, int64_t m, int64_t k, bf16* y,
                const Fp8ActivationOut* out, ScaleMode mode, cudaStream_t stream) {
  if (m == 0) return;
  if (rmsnorm_warps_per_row(k) == 1)
    launch_rows<kQuantize, 1>(x, x_stride, w, eps, m, k, y, out, mode, stream);
  else
    launch_rows<kQuantize, kRmsnormWideWarps>(x, x_stride, w, eps, m, k, y, out, mode, stream);
}

}  // namespace

void launch_rmsnorm(const bf16* x, int64_t x_stride, const bf16* w, float eps, int64_t m, int64_t k, bf16* y,
                    cudaStream_t stream) {
  launch_any<false>(x, x_stride, w, eps, m, k, y, nullptr, ScaleMode::ue8m0, stream);
}

void launch_rmsnorm_quant(const bf16* x, int64_t x_stride, const bf16* w, float eps, int64_t m, int64_t k,
                          const Fp8ActivationOut& out, ScaleMode mode, cudaStream_t stream) {
  launch_any<true>(x, x_stride, w, eps, m, k, nullptr, &out, mode, stream);
}

}  // namespace fp8proj::gpu
