// Absorbed-MLA decode attention on Hopper (sm_90a): one query token per sequence against the
// latent KV cache, all heads of a 64-head group in one CTA so that each cache row is read once.
//
//   out[b, h, :] = sum_t softmax_t(scale * (q_latent[b, h, :] . c_kv[t] + q_rope[b, h, :] . k_rope[t]))
//                  * c_kv[t]            over the cache rows t of sequence b
//   which is attention with d_qk = 576 (Q = [q_latent | q_rope], K = the whole cache row) and
//   d_v = 512 (V = the first 512 columns of the same row): K and V are one shared-memory tile.
//
// Layouts (shape : stride, elements), as in include/fp8proj/attention.hpp:
//   q_latent [B, H, 512] : [H*512, 512, 1]   q_rope [B, H, 64] : [H*64, 64, 1]
//   cache [capacity, 576] : [576, 1]  (row = [c_kv 512 | k_rope 64], 1152 B = 72 x 16 B)
//   cache_start [B], cache_len [B] int32 on the device: read by the kernel (never by the host),
//   so a captured CUDA graph replays correctly with new lengths.
//   out_latent [B, H, 512] : [H*512, 512, 1]
//   Split-KV scratch (workspace): partial O [B, H, splits, 512] fp32 (normalized by its own
//   row sum), then partial LSE [B, H, splits] fp32 (log2 domain, in units of scale*log2(e)).
//
// Launch: grid (splits, ceil(H / 64), B), 256 threads = 2 warpgroups, 1 CTA per SM.
//   - A CTA owns 64 heads (zero-padded past H) of one sequence and the 64-token blocks
//     [split * per, (split + 1) * per) of it, per = ceil(ceil(len / 64) / splits), computed on
//     the device from the actual length; an empty range writes LSE = -inf.
//   - Warpgroup 0 (scores) computes S = Q.K^T for the whole block (wgmma m64n64k16 x 36 k-steps,
//     A = Q and B = the cache block, both from shared memory), the online softmax, and hands P
//     (bf16 A fragments, 8 KB, by thread index) and the rows' rescale factors to warpgroup 1
//     through shared memory and a CTA barrier; warpgroup w then accumulates output columns
//     [256 w, 256 w + 256) over the 64 keys with wgmma m64n256k16 (A = P from registers, B = the
//     cache block read N-major). Per 64-key block that is 8.9 MFLOP of tensor work, against 72 KB
//     of cache: about 2200 SM cycles at the dense peak, 3600 at the HBM rate per SM (4.8 TB/s /
//     132). A wgmma's cost here is mostly reading its A operand (Q) from shared memory, whatever
//     N: S as two m64n32 halves, one per warpgroup (72 wgmmas per block, and the halves' row
//     maxima and P swapped both ways) or as the whole block in both warpgroups (72 wgmmas, no
//     exchange) took about the same time; one warpgroup's 36 is half of them (docs/decode.md).
//   - Cache blocks by TMA, double-buffered, 64 tokens per stage: one thread issues the block's
//     nine 64-column panels (box 64 x 64, 128-byte swizzle: the SW128 tile layout) on the stage's
//     mbarrier; Q (once per CTA) by cp.async. Q 72 KB + 2 x 72 KB = 216 KB of shared memory,
//     + 8.5 KB for the exchange (a third stage does not fit in 227 KB). Registers per thread:
//     O 64x256 fp32 / 128 = 128, S 32 (warpgroup 0), P 16. The cp.async form of the same loads took ~270 of
//     the loop's ~900 instructions per warp and block (addresses, zero-fill selects: SASS), in
//     front of S's MMAs; the kernel issues at 0.36 instructions per cycle and scheduler, so
//     instructions are time here (docs/decode.md).
//     TMA reads whole 64-row boxes: rows of a sequence's last block past its length are real
//     cache rows (another sequence's, or never written: any bits, NaN included), so the kernel
//     zeroes their c_kv columns in shared memory before the MMAs (0 * V stays 0; their scores
//     are masked to -inf); rows past the cache's end (cache_rows) load as zeros.
//   - splits > 1 when batch x head groups leaves SMs idle (host heuristic, fixed at capture);
//     decode_combine_kernel then merges the splits of each (b, h) in split order (fixed order:
//     the result does not depend on scheduling).
//
// Build check: nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -Iinclude
//   -Isrc -c src/cuda/attention/decode_attention.cu  (CUDA 13.0: 0 bytes stack, no spills;
//   193 registers for the attention kernel, 32 for the combine).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "cuda/attention/attention_kernels.hpp"
#include "cuda/attention/sm90_attention_common.cuh"
#include "core/cuda_check.hpp"
#include "cuda/common/launch.hpp"
#include "cuda/common/pdl.cuh"
#include "cuda/common/tensor_map.hpp"
#include "cuda/kernels/ptx/mbarrier.cuh"
#include "cuda/kernels/ptx/tma.cuh"

