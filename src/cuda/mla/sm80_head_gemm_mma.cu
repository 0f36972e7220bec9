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
// 12.6 MB of W_UK^T + 16.8 MB of W_UV, ~9 us at 3.3 TB/s). A CTA owns one head, 64 or 128 columns of n
// and up to 64 rows: it copies its whole operands -- its weight rows [64 or 128, k] and the x rows
// [rows, k] -- into shared memory with cp.async in two groups (the two halves of k), then runs
// the MMAs from shared memory, the first half while the second is still arriving. Every global
// load of the CTA is in flight at once: one memory round trip per CTA instead of one per k step
// and row tile. Decode-step stage times (DeepSeek-V3 TP 1, 64 rows; bench/results/decode/absorb/):
// out_latent . W_UV^T 37 -> 24 us and q_nope . W_UK 24 -> 17 us against loading into registers
// inside the k loop. Two other ways of issuing the same copies measured slower: one warp per row
// (35 and 20 us) and one 1D bulk copy (TMA) per row and half (26 and 25 us).
//
// Launch: grid (ceil(n / C), heads, ceil(rows / 64)), C = 16 x the column warps; a CTA is 4 warps
// over 64 columns, or 8 warps -- over 128 columns, or as two row groups over 64 -- where k is
// large (launch_head_gemm). A warp computes 16 columns as two 8-column tiles of
// mma.sync.m16n8k16 (bf16 in, fp32 accumulate; sm_80+, runs on our sm_90a build) for its row
// tiles (the CTA's 4 at most, or 2 of them in a row group); every warp issues copies.
// Shared memory: (C + rows_pad) rows of `pitch` bytes, rows_pad = min(64, rows rounded up to 16);
// pitch = 2k, plus 64 bytes when 2k % 128 == 0, so that rows g and g+1 start 64 bytes apart in
// the bank space: the 16-byte reads of a quarter warp (rows g, g+1, 64 bytes each) are
// conflict-free. GLM-5 W_UV (k 512): 1088-byte rows, 139 KB at 64 rows and C = 64, 204 KB at C = 128.
//
// K order. mma.sync wants thread (g = lane/4, t = lane%4) to hold k = {2t, 2t+1, 2t+8, 2t+9}
// of a 16-wide step. A dot product does not care in which order k is summed as long as x and
// w agree, so each thread instead reads 8 *consecutive* k (one 16-byte vector) of a 32-wide
// step and feeds elements {0,1},{2,3} to the first mma and {4,5},{6,7} to the second:
// logical k 2t+e <-> physical 8t+e (+4 for the second mma), logical 2t+8+e <-> physical 8t+2+e.
// Both operands use that one bijection, so the product is unchanged and every shared-memory read
// is a 16-byte vector (a quarter warp reads 64 contiguous bytes of 2 rows).
// Example: k = 0..31, thread t = 1 loads physical k 8..15; its first mma sees them as logical
// k {2,3} (b0/a0,a1) and {10,11} (b1/a2,a3).
//
// FP8 output (y_fp8 set: out_latent . W_UV^T writing o_proj's input at decode). The CTA stages
// its bf16 tile [rows, C] in shared memory (the operands' space, free after the last MMA; rows
// 2C + 16 bytes apart, so the fragment stores of a warp -- 8 rows x 4 words -- hit 32 banks),
// then quantizes each row's 1x128 group with fp8_group_quant.cuh's code from those bf16 values:
// the same bits as writing y and running quantize_activation on it, without the second kernel
// or the bf16 round trip. A 128-column CTA holds whole groups (16 lanes per row, 16 bytes each).
// A 64-column CTA holds half of one: it is launched as a cluster of two along x (the two halves
// of the group, same head and rows), each CTA takes its half's row amax, the pair swaps them
// through distributed shared memory, and both encode with the group's scale; rank 0 stores it.
//
// NOTES: k must be a multiple of 32 and n of 8 (MlaConfig::validate: nope and kv_lora
// multiples of 32, v of 8); rows past `rows` load zeros and are not stored.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda_check.hpp"
#include "fp8proj/device.hpp"
#include "cuda/attention/sm90_attention_common.cuh"
#include "cuda/common/launch.hpp"
#include "cuda/common/pdl.cuh"
#include "cuda/mla/mla_kernels.hpp"
#include "cuda/quant/fp8_group_quant.cuh"

