// sm90_fp8_gemm_1d2d: Hopper FP8 GEMM with 1x128 activation scales and 128x128 weight
// scales ("1D2D"), bf16 output, fp32 two-level accumulation.
//
//   D[M,N] (bf16, row-major, ld N) = sum_kb sa[kb][m] * sb[n/128][kb] * (A[m, kb] . B[n, kb])
//   A  [M,K] e4m3 row-major          shape (M,K):(K,1)
//   sa [K/128, lda_s] fp32 MN-major  shape (M,K/128):(1,lda_s), lda_s = round_up(M,4)
//   B  [N,K] e4m3 row-major          shape (N,K):(K,1)
//   sb [ceil(N/128), K/128] fp32     shape (ceil(N/128),K/128):(K/128,1)
// e.g. M=4096, N=6144, K=2048: sa has 16 rows of 4096 floats, sb is 48 x 16. N % 16 == 0, K %
// 128 == 0: with N = 2624 (GLM-5 fused_qkv_a) sb has 21 rows, the last one the scale of weight
// rows 2560..2623 only; the B tiles past row N load as zeros (TMA), D is clipped at column N.
//
// Design (one CTA per SM, persistent, 128 * (kMathWGs + 1) threads):
//   warpgroup kMathWGs (last): producer. One thread issues, per 128-wide K block, three TMA
//     loads into stage s: A tile [BLOCK_M x 128 B] and B tile [BLOCK_N x 128 B], both
//     128B-swizzled (one K block = one swizzle row), and the A scales [BLOCK_M floats]
//     (box {BLOCK_M, 1} of the MN-major scale tensor). setmaxnreg: 40 registers.
//   warpgroups 0..kMathWGs-1: consumers (setmaxnreg 232). Warpgroup g owns rows
//     [w * 64 * kMathWGs + 64 g, +64) of wave w (kWaves = BLOCK_M / (64 kMathWGs)).
//     Per K block and wave: 4 x wgmma m64nBLOCK_Nk32 into a fresh partial (the first with
//     scale-d = 0), commit, wait, release the stage (after the last wave), then on the CUDA
//     cores acc += (sa[row] * sb) * partial. The FP8 tensor-core accumulator keeps ~14 bits
//     (DeepSeek-V3 report); promoting every 128 of K bounds that error. Two consumer
//     warpgroups alternate on the tensor cores, hiding each other's wait + promotion (K loop
//     unrolled 4x: +1-4% at M = 512..4096, +10-15% at M = 256 on long K, measured). With one
//     consumer warpgroup (the m64 tiles) the loop keeps two K blocks in flight instead: two
//     partials, block kb + 1's MMAs issued before kb is promoted (kPipelined).
//   B scales of the tile's 128-column scale block(s) for all of K are copied to shared
//     memory once per tile and warpgroup (K/128 floats, x2 when BLOCK_N straddles two scale
//     blocks; one copy per warpgroup, as the two may be a tile apart, see the epilogue). They
//     are fetched into registers one tile ahead (kSfbPrefetch per consumer thread), so the
//     ~0.5-1 us L2/DRAM round trip overlaps the previous tile's main loop instead of
//     stalling both warpgroups at every tile start.
//   kCluster = 2: CTA pairs (one cluster) take tiles (2j, n) and (2j + 1, n), which share
//     the B tile. Each producer loads its own A tile and half of B, multicast to both CTAs:
//     L2->SM traffic per CTA and K block drops from A + B to A + B/2 (128x128: 32 -> 24 KB,
//     the L2 bandwidth that caps 128-row tiles at large M). See ptx/cluster.cuh. With an odd
//     number of M blocks the last pair's second tile lies past M: it loads zeros (TMA
//     zero-fill) to keep the pair's pipelines in step and stores nothing.
//   kClusterOnN: the pair takes tiles (m, 2j) and (m, 2j + 1) instead and shares the A tile
//     (each producer loads half of its rows, multicast to both; A scales and B its own). For
//     one-wave problems with long K (M = 256..512), where the CTAs of an M block all stream
//     the same A rows: 128x96 tiles, 28 -> 20 KB per CTA and K block. A spare tile past N
//     (odd N-block count) loads zero B rows, clamps its B-scale reads and stores nothing.
//   Epilogue, per consumer warpgroup (its own barrier, no CTA-wide sync): fp32 -> bf16
//     (RNE), stmatrix into its rows of a swizzled staging tile, TMA store in boxes of 64 rows
//     x kDSwizzle bytes of columns. The first warpgroup done starts the next tile's MMAs
//     while the other finishes, so the tensor cores do not idle through the epilogue. TMA
//     clips rows >= M and columns >= N, and its loads zero-fill them (A rows, A scales, B
//     rows), so tails need no code. Storing from registers instead (4-byte st.global, no
//     staging tile, its 48 KB as a 5th stage) measured 0.86x: each store instruction touches
//     8 rows, many more L1 wavefronts than stmatrix + one TMA store (docs/kernels.md).
//     kCarry ("_c" configurations) goes further: each warpgroup issues
//     K block 0 of its next tile before storing this one, and promotes it (scale-block
//     boundary chosen at run time) after the epilogue.
//   Pipeline: kStages full/empty mbarrier pairs; see ptx/mbarrier.cuh for the protocol. An idle
//     thread of the producer warpgroup watches them for a hang (run_watchdog, sm90_fp8_common.cuh). An L2
//     prefetch (cp.async.bulk.prefetch.tensor) of the K block a pipeline depth ahead was
//     measured at 0.77x: the extra L2 requests cost more than the latency they hide
//     (docs/kernels.md). Starting every other CTA half a tile late, so that tile
//     boundaries do not coincide, measured 0.99x (0.87-0.96x at K = 16384): CTAs in step share
//     their A and B tiles in the L2 (docs/kernels.md).
//   Deterministic: every output element is produced by one CTA, in a fixed K order.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/common/pdl.cuh"
#include "cuda/kernels/ptx/cluster.cuh"
#include "cuda/kernels/ptx/fence.cuh"
#include "cuda/kernels/ptx/mbarrier.cuh"
#include "cuda/kernels/ptx/setmaxnreg.cuh"
#include "cuda/kernels/ptx/stmatrix.cuh"
#include "cuda/kernels/ptx/tma.cuh"
#include "cuda/kernels/ptx/wgmma.cuh"
#include "cuda/kernels/scheduler/sm90_tile_scheduler.cuh"
#include "cuda/kernels/sm90_fp8_common.cuh"

