// Causal varlen prefill attention on Hopper (sm_90a): FlashAttention-2's loop (a CTA owns a
// block of query rows of one (sequence, head) and streams key/value blocks through an online
// softmax) with both products on WGMMA.
//
//   out[t, h, :] = sum_{j <= i} softmax_j(scale * q[t, h, :] . k[t0 + j, h, :]) v[t0 + j, h, :]
//   for token t = t0 + i of the sequence [t0, t1) that contains it; bf16 in and out, fp32 scores,
//   softmax and accumulation.
//
// Layouts (shape : stride, elements), as in include/fp8proj/attention.hpp:
//   q [T, H, d_qk] : [q_stride, d_qk, 1]    k [T, H, d_qk] : [k_stride, d_qk, 1]
//   v [T, H, d_v]  : [v_stride, d_v, 1]     out [T, H, d_v] : [H * d_v, d_v, 1]
//   seq_offsets [B + 1] int32 on the device. Strides are multiples of 8 and pointers 16-byte
//   aligned (checked by the caller): every row of a head is a run of 16-byte units.
//
// Launch: grid (ceil(max_seqlen / 128), H, B), 256 threads = 2 warpgroups, 1 CTA per SM.
//   - CTA (x, h, b) owns query rows [128 m, 128 m + 128) of sequence b, head h, with
//     m = gridDim.x - 1 - x: the longest rows (most key blocks) start first, and the CTAs of one
//     (sequence, head) run side by side, so its K/V (1 MB for 1024 tokens of GLM-5) is read from
//     HBM about once and then from L2. CTAs past the end of their sequence exit at once.
//   - Warpgroup w computes rows [64 w, 64 w + 64) of the block: S = Q.K^T with
//     wgmma m64n{kBlockN}k16 (A = its Q rows, B = the K block, both from shared memory), the
//     online softmax in registers, then O += P.V with wgmma m64n{d_v}k16 (A = P from registers,
//     B = the V block, N-major). Key blocks are visited in increasing order up to the diagonal;
//     blocks a warpgroup's rows cannot see are skipped (its predicate is uniform per warpgroup),
//     and only blocks that straddle the diagonal or the sequence end are masked.
//   - All 256 threads load K/V blocks with cp.async into a kStages-deep ring: block n + kStages - 1
//     is issued while block n is computed, so a load has at least a full iteration to land
//     (for d = 256: 2 x 2.1 MFLOP per warpgroup, ~2000 cycles of the SM's tensor cores).
//
// Tiles (kBlockM = 128 rows, kBlockN keys), shared memory and registers per (d_qk, d_v):
//   (256, 256) GLM-5: kBlockN 64, 2 stages: Q 64 KB + 2 x (K 32 KB + V 32 KB) = 192 KB.
//     Registers per thread: O 64x256 fp32 / 128 threads = 128, S 64x64 / 128 = 32, P 16 (bf16
//     pairs); kBlockN = 128 would need 224 for these alone, and the 255 ceiling would spill.
//   (192, 128) DeepSeek-V3: kBlockN 128, 2 stages: 48 KB + 2 x (48 + 32) KB = 208 KB; O 64,
//     S 64, P 32 registers. The wider key block halves the shared-memory traffic of Q per FLOP.
//   (192, 256): kBlockN 64, 3 stages, 216 KB. (256, 128): kBlockN 64, 3 stages, 208 KB.
//   (64, 64) tests: kBlockN 128, 3 stages, 112 KB.
//   The epilogue reuses the same shared memory to stage the bf16 output tile (128 rows x d_v,
//   rows padded by 16 B against bank conflicts) for 16-byte coalesced stores.
//   FP8 output (out_fp8 set, d_v % 128 == 0, PrefillAttentionArgs): o_proj's input written as
//   e4m3 + 1x128 UE8M0 scales straight from the staged tile, so the bf16 output never goes to
//   memory and the separate quantize_activation pass disappears. Each 128-column group of a row
//   is one head's (d_v = 128) or half of one (256): a half-warp reads its 256 bytes (16 B per
//   lane), takes the amax with shuffles, writes 128 codes and one scale. The staged values are
//   the bf16 the other path stores, and the quantizer is fp8_group_quant.cuh's, so the result is
//   quantize_activation(bf16 output) bit for bit.
//
// Build check: nvcc -std=c++20 -O3 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -Iinclude
//   -Isrc -c src/cuda/attention/prefill_attention.cu  (CUDA 13.0: 0 bytes stack, no spills;
//   registers (256,256) 220, (192,256) 220, (192,128) 204, (256,128) 156, (64,64) 174 of the 255
//   that __launch_bounds__(256, 1) allows).
#include <cuda_runtime.h>