namespace fp8proj::gpu {
namespace attn {
namespace {

constexpr int kLora = kDecodeKvLora, kRope = kDecodeRope;
constexpr int kDqk = kLora + kRope;  // 576: 9 swizzle panels
constexpr int kDvPerWg = kLora / 2;  // 256 output columns per warpgroup
constexpr int kHeads = kDecodeHeadsPerCta;
constexpr int kThreads = 2 * kWarpgroupThreads;
constexpr int kQTileBytes = kHeads * kDqk * 2;  // 73728
constexpr int kQPanelBytes = kHeads * 128;      // one 64-column panel of Q
constexpr int kOutPitch = kLora * 2 + 16;       // 1040 B = 260 words: rows 4 banks apart
// At least this many 64-token blocks per split: a split re-reads Q (72 KB, from L2) and pays the
// pipeline fill once, so a one-block split would spend as much on set-up as on work.
constexpr int kMinBlocksPerSplit = 2;

static_assert(kHeads == 64, "one wgmma M extent of heads per CTA");
static_assert(kDqk % 64 == 0 && kLora % 128 == 0, "the cache row is whole 64-column panels");

// The key pipeline: 64 keys per stage, double-buffered. 32 keys x 4 stages (more bytes in flight,
// twice the barriers and Q reads per key) measured 3-23% slower (docs/decode.md).
constexpr int kBlockN = 64;
constexpr int kStages = 2;
constexpr int kTileBytes = kBlockN * kDqk * 2;  // a cache block: 73728 (the TMA bytes of a stage)
constexpr int kPanelBytes = kBlockN * 128;      // one 64-column panel of it (one TMA box)
constexpr int kXchRowBytes = 2 * kHeads * 4;                       // per-row factors, then sums and maxima
constexpr int kXchPBytes = (kBlockN / 4) * kWarpgroupThreads * 4;  // P: 16 bf16 pairs per thread
constexpr int kTilesBytes = kQTileBytes + kStages * kTileBytes;
constexpr int kOffBar = kTilesBytes + kXchRowBytes + kXchPBytes;  // kStages "block landed" mbarriers
constexpr int kSmemBytes = kOffBar + kStages * 8;
static_assert(kSmemBytes <= kSmemLimitBytes, "Q, the cache stages and the exchange must fit in 227 KB");
static_assert(kHeads * kOutPitch <= kTilesBytes, "the output staging area reuses the tiles");
static_assert(kOffBar % 8 == 0, "mbarriers are 8-byte aligned");

struct DecodeParams {
  const bf16* q_latent;
  const bf16* q_rope;
  const bf16* cache;
  const int32_t* cache_start;
  const int32_t* cache_len;
  bf16* out;
  float* part_o;    // splits > 1 only
  float* part_lse;  // splits > 1 only
  int heads;
  int splits;
  float scale_log2;
};

// tmap_cache: the cache as a 2D tensor [cache_rows][576] bf16, box 64 columns x 64 rows, 128-byte
// swizzle (launch_decode_attention).
__global__ void __launch_bounds__(kThreads, 1)
    decode_attention_sm90_kernel(const __grid_constant__ CUtensorMap tmap_cache, const DecodeParams p) {
  namespace ptx = sm90::ptx;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t base = (raw_addr + 1023u) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw_addr);
  const uint32_t q_tile = base;
  auto kv_tile = [&](int stage) { return base + kQTileBytes + stage * kTileBytes; };
  uint64_t* landed = reinterpret_cast<uint64_t*>(smem + kOffBar);

