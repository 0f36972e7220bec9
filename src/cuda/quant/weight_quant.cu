// Weight quantization at load time, 128x128 blocks: bf16 w[N, K] -> e4m3 q[N, K] + fp32 scales,
// UE8M0 powers of two (DeepSeek's / SGLang's ceil_to_ue8m0) or fp32 amax/448 (ScaleMode::fp32,
// "float"; formats.hpp), eps kWeightAmaxEps (1e-4) either way. Bit-identical to
// cpu::quantize_weight (src/quant/quantize_cpu.cpp), partial edge blocks (N or K not a multiple
// of 128: the block's own amax over its valid elements) and non-finite blocks (NaN scale, all
// codes 0x7f) included.
//
// Layouts (shape : stride, elements):
//   w  [N, K] : [K, 1]                               bf16, any N, K
//   q  [N, K] : [K, 1]                               e4m3
//   s  [ceil(N/128), ceil(K/128)] : [ceil(K/128), 1]  fp32, s[bn * ceil(K/128) + bk] scales the
//                                                    block rows 128bn.., columns 128bk..
//
// Launch: one CTA of 256 threads per 128x128 block, grid (ceil(K/128), ceil(N/128)).
//   - Vector path (K % 8 == 0, so every row is 16-byte aligned): the block is 128 rows x 16
//     chunks of 8 values; thread t takes chunk t % 16 of rows t/16 + 16j, j < 8, so a half-warp
//     reads 256 contiguous bytes. The 64 values stay in registers between the block amax
//     (warp shuffles, then 8 partial maxima through shared memory) and the encode.
//   - Element path (K % 8 != 0: rows not 16-byte aligned): per-element loads, the encode pass
//     re-reads the 32 KB block from L1/L2. Load time only, and no model shape takes it.
//   A 16384 x 6144 weight is 768 blocks, ~6 per SM: this runs once per layer at load.
#include "core/cuda_check.hpp"
#include "cuda/quant/fp8_group_quant.cuh"
#include "cuda/quant/quant_kernels.hpp"

namespace fp8proj::gpu {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 8;                                       // bf16 values per 16-byte load
constexpr int kChunksPerRow = kScaleBlock / kChunk;              // 16
constexpr int kRowsPerPass = kThreads / kChunksPerRow;           // 16
constexpr int kChunksPerThread = kScaleBlock / kRowsPerPass;     // 8
constexpr int kBlockValues = kScaleBlock * kScaleBlock;

// Max of `v` over the CTA; every thread gets the result.
__device__ __forceinline__ uint32_t block_max(uint32_t v, uint32_t* warp_max) {
#pragma unroll
  for (int off = 16; off >= 1; off /= 2) v = max(v, __shfl_xor_sync(0xffffffffu, v, off));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = v;
  __syncthreads();
  v = warp_max[0];
#pragma unroll
  for (int i = 1; i < kWarps; ++i) v = max(v, warp_max[i]);
  return v;
}

template <bool kVector, ScaleMode kMode>
__global__ void __launch_bounds__(kThreads)
    weight_quant_kernel(const bf16* __restrict__ w, int64_t n, int64_t k, uint8_t* __restrict__ q,
                        float* __restrict__ scales) {
  __shared__ uint32_t warp_max[kWarps];
  const int64_t r0 = int64_t{blockIdx.y} * kScaleBlock, c0 = int64_t{blockIdx.x} * kScaleBlock;
  const int64_t rows = n - r0 < kScaleBlock ? n - r0 : kScaleBlock;  // edge blocks are partial
  const int64_t cols = k - c0 < kScaleBlock ? k - c0 : kScaleBlock;
  GroupScale s;

  if constexpr (kVector) {
    const int64_t cc = (threadIdx.x % kChunksPerRow) * kChunk;
    uint32_t v[kChunksPerThread][4];
    uint32_t amax = 0;
#pragma unroll
    for (int j = 0; j < kChunksPerThread; ++j) {
      const int64_t rr = threadIdx.x / kChunksPerRow + kRowsPerPass * j;
      uint4 a = make_uint4(0, 0, 0, 0);
      if (rr < rows && cc < cols) a = __ldg(reinterpret_cast<const uint4*>(w + (r0 + rr) * k + c0 + cc));
      v[j][0] = a.x, v[j][1] = a.y, v[j][2] = a.z, v[j][3] = a.w;
      amax = max(amax, abs_max_bits(v[j]));
    }
    s = group_scale<kMode>(block_max(amax, warp_max), kWeightAmaxEps);
#pragma unroll
    for (int j = 0; j < kChunksPerThread; ++j) {
      const int64_t rr = threadIdx.x / kChunksPerRow + kRowsPerPass * j;
      if (rr >= rows || cc >= cols) continue;
      uint32_t codes[2];
      encode_e4m3<kMode>(v[j], s, codes);
      *reinterpret_cast<uint2*>(q + (r0 + rr) * k + c0 + cc) = make_uint2(codes[0], codes[1]);
    }
  } else {
    uint32_t amax = 0;
    for (int e = threadIdx.x; e < kBlockValues; e += kThreads) {
      const int64_t rr = e / kScaleBlock, cc = e % kScaleBlock;
      if (rr < rows && cc < cols) amax = max(amax, static_cast<uint32_t>(w[(r0 + rr) * k + c0 + cc].bits & 0x7fffu));
    }
    s = group_scale<kMode>(block_max(amax, warp_max), kWeightAmaxEps);
    for (int e = threadIdx.x; e < kBlockValues; e += kThreads) {
      const int64_t rr = e / kScaleBlock, cc = e % kScaleBlock;
      if (rr >= rows || cc >= cols) continue;
      const int64_t i = (r0 + rr) * k + c0 + cc;
      q[i] = s.finite ? e4m3_code(scale_value<kMode>(bf16_to_float(w[i]), s)) : kE4m3NaN;
    }
  }
  if (threadIdx.x == 0) scales[int64_t{blockIdx.y} * gridDim.x + blockIdx.x] = s.scale;
}

template <ScaleMode kMode>
void launch_weight_quant_mode(const bf16* w, int64_t n, int64_t k, const Fp8WeightOut& out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(ceil_div(k, kScaleBlock)), static_cast<unsigned>(ceil_div(n, kScaleBlock)));
  if (k % kChunk == 0) {
    weight_quant_kernel<true, kMode><<<grid, kThreads, 0, stream>>>(w, n, k, out.values, out.scales);
  } else {
    weight_quant_kernel<false, kMode><<<grid, kThreads, 0, stream>>>(w, n, k, out.values, out.scales);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_weight_quant(const bf16* w, int64_t n, int64_t k, const Fp8WeightOut& out, ScaleMode mode,
                         cudaStream_t stream) {
  if (mode == ScaleMode::ue8m0) launch_weight_quant_mode<ScaleMode::ue8m0>(w, n, k, out, stream);
  else launch_weight_quant_mode<ScaleMode::fp32>(w, n, k, out, stream);
}

}  // namespace fp8proj::gpu