#include <cmath>

#include "cuda/attention/attention_kernels.hpp"
#include "cuda/attention/sm90_attention_common.cuh"
#include "core/cuda_check.hpp"
#include "cuda/quant/fp8_group_quant.cuh"

namespace fp8proj::gpu {
namespace attn {
namespace {

struct PrefillParams {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  bf16* out;
  int64_t q_stride, k_stride, v_stride;
  const int32_t* seq_offsets;
  int heads;
  float scale_log2;  // softmax_scale * log2(e)
  // FP8 output instead of `out` (null: bf16): values [T, heads * d_v] e4m3, scales [heads * d_v /
  // 128][scale_ld] fp32 (M-contiguous, as Fp8ActivationOut), padding rows T..round_up(T, 4) = 1.
  uint8_t* out_fp8;
  float* out_scales;
  int64_t scale_ld;
  int total_tokens;
};

// Rows [0, valid_rows) x COLS bf16 of the staging area, quantized per 1x128 group to e4m3 codes
// at values + r * values_stride (+ column) and scales at scales[(group0 + g) * scale_ld + row0 + r].
// A half-warp per group, 8 values per lane: every lane of a warp runs the shuffles together
// (rows past valid_rows pass zeros and store nothing). The thread with global row total - 1 also
// writes the scale padding rows (1.0, as quantize_activation does).
template <int ROWS, int COLS, int kThreads>
__device__ __forceinline__ void store_staged_rows_fp8(const uint8_t* stage, int pitch, uint8_t* values,
                                                      int64_t values_stride, float* scales, int64_t scale_ld,
                                                      int64_t group0, int64_t row0, int valid_rows, int total,
                                                      int tid) {
  static_assert(COLS % kScaleBlock == 0, "whole 1x128 groups per head");
  constexpr int kGroupsPerRow = COLS / kScaleBlock;
  constexpr int kGroupsPerPass = kThreads / 16;
  constexpr int kGroups = ROWS * kGroupsPerRow;
  static_assert(kGroups % kGroupsPerPass == 0, "every half-warp quantizes the same number of groups");
  const int half = tid / 16, l = tid % 16;
#pragma unroll 2
  for (int i = 0; i < kGroups / kGroupsPerPass; ++i) {
    const int gi = half + i * kGroupsPerPass;
    const int r = gi / kGroupsPerRow, g = gi % kGroupsPerRow;
    uint32_t w[4] = {0, 0, 0, 0};
    if (r < valid_rows) {
      const uint4 a = *reinterpret_cast<const uint4*>(stage + r * pitch + g * (kScaleBlock * 2) + l * 16);
      w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w;
    }
    uint32_t codes[2];
    const float sc = quantize_group<16>(w, kActAmaxEps, codes);
    if (r < valid_rows) {
      *reinterpret_cast<uint2*>(values + r * values_stride + g * kScaleBlock + l * 8) = make_uint2(codes[0], codes[1]);
      if (l == 0) {
        float* col = scales + (group0 + g) * scale_ld;
        col[row0 + r] = sc;
        if (row0 + r == total - 1)
          for (int64_t pad = total; pad < (total + 3) / 4 * 4; ++pad) col[pad] = 1.0f;
      }
    }
  }
}

template <int kDqk_, int kDv_>
struct PrefillConfig {
  static constexpr int kDqk = kDqk_, kDv = kDv_;
  static constexpr int kBlockM = 128;  // 2 warpgroups x 64 rows (the WGMMA M extent)
  static constexpr int kThreads = 2 * kWarpgroupThreads;
  // 64 keys whenever a 256-wide operand keeps the register or shared-memory budget tight
  // (see the table at the top of the file), 128 otherwise.
  static constexpr int kBlockN = (kDqk >= 256 || kDv >= 256) ? 64 : 128;
  static constexpr int kQBytes = kBlockM * kDqk * 2;
  static constexpr int kKBytes = kBlockN * kDqk * 2;
  static constexpr int kVBytes = kBlockN * kDv * 2;
  static constexpr int kStageBytes = kKBytes + kVBytes;
  // As many stages as fit, at most 3 (a third stage only helps when a block is short).
  static constexpr int kStages =
      (kSmemLimitBytes - kQBytes) / kStageBytes >= 3 ? 3 : (kSmemLimitBytes - kQBytes) / kStageBytes;
  static constexpr int kOutPitch = kDv * 2 + 16;
  static constexpr int kMainBytes = kQBytes + kStages * kStageBytes;
  static constexpr int kSmemBytes = kMainBytes > kBlockM * kOutPitch ? kMainBytes : kBlockM * kOutPitch;