namespace fp8proj::sm90::kernels {

template <int BLOCK_M_, int BLOCK_N_, int kMathWGs_, int kStages_, int kCluster_ = 1, bool kClusterOnN_ = false,
          bool kCarry_ = false>
struct Gemm1d2dTraits {
  static constexpr int BLOCK_M = BLOCK_M_;
  static constexpr int BLOCK_N = BLOCK_N_;
  static constexpr int kMathWGs = kMathWGs_;
  static constexpr int kStages = kStages_;
  static constexpr int kCluster = kCluster_;    // CTAs sharing (multicasting) one operand tile
  static constexpr bool kClusterOnN = kCluster > 1 && kClusterOnN_;  // shared: A (along N) or B
  static constexpr int kBRowsPerCta = kClusterOnN ? BLOCK_N : BLOCK_N / kCluster;  // rows each producer loads
  static constexpr int kARowsPerCta = kClusterOnN ? BLOCK_M / kCluster : BLOCK_M;
  static constexpr int kSfbPrefetch = 4;        // B scales per consumer thread fetched a tile ahead

  static constexpr int kMathThreads = 128 * kMathWGs;
  static constexpr int kThreads = kMathThreads + 128;
  static constexpr int kWaveM = 64 * kMathWGs;  // rows all consumer warpgroups cover per wave
  static constexpr int kWaves = BLOCK_M / kWaveM;
  static constexpr int kAcc = BLOCK_N / 2;  // fp32 accumulators per thread for m64nBLOCK_N
  static constexpr bool kStraddle = 128 % BLOCK_N != 0;
  // One consumer warpgroup (nothing else to fill the tensor cores while it waits and
  // promotes) and room for a second partial (acc + 2 partials <= 192 registers): the main
  // loop issues K block kb + 1 before promoting kb. Measured on the H200 (harness A/B):
  // 3-23% faster for the m64 tiles; with two warpgroups the other one already hides the
  // wait, and the two-partial loop was 0-4% slower.
  static constexpr bool kPipelined = kMathWGs == 1 && kWaves == 1 && 3 * kAcc <= 192;
  // Two consumer warpgroups: K block 0 of a CTA's next tile is issued before this tile's
  // epilogue ("_c" configurations; see issue_carried). Measured on the H200 (harness A/B):
  // +1-4% at M >= 4096 (many tiles per CTA), 2-4% slower at M = 256..1024, so it is a
  // separate configuration that the tuner picks per M.
  static constexpr bool kCarry = kCarry_;
  static constexpr int kSfbRows = kStraddle ? 2 : 1;
  // K / 128 when the kernel is compiled for one K (FixedK below); 0: read from the argument k.
  static constexpr uint32_t kFixedKb = 0;

  // Output staging: slabs of kDSwizzle bytes (= kDSwizzle/2 bf16 columns) x BLOCK_M rows.
  static constexpr int kDSwizzle = BLOCK_N % 64 == 0 ? 128 : (BLOCK_N % 32 == 0 ? 64 : 32);
  static constexpr int kDSlabCols = kDSwizzle / 2;
  static constexpr int kDSlabs = BLOCK_N / kDSlabCols;
  static constexpr int kDStoreRows = 64;  // TMA store box rows: one warpgroup's rows of a wave

