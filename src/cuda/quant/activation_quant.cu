// Activation quantization, 1x128 groups: bf16 x[M, K] -> e4m3 q[M, K] + fp32 scales, UE8M0
// powers of two or fp32 amax/448 (ScaleMode::fp32: what an FP8 checkpoint's linear layers quantize
// their inputs with in SGLang, vLLM and transformers' Triton path; formats.hpp). Bit-identical to
// cpu::quantize_activation (src/quant/quantize_cpu.cpp); the per-group math lives in
// fp8_group_quant.cuh.
//
// Layouts (shape : stride, elements):
//   x  [M, K] : [K, 1]            bf16, K a multiple of 128
//   q  [M, K] : [K, 1]            e4m3 codes
//   s  [K/128, ld] : [ld, 1]      fp32, s[g * ld + r] scales q[r, 128g .. 128g+127]; ld >= round_up(M, 4)
//      Entries [M, round_up(M, 4)) of each scale row are padding and get 1.0f, so consumers that
//      read whole 16-byte vectors (TMA boxes, cuBLASLt) never see uninitialised memory.
//   Example: M = 5, K = 256, ld = 8: row 3's second group scale is s[1 * 8 + 3]; s[5..7] and
//   s[13..15] are written as 1.0f.
//
// Launch: 256 threads (8 warps) per CTA, one CTA per tile of 32 rows x 512 columns (4 groups).
//   - A thread owns 16 consecutive columns (two 16-byte loads, one 16-byte store) of 4 rows
//     (warp w: rows w, w+8, w+16, w+24; with M < 32 every warp still gets a row). A group is 8
//     lanes, so its amax takes 3 shuffles.
//   - All 8 loads of a thread are issued before the first use: 128 B per thread, 32 KB per CTA in
//     flight. HBM needs ~4.3 TB/s x ~0.6 us ~ 2.6 MB in flight, ~20 KB per SM; we have 8 CTAs
//     (2048 threads) per SM when registers allow, so latency is covered with margin.
//   - Scales are stored transposed through shared memory: one warp per row would scatter 4-byte
//     stores with stride ld (a 32-byte sector each); the CTA instead collects its 32 x 4 scales
//     and writes, per group, one contiguous 128-byte run of 32 rows.
//   - Grid (ceil(K/512), ceil(M/32)): M = 4096, K = 16384 gives 32 x 128 = 4096 CTAs, ~4 waves
//     on 132 SMs. Rows past M are skipped per warp (a uniform branch); columns past K (K not a
//     multiple of 512) per 8-lane group, which keeps every lane in the shuffles.
// Traffic: 2MK read + MK + MK/32 written; the bandwidth test in tests/gpu compares it with a
// device-to-device copy of the same number of bytes (target >= 75%).
//
// The same kernel quantizes a gated MLP's activation where it is made (launch_silu_mul_quant):
// x = bf16(bf16(silu(gate)) * up), silu(g) = g / (1 + exp(-g)) in fp32 (quant/silu_exact.hpp: the
// CPU reference's bits) -- the two bf16 roundings of act_fn(gate) * up in bf16 eager PyTorch, kept
// so the fused pass quantizes the values the unfused one would. gate and up are [M, K] row views with one row stride (the two column halves
// of one [M, 2K] GEMM output, or two dense [M, K] tensors); reads 4MK bytes instead of the
// separate passes' 2 + 2 + 4 + 2 + 2 (silu, mul, quantization).
#include "core/cuda_check.hpp"
#include "fp8proj/device.hpp"
#include "cuda/common/launch.hpp"
#include "cuda/common/pdl.cuh"
#include "cuda/quant/fp8_group_quant.cuh"
#include "cuda/quant/quant_kernels.hpp"
#include "quant/silu_exact.hpp"

namespace fp8proj::gpu {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTileRows = 32;
constexpr int kRowsPerWarp = kTileRows / kWarps;
constexpr int kValuesPerLane = 16;                           // two 16-byte loads of bf16
constexpr int kWordsPerLane = kValuesPerLane / 2;
constexpr int kTileCols = 32 * kValuesPerLane;               // 512
constexpr int kGroupsPerTile = kTileCols / kScaleBlock;      // 4
constexpr int kLanesPerGroup = kScaleBlock / kValuesPerLane;  // 8
static_assert(kTileRows % kWarps == 0, "every warp handles the same number of rows");
static_assert(kGroupsPerTile * kTileRows <= kThreads, "one thread per scale in the transposed write");

// bf16(silu(g)) for the two values packed in a word, and the product of two packed bf16 pairs
// rounded to bf16.
__device__ __forceinline__ uint32_t silu2(uint32_t g) {
  return bf16x2_rn(detail::silu_exact(bf16_lo(g)), detail::silu_exact(bf16_hi(g)));
}
__device__ __forceinline__ uint32_t mul2(uint32_t a, uint32_t b) {
  return bf16x2_rn(bf16_lo(a) * bf16_lo(b), bf16_hi(a) * bf16_hi(b));
}

// A thread's 16 columns of its rows first_row, first_row + 8, ... (zeros past M or K), all loads
// issued before the first use.
__device__ __forceinline__ void load_rows(const bf16* __restrict__ src, int64_t stride, int64_t first_row, int64_t m,
                                          int64_t col, bool col_ok, uint32_t (&w)[kRowsPerWarp][kWordsPerLane]) {
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int64_t row = first_row + i * kWarps;
    uint4 a = make_uint4(0, 0, 0, 0), b = a;
    if (row < m && col_ok) {
      const uint4* p = reinterpret_cast<const uint4*>(src + row * stride + col);
      a = __ldg(p);
      b = __ldg(p + 1);
    }
    w[i][0] = a.x, w[i][1] = a.y, w[i][2] = a.z, w[i][3] = a.w;
    w[i][4] = b.x, w[i][5] = b.y, w[i][6] = b.z, w[i][7] = b.w;
  }
}