  static_assert(kDqk % 64 == 0 && kDv % 64 == 0, "head dims are whole 64-column swizzle panels");
  static_assert(kDv <= 256, "one wgmma covers N <= 256 output columns");
  static_assert(kStages >= 2, "double buffering needs two K/V stages in shared memory");
  static_assert(kSmemBytes <= kSmemLimitBytes, "tile set exceeds the 227 KB of shared memory");
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1) prefill_attention_sm90_kernel(const PrefillParams p) {
  constexpr int kDqk = Cfg::kDqk, kDv = Cfg::kDv, kBlockM = Cfg::kBlockM, kBlockN = Cfg::kBlockN;
  constexpr int kStages = Cfg::kStages, kThreads = Cfg::kThreads;

  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t base = (raw_addr + 1023u) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw_addr);
  const uint32_t q_tile = base;
  auto k_tile = [&](int stage) { return base + Cfg::kQBytes + stage * Cfg::kStageBytes; };
  auto v_tile = [&](int stage) { return k_tile(stage) + Cfg::kKBytes; };

  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int head = blockIdx.y, seq = blockIdx.z;
  const int tok0 = p.seq_offsets[seq];
  const int len = p.seq_offsets[seq + 1] - tok0;
  const int m0 = m_block * kBlockM;
  if (m0 >= len) return;

  const int tid = threadIdx.x, wg = tid / kWarpgroupThreads, wg_tid = tid % kWarpgroupThreads;
  const bf16* q = p.q + static_cast<int64_t>(tok0 + m0) * p.q_stride + head * kDqk;
  const bf16* k = p.k + static_cast<int64_t>(tok0) * p.k_stride + head * kDqk;
  const bf16* v = p.v + static_cast<int64_t>(tok0) * p.v_stride + head * kDv;

  // Key blocks the CTA loads: up to its last row (causal) or the sequence end.
  const int n_blocks = (min(len, m0 + kBlockM) + kBlockN - 1) / kBlockN;
  // This warpgroup: rows [r0, r0 + 64). It computes blocks [0, n_wg) and masks from n_full on.
  const int r0 = m0 + 64 * wg;
  const int n_wg = r0 < len ? (min(len, r0 + 64) + kBlockN - 1) / kBlockN : 0;
  const int n_full = min((r0 + 1) / kBlockN, len / kBlockN);

  auto load_kv = [&](int n) {
    const int stage = n % kStages;
    const int valid = len - n * kBlockN;
    load_tile<kBlockN, kDqk, kThreads>(k_tile(stage), k + static_cast<int64_t>(n) * kBlockN * p.k_stride,
                                       p.k_stride, valid, tid);
    load_tile<kBlockN, kDv, kThreads>(v_tile(stage), v + static_cast<int64_t>(n) * kBlockN * p.v_stride,
                                      p.v_stride, valid, tid);
  };

  // Prologue: Q joins the first group; one commit per stage even when empty, so that
  // "group n complete" is always cp.async.wait_group(kStages - 2) at iteration n.
  load_tile<kBlockM, kDqk, kThreads>(q_tile, q, p.q_stride, len - m0, tid);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_blocks) load_kv(s);
    cp_async_commit();
  }

  float o[kDv / 2];
#pragma unroll
  for (int i = 0; i < kDv / 2; ++i) o[i] = 0.0f;
  SoftmaxRows rows;

  const int warp = wg_tid / 32, lane = wg_tid % 32;
  const int row_base = r0 + 16 * warp + lane / 4;  // sequence-local row of h = 0 (h = 1: +8)
  const int col_base = 2 * (lane % 4);
  // Descriptors of stage 0 and of this warpgroup's rows inside each Q panel; k-steps and stages
  // are immediate offsets from these.
  const uint64_t q_desc = desc_kmajor(q_tile + 64 * wg * 128);
  const uint64_t k_desc0 = desc_kmajor(k_tile(0));
  const uint64_t v_desc0 = desc_nmajor(v_tile(0), kBlockN * 128);

  for (int n = 0; n < n_blocks; ++n) {
    cp_async_wait<kStages - 2>();
    fence_proxy_async_shared();
    // Block n is visible to all; every warpgroup is done with block n - 1, whose stage the
    // next load overwrites.
    __syncthreads();
    if (n + kStages - 1 < n_blocks) load_kv(n + kStages - 1);
    cp_async_commit();

    if (n < n_wg) {
      const int stage = n % kStages;
      const uint64_t k_desc = desc_advance(k_desc0, stage * Cfg::kStageBytes);
      const uint64_t v_desc = desc_advance(v_desc0, stage * Cfg::kStageBytes);
      float s[kBlockN / 2];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kDqk / 16; ++kk) {
        const uint32_t panel_q = (kk / 4) * (kBlockM * 128), panel_k = (kk / 4) * (kBlockN * 128);
        WgmmaSS<kBlockN>::mma(desc_advance(q_desc, panel_q + (kk % 4) * 32),
                              desc_advance(k_desc, panel_k + (kk % 4) * 32), s, kk > 0 ? 1 : 0);
      }
      wgmma_commit_group();
      wgmma_wait_group<0>();
      reg_fence(s);

      if (n >= n_full) {
#pragma unroll
        for (int i = 0; i < kBlockN / 8; ++i)
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int key = n * kBlockN + 8 * i + col_base + c;
              if (key > row_base + 8 * h || key >= len) s[4 * i + 2 * h + c] = -INFINITY;
            }
      }