  // Shared memory: D staging | A stages | B stages | A-scale stages | barriers | B scales.
  static constexpr uint32_t kSmemD = (BLOCK_M * BLOCK_N * 2 + 1023) / 1024 * 1024;
  static constexpr uint32_t kSmemA = BLOCK_M * 128;
  static constexpr uint32_t kSmemB = BLOCK_N * 128;
  static constexpr uint32_t kSmemSfa = (BLOCK_M * 4 + 127) / 128 * 128;
  static constexpr uint32_t kOffA = kSmemD;
  static constexpr uint32_t kOffB = kOffA + kStages * kSmemA;
  static constexpr uint32_t kOffSfa = kOffB + kStages * kSmemB;
  static constexpr uint32_t kOffBar = kOffSfa + kStages * kSmemSfa;
  static constexpr uint32_t kOffSfb = kOffBar + 256;
  static constexpr uint32_t kSmemFixed = kOffSfb;
  // Transaction bytes per stage: both tiles plus the A-scale box, out-of-bounds included.
  static constexpr uint32_t kTxBytes = kSmemA + kSmemB + BLOCK_M * 4;

  static constexpr uint32_t kProducerRegs = 40;
  static constexpr uint32_t kMathRegs = 232;

  static_assert(kMathWGs == 1 || kMathWGs == 2, "one or two consumer warpgroups");
  static_assert(!kCarry || !kPipelined, "the carried K block needs the two-warpgroup main loop");
  static_assert(kCluster == 1 || kCluster == 2, "clusters of 1 or 2 CTAs along M");
  static_assert(kBRowsPerCta * 128 % 1024 == 0 && kARowsPerCta * 128 % 1024 == 0,
                "each multicast part of a tile must start on a 1024-byte swizzle atom");
  static_assert(BLOCK_M % kWaveM == 0, "BLOCK_M must be a multiple of 64 rows per consumer warpgroup");
  static_assert(BLOCK_M <= 256 && BLOCK_N <= 256, "TMA boxes are at most 256 rows");
  static_assert(BLOCK_N % 16 == 0, "stmatrix writes 8-column chunks in pairs of rows; WGMMA N % 8");
  static_assert(!kStraddle || BLOCK_N <= 128 + gcd_int(BLOCK_N, 128),
                "a tile may touch at most two 128-column B-scale blocks");
  static_assert(kOffA % 1024 == 0 && kSmemA % 1024 == 0 && kSmemB % 1024 == 0,
                "128B-swizzled tiles must start on 1024-byte boundaries");
  static_assert(2 * kStages * 8 <= kWatchdogDoneOffset, "barrier region: 2 x kStages mbarriers, then the watchdog's");
  static_assert(kProducerRegs * 128 + kMathRegs * kMathThreads <= 65536, "register file: 64K per SM");
};

// The kernel T compiled for K = 128 * kKb: its K loops have constant trip counts (no
// remainder code in the unrolled main loop) and its B-scale set a constant size, as DeepGEMM
// gets by compiling each shape at run time. H200 (docs/kernels.md): 1-3% faster for
// m256n128 and m128n192 at K = 2048. The carried 256x128 kernel is not compiled this way: with
// a constant trip count ptxas spills 160-176 B and serializes its WGMMAs (C7515). The launcher
// runs it for that K only (the kernel traps on any other).
template <class T, uint32_t kKb>
struct FixedK : T {
  static constexpr uint32_t kFixedKb = kKb;
};

// acc += (sa * sb) * part: the two-level accumulation, scales applied for free (thread's rows
// h = 0 / 1: sa0 / sa1). Columns c >= boundary use the next 128-column scale block's B scale
// sb1; the K loops pass the boundary as a type (std::integral_constant, one main-loop copy per
// tile offset), so the selects are resolved at compile time. kFirst (a carried tile's K block
// 0, boundary known at run time): acc = 0 + ..., the same bits (signed zeros) as accumulating
// onto zeroed registers.
template <bool kFirst, int kAcc, class Boundary>
__device__ __forceinline__ void promote(float (&acc)[kAcc], const float (&part)[kAcc], float sa0, float sa1,
                                        float sb0, float sb1, Boundary boundary) {
  const float s00 = sa0 * sb0, s10 = sa1 * sb0;
  const float s01 = sa0 * sb1, s11 = sa1 * sb1;
#pragma unroll
  for (int i = 0; i < kAcc / 4; ++i) {
    const bool second = i * 8 >= static_cast<int>(boundary);
    const float r0 = second ? s01 : s00;
    const float r1 = second ? s11 : s10;
    acc[4 * i + 0] = fmaf(r0, part[4 * i + 0], kFirst ? 0.0f : acc[4 * i + 0]);
    acc[4 * i + 1] = fmaf(r0, part[4 * i + 1], kFirst ? 0.0f : acc[4 * i + 1]);
    acc[4 * i + 2] = fmaf(r1, part[4 * i + 2], kFirst ? 0.0f : acc[4 * i + 2]);
    acc[4 * i + 3] = fmaf(r1, part[4 * i + 3], kFirst ? 0.0f : acc[4 * i + 3]);
  }
}

template <class T, bool kWatchdog>
__global__ void __launch_bounds__(T::kThreads, 1)
    sm90_fp8_gemm_1d2d_kernel(const __grid_constant__ CUtensorMap tmap_a,
                              const __grid_constant__ CUtensorMap tmap_sfa,
                              const __grid_constant__ CUtensorMap tmap_b,
                              const __grid_constant__ CUtensorMap tmap_d,
                              const float* __restrict__ b_scales, uint32_t m, uint32_t n, uint32_t k,
                              uint32_t group_m, uint32_t b_evict_first, const WatchdogParams watchdog) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BLOCK_M = T::BLOCK_M;
  constexpr int BLOCK_N = T::BLOCK_N;
  constexpr int kStages = T::kStages;
  constexpr int kAcc = T::kAcc;

