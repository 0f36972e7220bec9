// sm90_fp8_gemm_swapab: the same block-scaled FP8 GEMM as sm90_fp8_gemm_1d2d.cuh, for
// small M (decode, M <= ~256), computed transposed: D^T[N,M] = B[N,K] . A[M,K]^T.
//
// Why: WGMMA's M operand is always 64 rows. With M = 16 tokens on that side, 3/4 of the
// tensor-core work is padding and each CTA needs a 64-row A tile. Swapped, the weight fills
// the 64-row side (two consumer warpgroups x 64 = one 128-row scale block per tile) and the
// tokens are the WGMMA N (BLOCK_TOK = 16/32/64/128). The job at small M is streaming the
// weight once at HBM speed (~4.3 TB/s on H200: N=4096, K=2048 is 8 MB = ~2 us), so:
//   - deep pipelines (8-11 stages of 18-33 KB in flight per SM) and
//   - split-K when there are fewer tiles than SMs (N=4096 gives 32 weight tiles for 132
//     SMs): unit = (weight tile, K range, token tile); see SplitKUnitScheduler;
//   - or (BLOCK_W = 64, 16 tokens) tiles of 64 weight rows, both warpgroups on the same rows
//     and alternate K blocks: twice the CTAs without split-K's hand-over through global
//     memory (and split-K on top where even that leaves SMs idle: N = 2624 is 41 tiles). A CTA cannot stream faster than its WGMMAs consume: at N = 16 a 128-row K block
//     (8 x m64n16k32) takes its consumers ~0.2 us whether the MMAs chain or not (~50 cycles
//     each, however little they compute), so 32 CTAs took 3.1 us for what HBM delivered in 2.3
//     (per-CTA trace); with 64 CTAs the consumers keep up (-0.35 us, 4096 x 2048, M = 16).
//
// Layouts as in sm90_fp8_gemm_1d2d.cuh:
//   A [M,K] e4m3 (K,1); sa [K/128][lda_s] fp32 (1,lda_s); B [N,K] e4m3 (K,1);
//   sb [ceil(N/128)][K/128] fp32 (K/128,1); D [M,N] bf16 (N,1). N % 16 == 0: the last weight
//   tile may hold fewer than BLOCK_W rows (TMA zero-fills the rest); its stores stop at N.
// Per K block kb, warpgroup g computes P = B[n0+64g .. +64, kb] . A[m0 .. m0+TOK, kb]^T
// (4 x wgmma m64nTOKk32, fresh accumulator) and promotes
//   acc[n][m] += (sa[kb][m] * sb[n0/128][kb]) * P[n][m]
// (the weight tile lies in one scale block, so sb is one value per K block and tile). With
// BLOCK_W = 64 warpgroup g takes rows n0 .. n0+64 of the K blocks of its parity (counted from
// the unit's first K block), and acc = acc_wg0 + acc_wg1 (through shared memory) before the
// split-K hand-over (warpgroup 0 alone) and the epilogue.
//
// Split-K (S > 1), deterministic: every unit writes its fp32 partial tile to the workspace in
// the accumulator's own register layout (float4 j of thread t at [j][t]: coalesced), then
// one thread bumps the tile's counter. The CTA that brings it to S sums the S partials in
// split order 0..S-1 (independent of which CTA finished last), resets the counter to 0 for
// the next launch, and runs the epilogue. No atomics touch the output.
// Workspace: [tiles] uint32 counters (256-byte aligned, zero before the first launch; the
// kernel leaves them zero) then [tiles][S][TOK * 128] fp32 partials.
//
// Epilogue: bf16 pack, stmatrix .trans (the accumulator holds D^T; .trans writes D rows),
// 128B-swizzled staging [TOK rows x 2 slabs of 64 columns], TMA store clipping rows >= M.
// BLOCK_W = 64: warpgroup 0 stores its bf16 values straight from the registers (2 KB a tile).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/common/pdl.cuh"
#include "cuda/kernels/ptx/fence.cuh"
#include "cuda/kernels/ptx/mbarrier.cuh"
#include "cuda/kernels/ptx/setmaxnreg.cuh"
#include "cuda/kernels/ptx/stmatrix.cuh"
#include "cuda/kernels/ptx/tma.cuh"
#include "cuda/kernels/ptx/wgmma.cuh"
#include "cuda/kernels/scheduler/sm90_tile_scheduler.cuh"
#include "cuda/kernels/sm90_fp8_common.cuh"