  const int split = blockIdx.x, head0 = blockIdx.y * kHeads, b = blockIdx.z;
  const int tid = threadIdx.x, wg = tid / kWarpgroupThreads, wg_tid = tid % kWarpgroupThreads;
  if (tid == 0) {
    ptx::prefetch_tensormap(&tmap_cache);
#pragma unroll
    for (int s = 0; s < kStages; ++s) ptx::mbarrier_init(landed + s, 1);
    ptx::mbarrier_init_fence();
  }
  // (The barrier before the first wait on `landed` is the one after Q's copies, below.)
  pdl_wait_then_release();  // cache_len, q and the cache come from the kernels before (cuda/common/pdl.cuh)
  const int start = p.cache_start[b], len = p.cache_len[b];
  const int nb = len > 0 ? (len + kBlockN - 1) / kBlockN : 0;
  const int per = (nb + p.splits - 1) / p.splits;
  const int blk0 = split * per, blk1 = min(nb, blk0 + per);
  const int valid_heads = min(kHeads, p.heads - head0);
  const int64_t bh0 = static_cast<int64_t>(b) * p.heads + head0;

  if (blk0 >= blk1) {
    if (p.splits > 1) {
      if (tid < valid_heads) p.part_lse[(bh0 + tid) * p.splits + split] = -INFINITY;
    } else {  // len <= 0: an empty softmax; define the output as zeros rather than 0/0
      for (int idx = tid; idx < valid_heads * (kLora / 8); idx += kThreads)
        *reinterpret_cast<uint4*>(p.out + bh0 * kLora + idx * 8) = make_uint4(0, 0, 0, 0);
    }
    return;
  }

  // Q = [q_latent | q_rope] of the group's heads: panels 0..7 from q_latent, panel 8 from q_rope
  // (the mapping of load_tile); rows past H are zero.
  {
    constexpr int kRowsPerStep = kThreads / 8;
    const int u = tid % 8, r0 = tid / 8;
    const uint32_t dst0 = q_tile + r0 * 128 + ((u ^ (r0 & 7)) << 4);
#pragma unroll
    for (int j = 0; j < kHeads / kRowsPerStep; ++j) {
      const int r = r0 + j * kRowsPerStep;
      const bool valid = r < valid_heads;
      const bf16* lat = p.q_latent + (bh0 + r) * kLora + u * 8;
      const bf16* rope = p.q_rope + (bh0 + r) * kRope + u * 8;
#pragma unroll
      for (int panel = 0; panel < kDqk / 64; ++panel)
        cp_async_16(dst0 + panel * kQPanelBytes + j * (kRowsPerStep * 128),
                    !valid ? p.q_latent : panel < kLora / 64 ? lat + panel * 64 : rope, valid ? 16 : 0);
    }
  }
  cp_async_commit();
  // Block n of the sequence into its stage: nine boxes of 64 rows x 64 columns (one thread).
  auto load_block = [&](int n) {
    const int stage = (n - blk0) % kStages;
    uint64_t* bar = landed + stage;
    ptx::mbarrier_arrive_expect_tx(bar, kTileBytes);  // out-of-bounds rows count too (zero-filled)
    uint8_t* dst = smem + kQTileBytes + stage * kTileBytes;
    const int32_t row = start + n * kBlockN;
#pragma unroll
    for (int panel = 0; panel < kDqk / 64; ++panel)
      ptx::tma_load_2d(dst + panel * kPanelBytes, &tmap_cache, bar, panel * 64, row);
  };
  if (tid == 0) load_block(blk0);
  cp_async_wait<0>();
  fence_proxy_async_shared();
  __syncthreads();  // Q visible to the MMAs; the barriers' initialisation visible to every thread