      uint32_t pf[kBlockN / 4];
      online_softmax<kBlockN, kDv / 2>(s, o, rows, p.scale_log2, pf);

      pv_accumulate<kBlockN, kDv>(pf, v_desc, o);
    }
  }

  // Epilogue: the K/V ring becomes the output staging area once every warpgroup is done.
  cp_async_wait<0>();
  __syncthreads();
  if (n_wg > 0) {
    finish_rows(rows);
    const float inv_l[2] = {1.0f / rows.l[0], 1.0f / rows.l[1]};  // l >= 1: key 0 is never masked
    stage_tile_bf16<kDv>(smem + 64 * wg * Cfg::kOutPitch, Cfg::kOutPitch, 0, o, inv_l, wg_tid);
  }
  __syncthreads();
  const int64_t row0 = static_cast<int64_t>(tok0 + m0);
  if constexpr (kDv % kScaleBlock == 0) {
    if (p.out_fp8 != nullptr) {  // uniform: a kernel argument
      store_staged_rows_fp8<kBlockM, kDv, kThreads>(smem, Cfg::kOutPitch, p.out_fp8 + (row0 * p.heads + head) * kDv,
                                                    static_cast<int64_t>(p.heads) * kDv, p.out_scales, p.scale_ld,
                                                    static_cast<int64_t>(head) * (kDv / kScaleBlock), row0,
                                                    min(kBlockM, len - m0), p.total_tokens, tid);
      return;
    }
  }
  bf16* out = p.out + (row0 * p.heads + head) * kDv;
  store_staged_rows<kBlockM, kDv, kThreads>(smem, Cfg::kOutPitch, out, static_cast<int64_t>(p.heads) * kDv,
                                            min(kBlockM, len - m0), tid);
}

template <int kDqk, int kDv>
void launch(const PrefillAttentionArgs& a, cudaStream_t stream) {
  using Cfg = PrefillConfig<kDqk, kDv>;
  const auto kernel = prefill_attention_sm90_kernel<Cfg>;
  constexpr int kSmem = Cfg::kSmemBytes + 1024;  // + the alignment slack of the dynamic base
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  const PrefillParams p{a.q,
                        a.k,
                        a.v,
                        a.out,
                        a.q_stride,
                        a.k_stride,
                        a.v_stride,
                        a.seq_offsets,
                        a.heads,
                        static_cast<float>(a.softmax_scale * 1.4426950408889634),
                        a.out_fp8.values,
                        a.out_fp8.scales,
                        a.out_fp8.scale_ld,
                        static_cast<int>(a.total_tokens)};
  const dim3 grid(static_cast<unsigned>((a.max_seqlen + Cfg::kBlockM - 1) / Cfg::kBlockM),
                  static_cast<unsigned>(a.heads), static_cast<unsigned>(a.num_seqs));
  kernel<<<grid, Cfg::kThreads, kSmem, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace
}  // namespace attn

bool prefill_attention_supported(int d_qk, int d_v) {
  return (d_qk == 64 && d_v == 64) || ((d_qk == 192 || d_qk == 256) && (d_v == 128 || d_v == 256));
}

void launch_prefill_attention(const PrefillAttentionArgs& a, StreamHandle stream) {
  const auto s = static_cast<cudaStream_t>(stream);
  if (a.d_qk == 256 && a.d_v == 256) return attn::launch<256, 256>(a, s);
  if (a.d_qk == 192 && a.d_v == 128) return attn::launch<192, 128>(a, s);
  if (a.d_qk == 192 && a.d_v == 256) return attn::launch<192, 256>(a, s);
  if (a.d_qk == 256 && a.d_v == 128) return attn::launch<256, 128>(a, s);
  if (a.d_qk == 64 && a.d_v == 64) return attn::launch<64, 64>(a, s);
  FP8PROJ_FAIL("prefill attention has no device kernel for d_qk=", a.d_qk, ", d_v=", a.d_v,
               "; supported: (64,64), (192|256, 128|256)");
}

}  // namespace fp8proj::gpu