namespace fp8proj::sm90::kernels {

template <int BLOCK_TOK_, int kStages_, int BLOCK_W_ = 128>
struct SwapABTraits {
  static constexpr int BLOCK_TOK = BLOCK_TOK_;  // tokens per tile: WGMMA N
  static constexpr int BLOCK_W = BLOCK_W_;      // weight rows per tile: 128 (2 x 64) or 64
  static constexpr int kStages = kStages_;
  static constexpr int kMathWGs = 2;
  static constexpr int kMathThreads = 256;
  static constexpr int kThreads = kMathThreads + 128;
  static constexpr int kAcc = BLOCK_TOK / 2;
  // BLOCK_W = 128: warpgroup g computes weight rows [64 g, 64 g + 64) of every K block.
  // BLOCK_W = 64 (kAltK): both compute all 64 rows, warpgroup g the K blocks kb_begin + g,
  // + 2, ...; warpgroup 1 hands its sums to warpgroup 0 through shared memory (kSmemRed), and
  // warpgroup 0 stores the tile. Twice the CTAs of BLOCK_W = 128 on the same weight, without
  // split-K's hand-over through global memory: a CTA's pace at M = 16 is set by its WGMMAs
  // (~0.2 us per 128-row K block, 8 x m64n16k32), so 32 CTAs (N = 4096) fall behind HBM (a
  // per-CTA trace: stages landed up to 0.9 us before the consumers got to them).
  static constexpr bool kAltK = BLOCK_W == 64;
  static constexpr uint32_t kEmptyArrivals = kAltK ? 4 : 8;  // consumer warps that read a stage

  // Shared memory: D staging (kAltK: warpgroup 1's sums instead) | W stages | token stages |
  // A-scale stages | barriers + flag | B scales.
  static constexpr uint32_t kSmemD = kAltK ? 0 : (BLOCK_TOK * BLOCK_W * 2 + 1023) / 1024 * 1024;
  static constexpr uint32_t kSmemRed = kAltK ? BLOCK_TOK * 64 * 4 : 0;
  static constexpr uint32_t kOffRed = kSmemD;
  static constexpr uint32_t kSmemW = BLOCK_W * 128;
  static constexpr uint32_t kSmemTok = BLOCK_TOK * 128;
  static constexpr uint32_t kSmemSfa = (BLOCK_TOK * 4 + 127) / 128 * 128;
  static constexpr uint32_t kOffW = kSmemD + kSmemRed;
  static constexpr uint32_t kOffTok = kOffW + kStages * kSmemW;
  static constexpr uint32_t kOffSfa = kOffTok + kStages * kSmemTok;
  static constexpr uint32_t kOffBar = kOffSfa + kStages * kSmemSfa;
  static constexpr uint32_t kOffFlag = kOffBar + 2 * kStages * 8;  // "last split" broadcast
  static constexpr uint32_t kOffSfb = kOffBar + 256;
  static constexpr uint32_t kSmemFixed = kOffSfb;
  static constexpr uint32_t kTxBytes = kSmemW + kSmemTok + BLOCK_TOK * 4;

  static constexpr uint32_t kProducerRegs = 40;
  static constexpr uint32_t kMathRegs = 232;