  float o[kDvPerWg / 2];
#pragma unroll
  for (int i = 0; i < kDvPerWg / 2; ++i) o[i] = 0.0f;
  SoftmaxRows rows;  // the score warpgroup's; the other one's stays unused
  const int col_base = 2 * (wg_tid % 4);
  const int row0 = 16 * (wg_tid / 32) + (wg_tid % 32) / 4;  // the thread's rows: row0, row0 + 8
  // Behind the tiles: the rescale factors of a block (then the row sums and maxima) and P.
  auto& xch_row = *reinterpret_cast<float(*)[2][kHeads]>(smem + kTilesBytes);
  auto& xch_p = *reinterpret_cast<uint4(*)[kBlockN / 16][kWarpgroupThreads]>(smem + kTilesBytes + kXchRowBytes);
  // Descriptors of Q and of stage 0 (this warpgroup's V panels for P.V); k-steps and stages are
  // immediate offsets from these.
  const uint64_t q_desc = desc_kmajor(q_tile);
  const uint64_t k_desc0 = desc_kmajor(kv_tile(0));
  const uint64_t v_desc0 = desc_nmajor(kv_tile(0) + wg * 4 * kPanelBytes, kPanelBytes);
  // The role, through a shuffle so that the compiler sees it warp-uniform: a branch it thinks
  // divergent around a wgmma makes ptxas serialize every wgmma (warning C7520).
  const bool scores = __shfl_sync(0xffffffffu, wg, 0) == 0;

  for (int n = blk0; n < blk1; ++n) {
    static_assert(kStages == 2, "block n + 1 goes into the stage block n - 1 used");
    // Both warpgroups are done with the stage reloaded next (their P.V of block n - 1 waited for
    // its wgmmas) and the value warpgroup has read P and the factors of block n - 1.
    if (n > blk0) __syncthreads();
    if (tid == 0 && n + 1 < blk1) load_block(n + 1);
    const int stage = (n - blk0) % kStages;
    ptx::mbarrier_wait(landed + stage, static_cast<uint32_t>(((n - blk0) / kStages) & 1));
    if (const int valid = len - n * kBlockN; valid < kBlockN) {
      // The sequence's last block: zero the c_kv columns (panels 0-7, V of P.V) of the rows past
      // its end, which TMA read from the cache as they are. Whole 128-byte rows of a panel: the
      // swizzle permutes 16-byte units within a row.
      uint8_t* tile = smem + kQTileBytes + stage * kTileBytes;
      const int units = (kBlockN - valid) * 8;  // 16-byte units per panel past the end
      for (int idx = tid; idx < (kLora / 64) * units; idx += kThreads) {
        const int panel = idx / units, u = idx % units;
        *reinterpret_cast<uint4*>(tile + panel * kPanelBytes + valid * 128 + u * 16) = make_uint4(0, 0, 0, 0);
      }
      fence_proxy_async_shared();  // generic-proxy stores, read next by the MMAs (async proxy)
      __syncthreads();
    }
    const uint64_t v_desc = desc_advance(v_desc0, stage * kTileBytes);
    uint32_t pf[kBlockN / 4];

    if (scores) {
      // S = Q.K^T over the whole block: 36 k-steps of m64n64k16. One copy of them per stage, so
      // that their descriptors are the uniform base plus immediates (a stage known only at run
      // time cost two register-to-uniform moves and 64-bit adds per k-step: SASS).
      float s[kBlockN / 2];
      wgmma_fence();
      auto s_block = [&](auto stage_c) {
#pragma unroll
        for (int kk = 0; kk < kDqk / 16; ++kk) {
          const uint32_t col = (kk % 4) * 32;  // k-step kk: panel kk / 4, bytes 32 (kk % 4) of its rows
          WgmmaSS<kBlockN>::mma(
              desc_advance(q_desc, (kk / 4) * kQPanelBytes + col),
              desc_advance(k_desc0, decltype(stage_c)::value * kTileBytes + (kk / 4) * kPanelBytes + col), s,
              kk > 0 ? 1 : 0);
        }
      };
      if (__shfl_sync(0xffffffffu, stage, 0) == 0)
        s_block(std::integral_constant<int, 0>{});
      else
        s_block(std::integral_constant<int, 1>{});
      wgmma_commit_group();
      wgmma_wait_group<0>();
      reg_fence(s);

      if ((n + 1) * kBlockN > len) {  // only the sequence's last block is partial
#pragma unroll
        for (int i = 0; i < kBlockN / 8; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int c = 0; c < 2; ++c)
              if (n * kBlockN + 8 * i + col_base + c >= len) s[4 * i + 2 * h + c] = -INFINITY;
      }
      float alpha[2];
      online_softmax<kBlockN, kDvPerWg / 2, true>(s, o, rows, p.scale_log2, pf, alpha);
      // Hand P and the factors to the value warpgroup: thread t's fragments go to the thread with
      // its index there, which then holds exactly the A fragments it needs (same layout).
#pragma unroll
      for (int j = 0; j < kBlockN / 16; ++j)
        xch_p[j][wg_tid] = make_uint4(pf[4 * j], pf[4 * j + 1], pf[4 * j + 2], pf[4 * j + 3]);
      if (col_base == 0) {
        xch_row[0][row0] = alpha[0];
        xch_row[0][row0 + 8] = alpha[1];
      }
    }
    // P and the factors are in shared memory (and the stage landed, the tail zeroed) for both
    // warpgroups. One barrier both reach at the same instruction: as two bar.sync of a named
    // barrier at the score and value branches, compute-sanitizer's synccheck reported divergent
    // threads (the branches' warps need not have reconverged after the mbarrier spin).
    __syncthreads();
    if (!scores) {
#pragma unroll
      for (int j = 0; j < kBlockN / 16; ++j) {
        const uint4 v = xch_p[j][wg_tid];
        pf[4 * j] = v.x;
        pf[4 * j + 1] = v.y;
        pf[4 * j + 2] = v.z;
        pf[4 * j + 3] = v.w;
      }
      const float alpha[2] = {xch_row[0][row0], xch_row[0][row0 + 8]};
      rescale_rows<true>(o, alpha);
    }
    // v_desc addresses columns [256 wg, 256 wg + 256) of c_kv: panels 4 wg .. 4 wg + 3 of the block.
    pv_accumulate<kBlockN, kDvPerWg>(pf, v_desc, o);
  }

