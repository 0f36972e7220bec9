// Load-time layout change of the MLA weights: a batched transpose.
//
//   out[h, c, r] = in[h, r, c]      in [heads, rows, cols] : [rows*cols, cols, 1] bf16
//                                   out [heads, cols, rows] : [rows*cols, rows, 1] bf16
// Used once per block for W_UK^T (per head [nope, kv_lora] -> [kv_lora, nope]) so that the
// absorbed decode projection reads both of its weights as [n, k] rows (sm80_head_gemm_mma.cu).
//
// Launch: 32x32 tiles through shared memory, grid (ceil(cols/32), ceil(rows/32), heads),
// 32x8 threads; reads and writes are coalesced along the fast dimension of each side. Tile rows
// are padded to 33 elements (66 bytes) so a column read spreads over the banks; with 2-byte
// elements some pairs still share a bank (2-way conflicts at worst), which is fine for code that
// runs once at load (12 MB of W_UK for GLM-5).
#include <cuda_runtime.h>

#include "core/cuda_check.hpp"
#include "cuda/mla/mla_kernels.hpp"

namespace fp8proj::mla::gpu {

namespace {

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;

__global__ void __launch_bounds__(kTile * kRowsPerPass) transpose_heads_kernel(const bf16* __restrict__ in,
                                                                                bf16* __restrict__ out, int64_t rows,
                                                                                int64_t cols) {
  __shared__ bf16 tile[kTile][kTile + 1];
  const int64_t h = blockIdx.z;
  const int64_t c0 = int64_t{blockIdx.x} * kTile, r0 = int64_t{blockIdx.y} * kTile;
  const bf16* src = in + h * rows * cols;
  bf16* dst = out + h * rows * cols;
  for (int i = threadIdx.y; i < kTile; i += kRowsPerPass) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = src[r * cols + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += kRowsPerPass) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;
    if (r < rows && c < cols) dst[c * rows + r] = tile[threadIdx.x][i];
  }
}

}  // namespace

void launch_transpose_heads(const bf16* in, bf16* out, int heads, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (heads == 0 || rows == 0 || cols == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, kTile)), static_cast<unsigned>(ceil_div(rows, kTile)),
                  static_cast<unsigned>(heads));
  transpose_heads_kernel<<<grid, dim3(kTile, kRowsPerPass), 0, stream>>>(in, out, rows, cols);
  CUDA_CHECK_LAUNCH();
}

}  // namespace fp8proj::mla::gpu