  static_assert(BLOCK_TOK % 16 == 0 && BLOCK_TOK <= 128, "token tile: WGMMA N in {16, 32, 64, 128}");
  static_assert(kSmemTok % 1024 == 0 && kOffW % 1024 == 0, "128B-swizzled tiles start on 1024-byte boundaries");
  static_assert(2 * kStages * 8 + 4 <= kWatchdogDoneOffset,
                "barrier region: 2 x kStages mbarriers and a flag, then the watchdog's");
  static_assert(kAcc % 4 == 0, "partials are stored as float4");
  static_assert(BLOCK_W == 128 || BLOCK_W == 64, "weight tile: 2 x 64 rows, or 64 rows with K split between the WGs");
  // kAltK: with an even stage count each stage is only ever filled for one warpgroup's K blocks
  // (blocks kb and kb + kStages have the same parity), so a warpgroup waits on a stage only after
  // it consumed that stage's previous fill itself. With an odd count consecutive fills of a stage
  // alternate between the warpgroups: one that ran ahead of a fill still landing for the other
  // saw that phase as its own (mbarrier parity cannot tell phase j from j - 2), read the stage
  // early and released it, and the producer's next arrive.expect_tx found the phase incomplete:
  // an illegal-instruction fault, about one launch in 20,000 at 16 x 7168 x 16384 with 15
  // stages (docs/robustness.md).
  static_assert(!kAltK || kStages % 2 == 0, "64-row tiles alternate K blocks between the warpgroups: even kStages");
};

// The split-K hand-over of one unit by the kThreads consumer threads that hold its sums (acc,
// kAcc each), synchronised on named barrier kBarrier: each thread writes its sums into the unit's
// partial (float4 j of thread t at [j][t]: coalesced), one thread bumps the tile's counter. The CTA
// that brings it to split_k resets it to 0 for the next launch, sums the split_k partials into acc
// in split order 0..split_k-1 (whichever CTA finished last: deterministic) and returns true; the
// others return false (their result is in the workspace).
template <int kAcc, uint32_t kThreads, uint32_t kBarrier>
__device__ __forceinline__ bool split_k_handover(float (&acc)[kAcc], float* __restrict__ partials,
                                                 uint32_t* __restrict__ tile_counters, uint32_t tile, uint32_t split,
                                                 uint32_t split_k, uint32_t t, volatile uint32_t* last_flag) {
  constexpr uint32_t kPartialFloats = kThreads * kAcc;
  float4* mine = reinterpret_cast<float4*>(partials + (static_cast<size_t>(tile) * split_k + split) * kPartialFloats);
#pragma unroll
  for (int j = 0; j < kAcc / 4; ++j)
    __stcg(mine + j * kThreads + t, make_float4(acc[4 * j + 0], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]));
  __threadfence();  // each thread's partial is visible GPU-wide before the count
  ptx::named_barrier_sync(kBarrier, kThreads);
  if (t == 0) *last_flag = atomicAdd(tile_counters + tile, 1u) == split_k - 1 ? 1u : 0u;
  ptx::named_barrier_sync(kBarrier, kThreads);
  if (*last_flag == 0) return false;  // uniform across the kThreads threads
  __threadfence();
  if (t == 0) tile_counters[tile] = 0;  // all split_k arrivals counted: ready for the next launch
  const float4* all = reinterpret_cast<const float4*>(partials + static_cast<size_t>(tile) * split_k * kPartialFloats);
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  for (uint32_t s = 0; s < split_k; ++s) {  // fixed order: deterministic
#pragma unroll
    for (int j = 0; j < kAcc / 4; ++j) {
      const float4 v = __ldcg(all + (static_cast<size_t>(s) * kPartialFloats) / 4 + j * kThreads + t);
      acc[4 * j + 0] += v.x;
      acc[4 * j + 1] += v.y;
      acc[4 * j + 2] += v.z;
      acc[4 * j + 3] += v.w;
    }
  }
  return true;
}