  // The score warpgroup holds the row sums and maxima; they go where the factors were, once the
  // value warpgroup has read the last block's.
  __syncthreads();
  if (scores) {
    finish_rows(rows);
    if (col_base == 0) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        xch_row[0][row0 + 8 * h] = rows.l[h];
        xch_row[1][row0 + 8 * h] = rows.m[h];
      }
    }
  }
  __syncthreads();
  rows.l[0] = xch_row[0][row0];
  rows.l[1] = xch_row[0][row0 + 8];
  rows.m[0] = xch_row[1][row0];
  rows.m[1] = xch_row[1][row0 + 8];
  const float inv_l[2] = {1.0f / rows.l[0], 1.0f / rows.l[1]};  // l >= 1: the row maximum adds 1
  if (p.splits == 1) {
    // Both warpgroups are past their last P.V (the barriers above): the staging area may overwrite
    // the tiles (no copy is in flight).
    stage_tile_bf16<kDvPerWg>(smem, kOutPitch, wg * kDvPerWg, o, inv_l, wg_tid);
    __syncthreads();
    store_staged_rows<kHeads, kLora, kThreads>(smem, kOutPitch, p.out + bh0 * kLora, kLora, valid_heads, tid);
    return;
  }
  // Partial result of this split: fp32 rows normalized by their own sum, plus log2 of that sum.
  const int warp = wg_tid / 32, g = (wg_tid % 32) / 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = 16 * warp + g + 8 * h;
    if (row >= valid_heads) continue;
    float* dst = p.part_o + ((bh0 + row) * p.splits + split) * kLora + wg * kDvPerWg;
#pragma unroll
    for (int i = 0; i < kDvPerWg / 8; ++i)
      *reinterpret_cast<float2*>(dst + 8 * i + col_base) =
          make_float2(o[4 * i + 2 * h] * inv_l[h], o[4 * i + 2 * h + 1] * inv_l[h]);
    if (wg == 0 && col_base == 0) p.part_lse[(bh0 + row) * p.splits + split] = rows.m[h] + log2f(rows.l[h]);
  }
}