namespace fp8proj::mla::gpu {

namespace {

namespace attn = fp8proj::gpu::attn;

// A CTA's shape: kColWarps warps side by side over columns (16 each) times kRowGroups groups of
// them over the CTA's 4 row tiles (4 / kRowGroups each). The copies are issued by all warps.
template <int kColWarps, int kRowGroups>
struct Shape {
  static constexpr int kWarps = kColWarps * kRowGroups;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kColsPerCta = 16 * kColWarps;   // two n8 tiles per warp
  static constexpr int kTilesPerWarp = 4 / kRowGroups;
  static_assert(4 % kRowGroups == 0, "the 4 row tiles split evenly between the row groups");
  // CTAs per SM the register budget must allow (__launch_bounds__): shared memory holds five
  // 4-warp CTAs at small k (q_nope . W_UK, 41 KB at 64 rows) and one 8-warp CTA at k >= 384.
  // Without it ptxas capped these kernels at 80 registers and spilled 4 bytes once the FP8
  // epilogue was added.
  static constexpr int kMinCtasPerSm = kWarps == 4 ? 5 : 1;
};
constexpr int kRowTiles = 4;
constexpr int kWideK = 384;  // from here on a CTA takes 8 warps (launch_head_gemm)
constexpr int kRowsPerCta = 16 * kRowTiles;         // 64
constexpr int kKStep = 32;                          // two k16 mma steps per 16-byte read
static_assert(kKStep == 4 * 8, "each of the 4 threads of a row group reads 8 consecutive k");

// Bytes per shared-memory row for k (see the header): whole 16-byte vectors, rows 64 bytes
// apart modulo 128.
int pitch_bytes(int k) { return 2 * k + ((2 * k) % 128 == 0 ? 64 : 0); }

// FP8 output: bytes per staged bf16 row of a CTA's C columns (16 bytes past a multiple of 128,
// see the header), and the row amaxes a 64-column CTA shares with its cluster peer.
__host__ __device__ constexpr int stage_pitch(int cols) { return 2 * cols + 16; }
constexpr int kRowAmaxBytes = 4 * kRowsPerCta;

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 lds16(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }

__device__ __forceinline__ uint32_t pack(float a, float b) {
  return static_cast<uint32_t>(float_to_bf16(a).bits) | (static_cast<uint32_t>(float_to_bf16(b).bits) << 16);
}

// The FP8 epilogue (see the header). Every thread of the CTA calls it (live or not): it holds
// the CTA barriers, the cluster barriers and the shuffles of the quantizer.
template <class S>
__device__ __forceinline__ void store_fp8(const HeadGemmArgs& a, uint8_t* smem,
                                          const float (&acc)[S::kTilesPerWarp][2][4], bool live, int c0, int m0,
                                          int tiles, int rows, int n_base, int r_base) {
  constexpr int kC = S::kColsPerCta;
  static_assert(kC == 64 || kC == 128, "a CTA holds one 1x128 group of a row, or half of one");
  constexpr int kPitch = stage_pitch(kC);
  constexpr int kLanes = kC / 8;  // lanes per row, 16 bytes (8 values) each
  constexpr int kRowsPerPass = S::kThreads / kLanes;
  static_assert(kRowsPerCta % kRowsPerPass == 0, "every pass covers whole rows");
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;

  __syncthreads();  // every warp is past its last MMA: the staged tile reuses the operands' space
  if (live)
#pragma unroll
    for (int i = 0; i < S::kTilesPerWarp; ++i) {
      if (m0 + i >= tiles) break;  // uniform
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint8_t* p = smem + (16 * (m0 + i) + g + 8 * half) * kPitch + 2 * (c0 + 2 * t);
        *reinterpret_cast<uint32_t*>(p) = pack(acc[i][0][2 * half], acc[i][0][2 * half + 1]);
        *reinterpret_cast<uint32_t*>(p + 16) = pack(acc[i][1][2 * half], acc[i][1][2 * half + 1]);
      }
    }
  __syncthreads();