// kSiluMul: x is the gate, `up` the up projection, both rows `stride` elements apart; else x is
// dense (stride == k) and `up` unused.
template <ScaleMode kMode, bool kSiluMul>
__global__ void __launch_bounds__(kThreads)
    activation_quant_kernel(const bf16* __restrict__ x, const bf16* __restrict__ up, int64_t stride, int64_t m,
                            int64_t k, uint8_t* __restrict__ q, float* __restrict__ scales, int64_t ld,
                            bool release_early) {
  // +1 column: the 4 writer lanes of a warp (one per group, same row) land in different banks.
  __shared__ float tile_scales[kGroupsPerTile][kTileRows + 1];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = int64_t{blockIdx.y} * kTileRows;
  const int64_t col = int64_t{blockIdx.x} * kTileCols + lane * kValuesPerLane;
  const bool col_ok = col < k;  // the same for the 8 lanes of a group: k % 128 == 0
  pdl_wait();                   // x comes from the kernel before (cuda/common/pdl.cuh)
  if (release_early) pdl_launch_dependents();

  uint32_t w[kRowsPerWarp][kWordsPerLane];
  load_rows(x, stride, row0 + warp, m, col, col_ok, w);
  if constexpr (kSiluMul) {
    // silu first, with nothing else live: the IEEE division's slow-path subroutine then needs no
    // stack (with the up loads in flight across it, ptxas saved registers to an 8-byte frame).
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i)
#pragma unroll
      for (int j = 0; j < kWordsPerLane; ++j) w[i][j] = silu2(w[i][j]);
    uint32_t v[kRowsPerWarp][kWordsPerLane];  // every up load in flight before the first use
    load_rows(up, stride, row0 + warp, m, col, col_ok, v);
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i)
#pragma unroll
      for (int j = 0; j < kWordsPerLane; ++j) w[i][j] = mul2(w[i][j], v[i][j]);
  }

#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int r = warp + i * kWarps;
    const int64_t row = row0 + r;
    if (row >= m) break;  // warp-uniform, and rows only grow with i
    uint32_t codes[kWordsPerLane / 2];
    const float s = quantize_group<kLanesPerGroup, kMode>(w[i], kActAmaxEps, codes);
    if (col_ok) *reinterpret_cast<uint4*>(q + row * k + col) = make_uint4(codes[0], codes[1], codes[2], codes[3]);
    if (lane % kLanesPerGroup == 0) tile_scales[lane / kLanesPerGroup][r] = s;
  }
  __syncthreads();

  // Thread t writes group t / 32, row t % 32: each warp stores 32 consecutive floats.
  if (threadIdx.x < kGroupsPerTile * kTileRows) {
    const int g = threadIdx.x / kTileRows, r = threadIdx.x % kTileRows;
    const int64_t group = int64_t{blockIdx.x} * kGroupsPerTile + g;
    const int64_t row = row0 + r;
    if (group < k / kScaleBlock && row < round_up(m, 4)) scales[group * ld + row] = row < m ? tile_scales[g][r] : 1.0f;
  }
  pdl_launch_dependents();  // where release_early did not already (the first call counts)
}

}  // namespace

namespace {

template <bool kSiluMul>
void launch_quant(const bf16* x, const bf16* up, int64_t stride, int64_t m, int64_t k, const Fp8ActivationOut& out,
                  ScaleMode mode, cudaStream_t stream) {
  if (m == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(k, kTileCols)), static_cast<unsigned>(ceil_div(m, kTileRows)));
  const LaunchShape shape{grid, dim3(kThreads), 0, stream};
  // Under PDL the kernel after this one is a GEMM of one-SM CTAs: released right after the wait
  // only from a small grid (release_dependents_early), else after the stores. Always at the end
  // was 2-8% slower behind the small TP 8 grids (bench/results/decode/pdl-trigger/).
  const bool release_early = release_dependents_early(static_cast<int64_t>(grid.x) * grid.y);
  if (mode == ScaleMode::ue8m0)
    launch_kernel(shape, activation_quant_kernel<ScaleMode::ue8m0, kSiluMul>, x, up, stride, m, k, out.values,
                  out.scales, out.scale_ld, release_early);
  else
    launch_kernel(shape, activation_quant_kernel<ScaleMode::fp32, kSiluMul>, x, up, stride, m, k, out.values,
                  out.scales, out.scale_ld, release_early);
}

}  // namespace

void launch_activation_quant(const bf16* x, int64_t m, int64_t k, const Fp8ActivationOut& out, ScaleMode mode,
                             cudaStream_t stream) {
  launch_quant<false>(x, nullptr, k, m, k, out, mode, stream);
}

void launch_silu_mul_quant(const bf16* gate, const bf16* up, int64_t stride, int64_t m, int64_t k,
                           const Fp8ActivationOut& out, ScaleMode mode, cudaStream_t stream) {
  launch_quant<true>(gate, up, stride, m, k, out, mode, stream);
}

}  // namespace fp8proj::gpu