// Merges the splits of one (b, h): out = sum_s w_s O_s / sum_s w_s, w_s = 2^(lse_s - max lse),
// in split order. 128 threads x 4 columns = the 512 latent columns.
__global__ void __launch_bounds__(128) decode_combine_kernel(const float* part_o, const float* part_lse, bf16* out,
                                                             int splits) {
  const int64_t bh = blockIdx.x;
  pdl_wait_then_release();  // the partials of decode_attention_sm90_kernel (cuda/common/pdl.cuh)
  const float* lse = part_lse + bh * splits;
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, lse[s]);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float wsum = 0.0f;
  if (mx != -INFINITY) {
    for (int s = 0; s < splits; ++s) {
      const float l = lse[s];
      if (l == -INFINITY) continue;  // an empty split wrote no O: never read it
      const float w = exp2f(l - mx);
      const float4 x = reinterpret_cast<const float4*>(part_o + (bh * splits + s) * kLora)[threadIdx.x];
      wsum += w;
      acc.x += w * x.x;
      acc.y += w * x.y;
      acc.z += w * x.z;
      acc.w += w * x.w;
    }
  }
  const float inv = wsum > 0.0f ? 1.0f / wsum : 0.0f;
  const uint2 packed = make_uint2(pack_bf16x2(acc.x * inv, acc.y * inv), pack_bf16x2(acc.z * inv, acc.w * inv));
  reinterpret_cast<uint2*>(out + bh * kLora)[threadIdx.x] = packed;
}

}  // namespace
}  // namespace attn

size_t decode_attention_workspace_bytes_for(const DecodeAttentionArgs& a, int splits) {
  if (splits <= 1) return 0;
  const size_t rows = static_cast<size_t>(a.batch) * static_cast<size_t>(a.heads) * static_cast<size_t>(splits);
  return rows * (kDecodeKvLora + 1) * sizeof(float);
}

int decode_attention_splits(const DecodeAttentionArgs& a, int sm_count, size_t workspace_bytes) {
  const int64_t groups = static_cast<int64_t>(a.batch) * ((a.heads + kDecodeHeadsPerCta - 1) / kDecodeHeadsPerCta);
  const int64_t blocks = (std::max(a.max_cache_len, 1) + 63) / 64;
  if (groups <= 0 || groups >= sm_count) return 1;
  // floor, not ceil: CTAs <= SMs keeps the launch in one wave (1 CTA per SM).
  int64_t splits = std::min<int64_t>(sm_count / groups, blocks / attn::kMinBlocksPerSplit);
  splits = std::max<int64_t>(splits, 1);
  while (splits > 1 && decode_attention_workspace_bytes_for(a, static_cast<int>(splits)) > workspace_bytes) --splits;
  return static_cast<int>(splits);
}

void launch_decode_attention(const DecodeAttentionArgs& a, int splits, StreamHandle stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  constexpr int kSmem = attn::kSmemBytes + 1024;  // + the alignment slack of the dynamic base
  CUDA_CHECK(cudaFuncSetAttribute(attn::decode_attention_sm90_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  kSmem));
  // The cache's rows past cache_rows read as zeros; its row stride (1152 B) is a multiple of 16.
  const CUtensorMap tmap =
      make_tensor_map_2d(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, a.cache, kDecodeKvLora + kDecodeRope,
                         static_cast<uint64_t>(a.cache_rows), (kDecodeKvLora + kDecodeRope) * sizeof(bf16), 64,
                         attn::kBlockN, CU_TENSOR_MAP_SWIZZLE_128B, "decode attention cache");
  attn::DecodeParams p{};
  p.q_latent = a.q_latent;
  p.q_rope = a.q_rope;
  p.cache = a.cache;
  p.cache_start = a.cache_start;
  p.cache_len = a.cache_len;
  p.out = a.out_latent;
  p.heads = a.heads;
  p.splits = splits;
  p.scale_log2 = static_cast<float>(a.softmax_scale * 1.4426950408889634);
  if (splits > 1) {
    const size_t rows = static_cast<size_t>(a.batch) * a.heads * splits;
    p.part_o = static_cast<float*>(a.workspace);
    p.part_lse = p.part_o + rows * kDecodeKvLora;
  }
  const dim3 grid(static_cast<unsigned>(splits),
                  static_cast<unsigned>((a.heads + kDecodeHeadsPerCta - 1) / kDecodeHeadsPerCta),
                  static_cast<unsigned>(a.batch));
  launch_kernel({grid, dim3(attn::kThreads), kSmem, s}, attn::decode_attention_sm90_kernel, tmap, p);
  if (splits > 1)
    launch_kernel({dim3(static_cast<unsigned>(static_cast<int64_t>(a.batch) * a.heads)), dim3(128), 0, s},
                  attn::decode_combine_kernel, p.part_o, p.part_lse, a.out_latent, splits);
}

}  // namespace fp8proj::gpu