  const int l = threadIdx.x % kLanes, rr = threadIdx.x / kLanes;
  const int64_t col = static_cast<int64_t>(blockIdx.y) * a.n + n_base;  // the CTA's first column of [rows, H*n]
  uint8_t* const values = a.y_fp8.values + col + 8 * l;
  auto load_row = [&](int r, uint32_t (&w)[4]) {
    w[0] = w[1] = w[2] = w[3] = 0;
    if (r < rows) {
      const uint4 v = *reinterpret_cast<const uint4*>(smem + r * kPitch + 16 * l);
      w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    }
  };
  auto store_row = [&](int r, const uint32_t (&codes)[2], float scale, bool owner) {
    if (r >= rows) return;
    const int64_t row = r_base + r;
    *reinterpret_cast<uint2*>(values + row * a.y_fp8.k) = make_uint2(codes[0], codes[1]);
    if (owner && l == 0) {
      float* sc = a.y_fp8.scales + col / kScaleBlock * a.y_fp8.scale_ld;
      sc[row] = scale;
      if (row == a.rows - 1)  // the M padding to a multiple of 4, as quantize_activation writes it
        for (int64_t pad = a.rows; pad < (a.rows + 3) / 4 * 4; ++pad) sc[pad] = 1.0f;
    }
  };
  const int staged = 16 * tiles;
  if constexpr (kC == 128) {
    for (int r0 = 0; r0 < staged; r0 += kRowsPerPass) {  // uniform trip count: the shuffles need every lane
      uint32_t w[4], codes[2];
      load_row(r0 + rr, w);
      const float scale = fp8proj::gpu::quantize_group<16>(w, kActAmaxEps, codes);
      store_row(r0 + rr, codes, scale, true);
    }
  } else {
    namespace cg = cooperative_groups;
    const cg::cluster_group cluster = cg::this_cluster();
    uint32_t* const amax = reinterpret_cast<uint32_t*>(smem + kRowsPerCta * kPitch);  // [64]
    for (int r0 = 0; r0 < staged; r0 += kRowsPerPass) {
      uint32_t w[4];
      load_row(r0 + rr, w);
      uint32_t m = fp8proj::gpu::abs_max_bits(w);
#pragma unroll
      for (int off = kLanes / 2; off >= 1; off /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, off));
      if (l == 0) amax[r0 + rr] = m;
    }
    cluster.sync();  // both halves' amaxes written and visible to the pair
    const uint32_t* const peer = cluster.map_shared_rank(amax, cluster.block_rank() ^ 1);
    const bool owner = cluster.block_rank() == 0;
    for (int r0 = 0; r0 < staged; r0 += kRowsPerPass) {
      const int r = r0 + rr;
      uint32_t w[4], codes[2];
      load_row(r, w);
      const fp8proj::gpu::GroupScale s = fp8proj::gpu::group_scale(max(amax[r], peer[r]), kActAmaxEps);
      fp8proj::gpu::encode_e4m3(w, s, codes);
      store_row(r, codes, s.scale, owner);
    }
    cluster.sync();  // neither CTA exits while its peer may still read its amaxes
  }
}