template <class T, bool kWatchdog>
__global__ void __launch_bounds__(T::kThreads, 1)
    sm90_fp8_gemm_swapab_kernel(const __grid_constant__ CUtensorMap tmap_a,
                                const __grid_constant__ CUtensorMap tmap_sfa,
                                const __grid_constant__ CUtensorMap tmap_b,
                                const __grid_constant__ CUtensorMap tmap_d,
                                const float* __restrict__ b_scales, uint32_t m, uint32_t n, uint32_t k,
                                uint32_t split_k, uint32_t* __restrict__ tile_counters,
                                float* __restrict__ partials, uint16_t* __restrict__ d_out,
                                const WatchdogParams watchdog) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BLOCK_TOK = T::BLOCK_TOK;
  constexpr int BLOCK_W = T::BLOCK_W;
  constexpr int kStages = T::kStages;
  constexpr int kAcc = T::kAcc;
  static_assert((T::kAltK ? 128 : T::kMathThreads) * kAcc == BLOCK_W * BLOCK_TOK,
                "a split-K partial (the hand-over's threads x kAcc) is the workspace's BLOCK_W x BLOCK_TOK floats");

  extern __shared__ __align__(1024) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + T::kOffBar);
  uint64_t* empty = full + kStages;
  // The watchdog's barrier (run_watchdog), only in the kernels built with it (kWatchdog).
  uint64_t* done = reinterpret_cast<uint64_t*>(smem + T::kOffBar + kWatchdogDoneOffset);
  volatile uint32_t* last_flag = reinterpret_cast<volatile uint32_t*>(smem + T::kOffFlag);
  float* sfb = reinterpret_cast<float*>(smem + T::kOffSfb);

  const uint32_t warp = __shfl_sync(0xffffffffu, threadIdx.x / 32, 0);
  const uint32_t lane = threadIdx.x % 32;
  const uint32_t num_kb = k / 128;

  if (threadIdx.x == T::kMathThreads)
    init_tma_pipeline<kStages, kWatchdog>(smem, &tmap_a, &tmap_sfa, &tmap_b, &tmap_d, full, empty, T::kEmptyArrivals, done,
                               T::kMathWGs);
  __syncthreads();
  // Programmatic dependent launch (cuda/common/pdl.cuh): the prologue above touched only
  // parameters and shared memory; A, the weight, the split-K counters and partials are read or
  // written, D written, after this.
  gpu::pdl_wait_then_release();

  const SplitKUnitScheduler sched(m, n, k, BLOCK_TOK, BLOCK_W, split_k);
  uint32_t stage = 0, phase = 0;
  auto advance = [&]() {  // the next stage of the ring (producer and consumers walk it alike)
    if (++stage == kStages) {
      stage = 0;
      phase ^= 1;
    }
  };

  if (warp >= T::kMathWGs * 4) {
    // ---------------- producer warpgroup ----------------
    ptx::setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x == T::kMathThreads) {
      const uint64_t w_policy = ptx::l2_policy_evict_first();  // spare dirty L2 lines (tma.cuh)
      for (uint32_t unit = blockIdx.x; unit < sched.num_units; unit += gridDim.x) {
        uint32_t m_tile, n_tile, split, kb_begin, kb_end;
        sched.decode(unit, m_tile, n_tile, split, kb_begin, kb_end);
        const int32_t m0 = static_cast<int32_t>(m_tile * BLOCK_TOK);
        const int32_t n0 = static_cast<int32_t>(n_tile * BLOCK_W);
#pragma unroll 1
        for (uint32_t kb = kb_begin; kb < kb_end; ++kb) {
          ptx::mbarrier_wait(empty + stage, phase ^ 1);
          ptx::mbarrier_arrive_expect_tx(full + stage, T::kTxBytes);
          const int32_t k0 = static_cast<int32_t>(kb * 128);
          ptx::tma_load_2d_hint(smem + T::kOffW + stage * T::kSmemW, &tmap_b, full + stage, k0, n0, w_policy);
          ptx::tma_load_2d(smem + T::kOffTok + stage * T::kSmemTok, &tmap_a, full + stage, k0, m0);
          ptx::tma_load_2d(smem + T::kOffSfa + stage * T::kSmemSfa, &tmap_sfa, full + stage, m0,
                           static_cast<int32_t>(kb));
          advance();
        }
      }
    } else if constexpr (kWatchdog) {
      if (threadIdx.x == T::kMathThreads + 32) run_watchdog<T>(watchdog, full, done);  // an idle thread of this warpgroup
    }
  } else {
    // ---------------- consumer warpgroups ----------------
    ptx::setmaxnreg_inc<T::kMathRegs>();
    const uint32_t tid = threadIdx.x;  // 0..255
    const uint32_t wg = warp / 4;
    const uint32_t warp_in_wg = warp % 4;
    const uint32_t smem_base = ptx::smem_addr(smem);
    // Warp-uniform descriptor low words (start address / 16; see smem_desc_sw128_from_lo):
    // this warpgroup's 64 weight rows, the token tile.
    const uint32_t w_desc_lo =
        __shfl_sync(0xffffffffu, (smem_base + T::kOffW + (T::kAltK ? 0 : wg * 64 * 128)) >> 4, 0);
    const uint32_t tok_desc_lo = __shfl_sync(0xffffffffu, (smem_base + T::kOffTok) >> 4, 0);
    // Accumulator columns (tokens) of this thread: 8i + 2(lane % 4) + {0, 1}.
    const uint32_t tok_pair = 2 * (lane % 4);

    for (uint32_t unit = blockIdx.x; unit < sched.num_units; unit += gridDim.x) {
      uint32_t m_tile, n_tile, split, kb_begin, kb_end;
      sched.decode(unit, m_tile, n_tile, split, kb_begin, kb_end);

      // B scales of this weight tile (inside one 128-row scale block) for the unit's K range.
      const uint32_t scale_row = n_tile * BLOCK_W / 128;
      for (uint32_t i = tid; i < kb_end - kb_begin; i += T::kMathThreads)
        sfb[i] = __ldg(b_scales + static_cast<size_t>(scale_row) * num_kb + kb_begin + i);
      ptx::named_barrier_sync(1, T::kMathThreads);

      float acc[kAcc];
#pragma unroll
      for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;

#pragma unroll 1
      for (uint32_t kb = kb_begin; kb < kb_end; ++kb) {
        if (T::kAltK && ((kb - kb_begin) & 1) != wg) {  // the other warpgroup's K block
          advance();
          continue;
        }
        const float sb = sfb[kb - kb_begin];
        ptx::mbarrier_wait(full + stage, phase);

        const float* sfa = reinterpret_cast<const float*>(smem + T::kOffSfa + stage * T::kSmemSfa);
        float2 sa[kAcc / 4];
#pragma unroll
        for (int i = 0; i < kAcc / 4; ++i) sa[i] = *reinterpret_cast<const float2*>(sfa + 8 * i + tok_pair);

        const uint32_t desc_w = w_desc_lo + stage * (T::kSmemW >> 4);
        const uint32_t desc_tok = tok_desc_lo + stage * (T::kSmemTok >> 4);
        float part[kAcc];
        ptx::fence_operands(part);
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
          ptx::WgmmaFp8<BLOCK_TOK>::mma(ptx::smem_desc_sw128_from_lo(desc_w + ((kk * 32) >> 4)),
                                        ptx::smem_desc_sw128_from_lo(desc_tok + ((kk * 32) >> 4)), part, kk > 0);
        ptx::wgmma_commit_group();
        ptx::fence_operands(part);
        ptx::wgmma_wait_group<0>();
        ptx::fence_operands(part);
        if (lane == 0) ptx::mbarrier_arrive(empty + stage);

#pragma unroll
        for (int i = 0; i < kAcc / 4; ++i) {
          const float s0 = sa[i].x * sb, s1 = sa[i].y * sb;
          acc[4 * i + 0] = fmaf(s0, part[4 * i + 0], acc[4 * i + 0]);
          acc[4 * i + 1] = fmaf(s1, part[4 * i + 1], acc[4 * i + 1]);
          acc[4 * i + 2] = fmaf(s0, part[4 * i + 2], acc[4 * i + 2]);
          acc[4 * i + 3] = fmaf(s1, part[4 * i + 3], acc[4 * i + 3]);
        }
        advance();
      }

      if constexpr (T::kAltK) {
        // ---- warpgroup 1's sums to warpgroup 0 (acc0 + acc1: a fixed order) ----
        // The buffer is free: warpgroup 0 read it in the previous unit, before the B-scale barrier.
        float* red = reinterpret_cast<float*>(smem + T::kOffRed);
        const uint32_t t = tid % 128;
        if (wg == 1) {
#pragma unroll
          for (int i = 0; i < kAcc; ++i) red[i * 128 + t] = acc[i];
        }
        ptx::named_barrier_sync(3, T::kMathThreads);
        if (wg == 1) continue;
#pragma unroll
        for (int i = 0; i < kAcc; ++i) acc[i] += red[i * 128 + t];

        // ---- split-K: warpgroup 0 publishes the CTA's sum (named barrier 4, its 128 threads);
        // only the last split of the tile goes on ----
        if (split_k > 1 &&
            !split_k_handover<kAcc, 128, 4>(acc, partials, tile_counters, n_tile * sched.m_tiles + m_tile, split,
                                            split_k, t, last_flag))
          continue;  // not the last split of this tile

        // ---- epilogue: bf16 straight from the registers (a tile is at most TOK x 64 x 2 B) ----
        // Thread's values: weight rows (D columns) 16 warp + lane / 4 (+ 8 for j >= 2), tokens (D
        // rows) 8 i + 2 (lane % 4) + j % 2; 8 lanes store 16 contiguous bytes of one D row. No
        // staging tile, fence, barrier or TMA store: -0.1 us at M = 16 (per-CTA trace).
        const uint32_t col = n_tile * BLOCK_W + warp_in_wg * 16 + lane / 4;
#pragma unroll
        for (int i = 0; i < kAcc / 4; ++i) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const uint32_t row = m_tile * BLOCK_TOK + 8 * i + 2 * (lane % 4) + (j & 1);
            const uint32_t c = col + 8 * (j >> 1);  // a partial last weight tile: no column >= N
            if (row < m && c < n) ptx::st_global_bf16(d_out + static_cast<size_t>(row) * n + c, acc[4 * i + j]);
          }
        }
        continue;
      }

      // ---- split-K: publish the partial; only the last split of the tile goes on ----
      if (split_k > 1 && !split_k_handover<kAcc, T::kMathThreads, 1>(acc, partials, tile_counters,
                                                                  n_tile * sched.m_tiles + m_tile, split,
                                                                  split_k, tid, last_flag))
        continue;  // not the last split of this tile

      // ---- epilogue: D^T fragments -> stmatrix.trans -> [TOK x 128] bf16 tile -> TMA store ----
      if (tid == 0) ptx::bulk_wait_group_read<0>();
      ptx::named_barrier_sync(1, T::kMathThreads);
      {
        // Lane l < 16 addresses token row 8i + (l % 8) and the 16-byte chunk of weight rows
        // [8c, 8c + 8) with c = 8 wg + 2 warp_in_wg + l / 8 (matrix 1 = rows 8 further).
        const uint32_t chunk = wg * 8 + warp_in_wg * 2 + (lane % 16) / 8;  // 0..15
        const uint32_t slab = chunk / 8;                                     // 64 columns per slab
#pragma unroll
        for (int i = 0; i < kAcc / 4; ++i) {
          const uint32_t tok = 8 * i + (lane % 8);
          const uint32_t off = swizzle_offset<128>(tok * 128 + (chunk % 8) * 16);
          ptx::stmatrix_x2_trans(smem_base + slab * (BLOCK_TOK * 128) + off,
                                 ptx::pack_bf16x2(acc[4 * i + 0], acc[4 * i + 1]),
                                 ptx::pack_bf16x2(acc[4 * i + 2], acc[4 * i + 3]));
        }
      }
      ptx::fence_proxy_async_shared();
      ptx::named_barrier_sync(1, T::kMathThreads);
      if (tid == 0) {
#pragma unroll
        for (int slab = 0; slab < 2; ++slab) {
          // TMA clips columns >= N inside a slab; a slab wholly past N (N % 128 <= 64 in the
          // last tile) is not issued at all.
          const uint32_t col = n_tile * BLOCK_W + slab * 64;
          if (col < n)
            ptx::tma_store_2d(&tmap_d, smem + slab * (BLOCK_TOK * 128), static_cast<int32_t>(col),
                              static_cast<int32_t>(m_tile * BLOCK_TOK));
        }
        ptx::bulk_commit_group();
      }
    }
    if (threadIdx.x == 0) ptx::bulk_wait_group_read<0>();  // see tma.cuh
    if constexpr (kWatchdog)
      if (threadIdx.x % 128 == 0) ptx::mbarrier_arrive(done);  // this warpgroup is done: run_watchdog stops
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built for a target without wgmma/setmaxnreg: fail loudly, never return garbage
#endif
}

}  // namespace fp8proj::sm90::kernels