  extern __shared__ __align__(1024) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + T::kOffBar);
  uint64_t* empty = full + kStages;
  // The watchdog's barrier (run_watchdog), only in the kernels built with it (kWatchdog).
  uint64_t* done = reinterpret_cast<uint64_t*>(smem + T::kOffBar + kWatchdogDoneOffset);

  const uint32_t warp = __shfl_sync(0xffffffffu, threadIdx.x / 32, 0);  // warp-uniform
  const uint32_t lane = threadIdx.x % 32;
  if (T::kFixedKb != 0 && k != 128 * T::kFixedKb) __trap();  // a launcher bug: never a wrong result
  const uint32_t num_kb = T::kFixedKb != 0 ? T::kFixedKb : k / 128;

  // Empty barriers count the consumer warps of every CTA the stage's shared tile reaches.
  if (threadIdx.x == T::kMathThreads)
    init_tma_pipeline<kStages, kWatchdog>(smem, &tmap_a, &tmap_sfa, &tmap_b, &tmap_d, full, empty, T::kMathWGs * 4 * T::kCluster,
                               done, T::kMathWGs);
  if constexpr (T::kCluster > 1)
    ptx::cluster_sync();  // the peer's barriers are initialised before any multicast or remote arrive
  else
    __syncthreads();
  // Programmatic dependent launch (cuda/common/pdl.cuh): the prologue above touched only
  // parameters and shared memory; A, its scales and the weight are read, D written, after this.
  gpu::pdl_wait_then_release();

  // With clusters the scheduler walks units of kCluster tiles: (m_pair, n_block) -> this CTA
  // computes M block kCluster * m_pair + rank; along N, (m_block, n_pair) -> N block
  // kCluster * n_pair + rank.
  constexpr uint32_t kUnitM = T::kClusterOnN ? 1 : T::kCluster;
  constexpr uint32_t kUnitN = T::kClusterOnN ? T::kCluster : 1;
  const GroupedTileScheduler sched(m, n, BLOCK_M * kUnitM, BLOCK_N * kUnitN, group_m);
  const uint32_t rank = T::kCluster > 1 ? ptx::cluster_cta_rank() : 0;
  auto tile_of = [&](uint32_t unit, uint32_t& m_block, uint32_t& n_block) {
    uint32_t mu, nu;
    sched.decode(unit, mu, nu);
    m_block = T::kClusterOnN ? mu : mu * T::kCluster + rank;
    n_block = T::kClusterOnN ? nu * T::kCluster + rank : nu;
  };
  const uint32_t first_unit = blockIdx.x / T::kCluster;
  const uint32_t unit_stride = gridDim.x / T::kCluster;
  uint32_t stage = 0, phase = 0;

  if (warp >= T::kMathWGs * 4) {
    // ---------------- producer warpgroup ----------------
    ptx::setmaxnreg_dec<T::kProducerRegs>();
    if (threadIdx.x == T::kMathThreads) {
      // b_evict_first (the host's weight_evict_first()): load the weight evict-first (few M
      // blocks: it streams through once and should spare the L2's dirty lines), else at normal
      // priority (5+ M blocks read each tile again). See tma.cuh.
      const uint64_t b_policy = ptx::l2_policy_evict_first();
      for (uint32_t tile = first_unit; tile < sched.num_tiles; tile += unit_stride) {
        uint32_t m_block, n_block;
        tile_of(tile, m_block, n_block);
        const int32_t m0 = static_cast<int32_t>(m_block * BLOCK_M);
        const int32_t n0 = static_cast<int32_t>(n_block * BLOCK_N);
#pragma unroll 1
        for (uint32_t kb = 0; kb < num_kb; ++kb) {
          ptx::mbarrier_wait(empty + stage, phase ^ 1);
          ptx::mbarrier_arrive_expect_tx(full + stage, T::kTxBytes);
          const int32_t k0 = static_cast<int32_t>(kb * 128);
          if constexpr (T::kClusterOnN) {
            const uint32_t half = rank * T::kARowsPerCta;  // this CTA's rows of the shared A tile
            ptx::tma_load_2d_multicast(smem + T::kOffA + stage * T::kSmemA + half * 128, &tmap_a, full + stage, k0,
                                       m0 + static_cast<int32_t>(half), (1u << T::kCluster) - 1);
          } else {
            ptx::tma_load_2d(smem + T::kOffA + stage * T::kSmemA, &tmap_a, full + stage, k0, m0);
          }
          ptx::tma_load_2d(smem + T::kOffSfa + stage * T::kSmemSfa, &tmap_sfa, full + stage, m0,
                           static_cast<int32_t>(kb));
          if constexpr (T::kCluster > 1 && !T::kClusterOnN) {
            const uint32_t half = rank * T::kBRowsPerCta;  // this CTA's rows of the shared B tile
            if (b_evict_first)
              ptx::tma_load_2d_multicast_hint(smem + T::kOffB + stage * T::kSmemB + half * 128, &tmap_b, full + stage,
                                              k0, n0 + static_cast<int32_t>(half), (1u << T::kCluster) - 1, b_policy);
            else
              ptx::tma_load_2d_multicast(smem + T::kOffB + stage * T::kSmemB + half * 128, &tmap_b, full + stage, k0,
                                         n0 + static_cast<int32_t>(half), (1u << T::kCluster) - 1);
          } else if (b_evict_first) {
            ptx::tma_load_2d_hint(smem + T::kOffB + stage * T::kSmemB, &tmap_b, full + stage, k0, n0, b_policy);
          } else {
            ptx::tma_load_2d(smem + T::kOffB + stage * T::kSmemB, &tmap_b, full + stage, k0, n0);
          }
          if (++stage == kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    } else if constexpr (kWatchdog) {
      if (threadIdx.x == T::kMathThreads + 32) run_watchdog<T>(watchdog, full, done);  // an idle thread of this warpgroup
    }
  } else {
    // ---------------- consumer warpgroups ----------------
    ptx::setmaxnreg_inc<T::kMathRegs>();
    const uint32_t wg = warp / 4;
    const uint32_t tid = threadIdx.x % 128;  // thread in this warpgroup
    const uint32_t wg_barrier = 1 + wg;       // named barrier of this warpgroup's 128 threads
    const uint32_t warp_in_wg = warp % 4;
    const uint32_t row_in_wg = warp_in_wg * 16 + lane / 4;  // accumulator row (h = 0); h = 1 adds 8
    const uint32_t smem_base = ptx::smem_addr(smem);
    // Warp-uniform descriptor low words (__shfl_sync lets the compiler keep them, and the
    // per-WGMMA adds, in uniform registers): A at this warpgroup's first row, B.
    const uint32_t a_desc_lo = __shfl_sync(0xffffffffu, (smem_base + T::kOffA + wg * 64 * 128) >> 4, 0);
    const uint32_t b_desc_lo = __shfl_sync(0xffffffffu, (smem_base + T::kOffB) >> 4, 0);
    // ceil: N need only be a multiple of 16, and a partial last scale block has its own row.
    const uint32_t scale_blocks_n = (n + 127) / 128;

    // B scales of a tile for every K block: entry i < num_kb is (scale block n0/128, K block
    // i), entry num_kb + i the next scale block (clamped inside N: a tail tile's columns past
    // N are never stored). Each warpgroup keeps its own copy; its entries i = tid + 128 j,
    // j < kSfbPrefetch, are fetched into registers one tile ahead; any beyond (K > 128 * 128 *
    // kSfbPrefetch / kSfbRows, i.e. K > 32768 for 128x192) are read when the tile starts.
    const uint32_t sfb_count = num_kb * T::kSfbRows;
    float* sfb = reinterpret_cast<float*>(smem + T::kOffSfb) + wg * ((sfb_count + 3) / 4 * 4);
    auto sfb_entry = [&](uint32_t n0, uint32_t i) {
      const uint32_t sb_row0 = min(n0 / 128, scale_blocks_n - 1);  // a cluster's spare tile past N
      const uint32_t row = i < num_kb ? sb_row0 : min(sb_row0 + 1, scale_blocks_n - 1);
      const uint32_t kb = i < num_kb ? i : i - num_kb;
      return __ldg(b_scales + static_cast<size_t>(row) * num_kb + kb);
    };
    auto n0_of = [&](uint32_t unit) {
      uint32_t mb, nb;
      tile_of(unit, mb, nb);
      return nb * BLOCK_N;
    };
    float sfb_next[T::kSfbPrefetch];
    if (first_unit < sched.num_tiles) {
      const uint32_t n0 = n0_of(first_unit);
#pragma unroll
      for (int j = 0; j < T::kSfbPrefetch; ++j) {
        const uint32_t i = tid + j * 128;
        sfb_next[j] = i < sfb_count ? sfb_entry(n0, i) : 0.0f;
      }
    }

    // Descriptor low words (start address / 16) of stage st's A and B tiles; A starts at
    // this warpgroup's first row.
    auto desc_a_of = [&](uint32_t st) { return a_desc_lo + st * (T::kSmemA >> 4); };
    auto desc_b_of = [&](uint32_t st) { return b_desc_lo + st * (T::kSmemB >> 4); };
    // 4 x wgmma m64nBLOCK_Nk32 over one K block (rows w * kWaveM.. of this warpgroup's part
    // of the A tile) into a fresh partial; one commit group.
    auto issue = [&](float(&part)[kAcc], uint32_t desc_a, uint32_t desc_b, uint32_t wave_row) {
      ptx::fence_operands(part);
      ptx::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        // Start address in 16-byte units: wave_row rows of 128 B, kk x 32 B.
        ptx::WgmmaFp8<BLOCK_N>::mma(ptx::smem_desc_sw128_from_lo(desc_a + ((wave_row * 128 + kk * 32) >> 4)),
                                    ptx::smem_desc_sw128_from_lo(desc_b + ((kk * 32) >> 4)), part, kk > 0);
      }
      ptx::wgmma_commit_group();
      ptx::fence_operands(part);
    };
    // This warp's read of stage `st` is done: the producer may refill it.
    auto release = [&](uint32_t st) {
      if (lane == 0) {
        if constexpr (T::kCluster > 1) {
#pragma unroll
          for (uint32_t c = 0; c < T::kCluster; ++c) ptx::mbarrier_arrive_cluster(empty + st, c);
        } else {
          ptx::mbarrier_arrive(empty + st);
        }
      }
    };
    auto advance = [&]() {
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
    };
    // The two-warpgroup main loop's partial. With kCarry it also carries K block 0 of the
    // CTA's next tile across the epilogue: that block's wave-0 MMAs are issued into `part`
    // before this tile's accumulators are stored, so the tensor cores work through the
    // epilogue and the next tile's B-scale set-up instead of idling (ptxas keeps the WGMMAs
    // asynchronous: the issue is conditional only on there being a next tile, and the one
    // wait it adds, C7517, sits on the kernel's exit path). csa0/csa1: the carried rows' A
    // scales, read before the stage is released.
    float part[kAcc];
    float csa0 = 0.0f, csa1 = 0.0f;
    auto issue_carried = [&]() {
      ptx::mbarrier_wait(full + stage, phase);
      const float* sfa = reinterpret_cast<const float*>(smem + T::kOffSfa + stage * T::kSmemSfa);
      csa0 = sfa[wg * 64 + row_in_wg];
      csa1 = sfa[wg * 64 + row_in_wg + 8];
      issue(part, desc_a_of(stage), desc_b_of(stage), 0);
    };
    if constexpr (T::kCarry) issue_carried();  // every CTA has at least one tile

    for (uint32_t tile = first_unit; tile < sched.num_tiles; tile += unit_stride) {
      uint32_t m_block, n_block;
      tile_of(tile, m_block, n_block);
      const uint32_t n0 = n_block * BLOCK_N;

      // This warpgroup's previous main loop has finished reading its sfb (epilogue barriers).
#pragma unroll
      for (int j = 0; j < T::kSfbPrefetch; ++j) {
        const uint32_t i = tid + j * 128;
        if (i < sfb_count) sfb[i] = sfb_next[j];
      }
      for (uint32_t i = tid + T::kSfbPrefetch * 128; i < sfb_count; i += 128) sfb[i] = sfb_entry(n0, i);
      ptx::named_barrier_sync(wg_barrier, 128);
      // Fetch the next tile's B scales now; they are first needed after this main loop.
      if (tile + unit_stride < sched.num_tiles) {
        const uint32_t next_n0 = n0_of(tile + unit_stride);
#pragma unroll
        for (int j = 0; j < T::kSfbPrefetch; ++j) {
          const uint32_t i = tid + j * 128;
          if (i < sfb_count) sfb_next[j] = sfb_entry(next_n0, i);
        }
      }

      float acc[T::kWaves][kAcc];
      if constexpr (!T::kCarry) {
#pragma unroll
        for (int w = 0; w < T::kWaves; ++w)
#pragma unroll
          for (int i = 0; i < kAcc; ++i) acc[w][i] = 0.0f;
      } else {
        // K block 0: wave 0 is in flight (carried), the other waves follow from the same stage.
        const int boundary = T::kStraddle ? 128 - static_cast<int>(n0 % 128) : 128;
        const float sb0 = sfb[0];
        const float sb1 = T::kStraddle ? sfb[num_kb] : sb0;
        ptx::wgmma_wait_group<0>();
        ptx::fence_operands(part);
        if (T::kWaves == 1) release(stage);
        promote<true>(acc[0], part, csa0, csa1, sb0, sb1, boundary);
        const float* sfa = reinterpret_cast<const float*>(smem + T::kOffSfa + stage * T::kSmemSfa);
#pragma unroll
        for (int w = 1; w < T::kWaves; ++w) {
          const uint32_t row0 = w * T::kWaveM + wg * 64;
          const float sa0 = sfa[row0 + row_in_wg];
          const float sa1 = sfa[row0 + row_in_wg + 8];
          issue(part, desc_a_of(stage), desc_b_of(stage), w * T::kWaveM);
          ptx::wgmma_wait_group<0>();
          ptx::fence_operands(part);
          if (w == T::kWaves - 1) release(stage);
          promote<true>(acc[w], part, sa0, sa1, sb0, sb1, boundary);
        }
        advance();
      }

      // kOffset = n0 % 128 as a constant; columns c of the tile with kOffset + c >= 128 use
      // the second scale block.
      auto main_loop = [&](auto offset_c) {
        constexpr int kBoundary = 128 - decltype(offset_c)::value;
        if constexpr (T::kPipelined) {
          // The promotion of K block kb, its B scales read here.
          auto promote_kb = [&](const float(&part)[kAcc], float sa0, float sa1, uint32_t kb) {
            const float sb0 = sfb[kb];
            const float sb1 = T::kStraddle ? sfb[num_kb + kb] : sb0;
            promote<false>(acc[0], part, sa0, sa1, sb0, sb1, std::integral_constant<int, kBoundary>{});
          };
          const uint32_t row_base = wg * 64;
          // One consumer warpgroup: two partials. K block kb + 1's MMAs are issued before
          // kb's partial is promoted, so the tensor cores work through this warpgroup's
          // wait and promotion (what the second warpgroup does for the 128-row tiles).
          float part0[kAcc], part1[kAcc];
          const float* sfa = reinterpret_cast<const float*>(smem + T::kOffSfa + stage * T::kSmemSfa);
          ptx::mbarrier_wait(full + stage, phase);
          float sa0 = sfa[row_base + row_in_wg], sa1 = sfa[row_base + row_in_wg + 8];
          uint32_t cur = stage;
          issue(part0, desc_a_of(stage), desc_b_of(stage), 0);
          advance();
          // Loads the next K block's A scales and issues its MMAs into `part`; returns its stage.
          auto issue_next = [&](float(&part)[kAcc], float& nsa0, float& nsa1) {
            const float* nsfa = reinterpret_cast<const float*>(smem + T::kOffSfa + stage * T::kSmemSfa);
            ptx::mbarrier_wait(full + stage, phase);
            nsa0 = nsfa[row_base + row_in_wg];
            nsa1 = nsfa[row_base + row_in_wg + 8];
            const uint32_t st = stage;
            issue(part, desc_a_of(st), desc_b_of(st), 0);
            advance();
            return st;
          };
          // Branch-free steady state (ptxas serializes every wgmma of a kernel in which it cannot
          // prove that no accumulator in flight is read): pairs of K blocks while a third follows.
          uint32_t kb = 0;
          float nsa0, nsa1;
          uint32_t next;
#pragma unroll 1
          for (; kb + 2 < num_kb; kb += 2) {  // part0 holds kb, in flight
            next = issue_next(part1, nsa0, nsa1);
            ptx::wgmma_wait_group<1>();
            ptx::fence_operands(part0);
            release(cur);
            promote_kb(part0, sa0, sa1, kb);
            cur = next, sa0 = nsa0, sa1 = nsa1;
            next = issue_next(part0, nsa0, nsa1);  // kb + 2
            ptx::wgmma_wait_group<1>();
            ptx::fence_operands(part1);
            release(cur);
            promote_kb(part1, sa0, sa1, kb + 1);
            cur = next, sa0 = nsa0, sa1 = nsa1;
          }
          // One or two K blocks left; part0 holds kb, in flight.
          if (kb + 1 < num_kb) {
            next = issue_next(part1, nsa0, nsa1);
            ptx::wgmma_wait_group<1>();
            ptx::fence_operands(part0);
            release(cur);
            promote_kb(part0, sa0, sa1, kb);
            ptx::wgmma_wait_group<0>();
            ptx::fence_operands(part1);
            release(next);
            promote_kb(part1, nsa0, nsa1, kb + 1);
          } else {
            ptx::wgmma_wait_group<0>();
            ptx::fence_operands(part0);
            release(cur);
            promote_kb(part0, sa0, sa1, kb);
          }
        } else {
          // Two consumer warpgroups (or two waves): the other one's MMAs run through this
          // one's wait and promotion.
#pragma unroll 4
          for (uint32_t kb = T::kCarry ? 1 : 0; kb < num_kb; ++kb) {
            const float sb0 = sfb[kb];
            const float sb1 = T::kStraddle ? sfb[num_kb + kb] : sb0;
            ptx::mbarrier_wait(full + stage, phase);

            const uint32_t desc_a = desc_a_of(stage), desc_b = desc_b_of(stage);
            const float* sfa = reinterpret_cast<const float*>(smem + T::kOffSfa + stage * T::kSmemSfa);
#pragma unroll
            for (int w = 0; w < T::kWaves; ++w) {
              const uint32_t row0 = w * T::kWaveM + wg * 64;
              // Scales are read before the stage is released (the producer refills it).
              const float sa0 = sfa[row0 + row_in_wg];
              const float sa1 = sfa[row0 + row_in_wg + 8];

              issue(part, desc_a, desc_b, w * T::kWaveM);
              ptx::wgmma_wait_group<0>();
              ptx::fence_operands(part);
              if (w == T::kWaves - 1) release(stage);
              promote<false>(acc[w], part, sa0, sa1, sb0, sb1, std::integral_constant<int, kBoundary>{});
            }
            advance();
          }
        }
      };
      if constexpr (T::kStraddle) {
        constexpr int kStep = gcd_int(BLOCK_N, 128);
        dispatch_scale_offset<0, kStep>(n0 % 128, main_loop);
      } else {
        main_loop(std::integral_constant<int, 0>{});  // boundary 128 >= BLOCK_N: one scale
      }

      if constexpr (T::kCarry)
        if (tile + unit_stride < sched.num_tiles) issue_carried();  // the next tile's K block 0

      // ---- epilogue: registers -> bf16 -> swizzled staging tile -> TMA store ----
      // Per warpgroup: its rows of the staging tile, its barrier, its stores. A warpgroup that
      // finishes its tile first stores and starts the next while the other still issues MMAs
      // (the stage barriers keep the two within kStages K blocks of each other), so the
      // tensor cores do not idle through an epilogue.
      if (tid == 0) ptx::bulk_wait_group_read<0>();  // its previous stores have read smem
      ptx::named_barrier_sync(wg_barrier, 128);
#pragma unroll
      for (int w = 0; w < T::kWaves; ++w) {
        // stmatrix .x2: lane l < 16 addresses row (l % 8) of matrix l / 8, i.e. tile row
        // 16 * warp + l of this wave (matrix 1 holds the h = 1 rows, 8 further down).
        const uint32_t row = w * T::kWaveM + wg * 64 + warp_in_wg * 16 + (lane % 16);
#pragma unroll
        for (int i = 0; i < kAcc / 4; ++i) {
          constexpr int kChunksPerSlab = T::kDSwizzle / 16;
          const uint32_t slab = i / kChunksPerSlab;
          const uint32_t chunk = i % kChunksPerSlab;
          const uint32_t off = swizzle_offset<T::kDSwizzle>(row * T::kDSwizzle + chunk * 16);
          ptx::stmatrix_x2(smem_base + slab * (BLOCK_M * T::kDSwizzle) + off,
                           ptx::pack_bf16x2(acc[w][4 * i + 0], acc[w][4 * i + 1]),
                           ptx::pack_bf16x2(acc[w][4 * i + 2], acc[w][4 * i + 3]));
        }
      }
      ptx::fence_proxy_async_shared();
      ptx::named_barrier_sync(wg_barrier, 128);
      if (tid == 0) {
        // Boxes of 64 rows (kDStoreRows): this warpgroup's rows of each wave. Rows past M, and
        // a cluster's spare tile past M or N, store nothing.
#pragma unroll
        for (int w = 0; w < T::kWaves; ++w) {
          const uint32_t row = w * T::kWaveM + wg * 64;
          if (m_block * BLOCK_M + row >= m) break;
#pragma unroll
          for (int slab = 0; slab < T::kDSlabs; ++slab) {
            const uint32_t col = n0 + slab * T::kDSlabCols;
            if (col < n)
              ptx::tma_store_2d(&tmap_d, smem + slab * (BLOCK_M * T::kDSwizzle) + row * T::kDSwizzle,
                                static_cast<int32_t>(col), static_cast<int32_t>(m_block * BLOCK_M + row));
          }
        }
        ptx::bulk_commit_group();
      }
    }
    if (tid == 0) ptx::bulk_wait_group_read<0>();  // see tma.cuh
    if constexpr (kWatchdog)
      if (tid == 0) ptx::mbarrier_arrive(done);  // this warpgroup is done: run_watchdog stops
  }
  // No CTA may leave while its peer can still multicast into its shared memory or arrive on
  // its barriers: every thread of both CTAs meets here.
  if constexpr (T::kCluster > 1) ptx::cluster_sync();
#elif defined(__CUDA_ARCH__)
  __trap();  // built for a target without wgmma/setmaxnreg: fail loudly, never return garbage
#endif
}

}  // namespace fp8proj::sm90::kernels