template <int kColWarps, int kRowGroups>
__global__ void __launch_bounds__(Shape<kColWarps, kRowGroups>::kThreads, Shape<kColWarps, kRowGroups>::kMinCtasPerSm)
    head_gemm_kernel(const HeadGemmArgs a, const int pitch, const bool release_early) {
  using S = Shape<kColWarps, kRowGroups>;
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int h = blockIdx.y;
  const int n_base = blockIdx.x * S::kColsPerCta;
  const int r_base = blockIdx.z * kRowsPerCta;
  const int rows = min(kRowsPerCta, a.rows - r_base);  // >= 1: the grid has no empty row block
  const int tiles = (rows + 15) / 16;
  fp8proj::gpu::pdl_wait();  // before any load (cuda/common/pdl.cuh)
  if (release_early) fp8proj::gpu::pdl_launch_dependents();

  uint8_t* const ws = smem;                            // [kColsPerCta columns of n][k]
  uint8_t* const xs = smem + S::kColsPerCta * pitch;  // [16 * tiles rows][k]
  const bf16* const w = a.w + static_cast<int64_t>(h) * a.n * a.k;
  const bf16* const x = a.x + static_cast<int64_t>(h) * a.x_head_stride;

  // Vectors [v0, v1) of every row: weight rows past n and x rows past `rows` are zero-filled
  // (src-size 0) from a valid address, never read.
  auto load = [&](int v0, int v1) {
    const int nv = v1 - v0;
    for (int i = threadIdx.x; i < S::kColsPerCta * nv; i += S::kThreads) {
      const int r = i / nv, v = v0 + i % nv;
      const bool ok = n_base + r < a.n;
      const bf16* src = w + static_cast<int64_t>(ok ? n_base + r : 0) * a.k + 8 * v;
      attn::cp_async_16(attn::smem_addr(ws + r * pitch + 16 * v), src, ok ? 16 : 0);
    }
    for (int i = threadIdx.x; i < 16 * tiles * nv; i += S::kThreads) {
      const int r = i / nv, v = v0 + i % nv;
      const bool ok = r < rows;
      const bf16* src = x + static_cast<int64_t>(r_base + (ok ? r : 0)) * a.x_row_stride + 8 * v;
      attn::cp_async_16(attn::smem_addr(xs + r * pitch + 16 * v), src, ok ? 16 : 0);
    }
    attn::cp_async_commit();
  };
  const int k_half = a.k / kKStep / 2 * kKStep;  // group 0: k in [0, k_half) (empty when k = 32)
  load(0, k_half / 8);
  load(k_half / 8, a.k / 8);

  const int c0 = warp % kColWarps * 16;               // the warp's first column in the CTA
  const int m0 = warp / kColWarps * S::kTilesPerWarp;  // the warp's first row tile
  const bool live = n_base + c0 < a.n && m0 < tiles;   // warp-uniform; n % 8 == 0: tile 0 is whole
  const bool tile1 = n_base + c0 + 8 < a.n;
  float acc[S::kTilesPerWarp][2][4] = {};
  auto compute = [&](int k_begin, int k_end) {
    for (int k0 = k_begin; k0 < k_end; k0 += kKStep) {
      const int off = 2 * (k0 + 8 * t);
      const uint4 b0 = lds16(ws + (c0 + g) * pitch + off);
      const uint4 b1 = lds16(ws + (c0 + 8 + g) * pitch + off);  // zeros past n
#pragma unroll
      for (int i = 0; i < S::kTilesPerWarp; ++i) {
        const int m = m0 + i;
        if (m >= tiles) break;  // uniform
        const uint4 lo = lds16(xs + (16 * m + g) * pitch + off);
        const uint4 hi = lds16(xs + (16 * m + 8 + g) * pitch + off);
        mma_bf16_16816(acc[i][0], lo.x, hi.x, lo.y, hi.y, b0.x, b0.y);
        mma_bf16_16816(acc[i][0], lo.z, hi.z, lo.w, hi.w, b0.z, b0.w);
        mma_bf16_16816(acc[i][1], lo.x, hi.x, lo.y, hi.y, b1.x, b1.y);
        mma_bf16_16816(acc[i][1], lo.z, hi.z, lo.w, hi.w, b1.z, b1.w);
      }
    }
  };
  attn::cp_async_wait<1>();
  __syncthreads();
  if (live) compute(0, k_half);
  attn::cp_async_wait<0>();
  __syncthreads();
  const bool fp8_out = a.y_fp8.values != nullptr;  // uniform: a kernel argument
  if (!live && !fp8_out) return;
  if (live) compute(k_half, a.k);
  if (fp8_out) {
    store_fp8<S>(a, smem, acc, live, c0, m0, tiles, rows, n_base, r_base);
    fp8proj::gpu::pdl_launch_dependents();  // where release_early did not already (the first call counts)
    return;
  }

  // C fragment: c[0], c[1] at (row g, columns 2t, 2t+1); c[2], c[3] at row g + 8.
  bf16* y = a.y + static_cast<int64_t>(h) * a.y_head_stride + n_base + c0 + 2 * t;
#pragma unroll
  for (int i = 0; i < S::kTilesPerWarp; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = 16 * (m0 + i) + g + 8 * half;
      if (r >= rows) continue;
      bf16* yr = y + static_cast<int64_t>(r_base + r) * a.y_row_stride;
      *reinterpret_cast<uint32_t*>(yr) = pack(acc[i][0][2 * half], acc[i][0][2 * half + 1]);
      if (tile1) *reinterpret_cast<uint32_t*>(yr + 8) = pack(acc[i][1][2 * half], acc[i][1][2 * half + 1]);
    }
}

static_assert((Shape<4, 1>::kColsPerCta + kRowsPerCta) * (2 * kHeadGemmMaxK + 64) <= attn::kSmemLimitBytes,
              "kHeadGemmMaxK must fit in shared memory at 64 rows");

// Dynamic shared memory of one CTA of `cols` weight rows for `rows` rows at inner dimension k:
// its weight rows and up to 64 input rows of k elements.
// With FP8 output the staged tile (64 rows of stage_pitch) and the row amaxes reuse that space;
// only tiny k makes it the larger of the two.
int64_t head_gemm_smem_bytes(int cols, int rows, int k, bool fp8_out) {
  const int rows_pad = std::min(kRowsPerCta, (rows + 15) / 16 * 16);
  const int64_t operands = static_cast<int64_t>(cols + rows_pad) * pitch_bytes(k);
  return fp8_out ? std::max<int64_t>(operands, kRowsPerCta * stage_pitch(cols) + kRowAmaxBytes) : operands;
}

template <int kColWarps, int kRowGroups>
void launch_shape(const HeadGemmArgs& a, cudaStream_t stream) {
  using S = Shape<kColWarps, kRowGroups>;
  const bool fp8_out = a.y_fp8.values != nullptr;
  const int64_t smem = head_gemm_smem_bytes(S::kColsPerCta, a.rows, a.k, fp8_out);
  auto* kernel = head_gemm_kernel<kColWarps, kRowGroups>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(ceil_div(a.n, S::kColsPerCta)), static_cast<unsigned>(a.heads),
                  static_cast<unsigned>(ceil_div(a.rows, kRowsPerCta)));
  // A 64-column CTA writing FP8 shares its group with the next CTA along x (n % 128 == 0, so
  // grid.x is even and the pairs are the groups).
  const unsigned cluster = fp8_out && S::kColsPerCta == 64 ? 2 : 1;
  // Under PDL the kernel after an FP8-writing one is o_proj's GEMM of one-SM CTAs: released as
  // release_dependents_early says (DeepSeek-V3 TP 1, 64 rows: 128 one-SM CTAs here, released
  // early the step took 8-10 us more). The bf16 output's dependents (the quantizer, the
  // attention) stay released right after the wait.
  const int64_t ctas = int64_t{grid.x} * grid.y * grid.z;
  const bool release_early = !fp8_out || fp8proj::gpu::release_dependents_early(ctas);
  fp8proj::gpu::launch_kernel({grid, dim3(S::kThreads), static_cast<size_t>(smem), stream, cluster}, kernel, a,
                              pitch_bytes(a.k), release_early);
}

}  // namespace

void launch_head_gemm(const HeadGemmArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return;
  // Where k is small (q_nope . W_UK, k = 128-192) a 4-warp CTA is small (41 KB of shared memory
  // at 64 rows: 5 per SM) and stays. Where it is large (out_latent . W_UV^T, k = 512: 139 KB,
  // one CTA per SM) four warps cannot issue the copies fast enough: 8 warps over 128 columns
  // where that still gives half the SMs a CTA, else 8 warps as two row groups over the same
  // 64 columns (same grid). Stage times (bench/results/decode/absorb/): DeepSeek-V3 TP 1, 64
  // rows 22.3 -> 14.7 us; TP 8, 64 rows 12.5-15.0 -> 9.8-10.0 us.
  if (a.k < kWideK) return launch_shape<4, 1>(a, stream);
  const int64_t wide_ctas =
      ceil_div(a.n, Shape<8, 1>::kColsPerCta) * int64_t{a.heads} * ceil_div(a.rows, kRowsPerCta);
  if (2 * wide_ctas >= current_device().sm_count &&
      head_gemm_smem_bytes(Shape<8, 1>::kColsPerCta, a.rows, a.k, a.y_fp8.values != nullptr) <= attn::kSmemLimitBytes)
    return launch_shape<8, 1>(a, stream);
  return launch_shape<4, 2>(a, stream);
}

}  // namespace fp8proj::mla::gpu
