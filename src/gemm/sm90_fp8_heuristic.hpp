// Host-only description of the sm90_fp8_block GEMM kernel family and the heuristic that
// picks one configuration per problem. No CUDA headers: unit-testable without a GPU.
//
// Problem: D[M,N] (bf16) = A[M,K] (e4m3, 1x128 scales) . B[N,K]^T (e4m3, 128x128 scales).
//
// Two kernels (src/cuda/kernels/):
//   kGemm1d2d  (sm90_fp8_gemm_1d2d.cuh): tiles of block_m rows of A x block_n columns of D;
//              A is the WGMMA M operand (64 rows per warpgroup and wave), B the N operand.
//              Large and medium M.
//   kSwapAB    (sm90_fp8_gemm_swapab.cuh): D^T = B . A^T; block_n = 128 weight rows per tile
//              are the WGMMA M operand (two warpgroups x 64), block_m tokens the N operand
//              (16..128), optional split-K with a deterministic in-kernel reduction; or
//              block_n = 64 rows, the two warpgroups on alternate K blocks (twice the CTAs on
//              one weight, no split-K). Small M, where the job is to stream the FP8 weight once
//              at HBM speed.
//
// Config names (stable; printed by tools, accepted back by Config::parse):
//   "m128n128_ws2_st5"            kGemm1d2d, block 128x128, 2 consumer warpgroups, 5 stages
//   "m128n128_ws2_st5_mc2"        the same in 2-CTA clusters: the B tile is TMA-multicast to
//                                 the CTA pair computing M blocks 2j and 2j+1
//   "m128n96_ws2_st7_mcn2"        2-CTA clusters along N: the A tile (and nothing else) is
//                                 multicast to the pair computing N blocks 2j and 2j+1 of one
//                                 M block -- for one-wave problems whose every CTA re-reads
//                                 the same few A rows (M = 256..512, long K)
//   "m256n128_ws2_st3_c"          kGemm1d2d that carries each CTA's next tile's first K block
//                                 across the epilogue (its MMAs issued before the stores), so
//                                 the tensor cores do not idle there; pays at many tiles per
//                                 CTA (large M), costs a little at one or two
//   "swapab_m16n128_ws2_st11_sk4" kSwapAB,   16 tokens x 128 weight rows, 11 stages, split-K 4
//   "swapab_m16n64_ws2_st14"      kSwapAB,   16 tokens x 64 weight rows, K split between the
//                                 two warpgroups
// "_mcC"/"_mcnC" appear only when C > 1 (kGemm1d2d), "_c" only for two-warpgroup kGemm1d2d,
// "_skS" only when S > 1 (kSwapAB).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fp8proj/gemm_config.hpp"
#include "fp8proj/selection.hpp"

namespace fp8proj::sm90 {

// KernelKind and Config (the typed configuration) are in include/fp8proj/gemm_config.hpp.

struct Problem {
  int64_t m = 0, n = 0, k = 0;
  int num_sms = 132;
};

// ---- constants shared with the kernels (static_asserts in sm90_fp8_gemm.cu tie them) ----
inline constexpr int kBlockK = 128;                  // one scale block of K = one 128 B swizzle row
inline constexpr int64_t kMaxSmemPerBlock = 232448;  // 227 KB opt-in limit on sm_90
inline constexpr int kBarrierBytes = 256;            // 2 x stages x 8 B mbarriers (+ a flag), stages <= 15

constexpr int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }
constexpr int64_t ceil_div(int64_t x, int64_t y) { return (x + y - 1) / y; }

// B-scale rows a 1d2d tile needs per K block: 1 when the tile lies inside one 128-column
// scale block (block_n divides 128), else 2 (the tile straddles a scale-block boundary).
constexpr int b_scale_rows(int block_n) { return 128 % block_n == 0 ? 1 : 2; }

// Bytes of one pipeline stage: A tile + B tile + A scales (rounded to 128 B for TMA). With
// a 2-CTA cluster each CTA still holds the whole B tile (half of it written by the peer).
constexpr int64_t stage_bytes(KernelKind kind, int block_m, int block_n) {
  return kind == KernelKind::kGemm1d2d
             ? int64_t{block_m} * kBlockK + int64_t{block_n} * kBlockK + align_up(block_m * 4, 128)
             : int64_t{block_n} * kBlockK + int64_t{block_m} * kBlockK + align_up(block_m * 4, 128);
}

// The bf16 output staging tile for the TMA store (1024-aligned: swizzle atoms).
constexpr int64_t d_tile_bytes(int block_m, int block_n) {
  return align_up(int64_t{block_m} * block_n * 2, 1024);
}

// Swap-AB with 64-row weight tiles (the kernel's kAltK): its two warpgroups take alternate K
// blocks of the same rows and it stores from registers; with split-K, warpgroup 0 hands the CTA's
// sum over (N = 2624 gives 41 such tiles for 132 SMs).
constexpr bool swap_ab_k_split(KernelKind kind, int block_n) { return kind == KernelKind::kSwapAB && block_n == 64; }

// Shared memory that does not depend on K: output area | stages | barriers. The output area is
// the bf16 D tile, except for swap_ab_k_split tiles: warpgroup 1's fp32 sums (tokens x 64),
// handed to warpgroup 0 there.
constexpr int64_t smem_fixed_bytes(KernelKind kind, int block_m, int block_n, int stages) {
  const int64_t out = swap_ab_k_split(kind, block_n) ? int64_t{block_m} * 64 * 4 : d_tile_bytes(block_m, block_n);
  return out + stages * stage_bytes(kind, block_m, block_n) + kBarrierBytes;
}

// ---- the family and the heuristic ----

// Every kernel instantiated in sm90_fp8_gemm.cu (split_k = 1). Few on purpose: each costs
// build time (these 29, and 9 copies of three of them compiled for one K: ~30 s of nvcc for
// sm90_fp8_gemm.cu on 2 cores) and binary size.
const std::vector<Config>& kernel_family();

// Same kernel as one of kernel_family(), whatever its split_k.
bool is_instantiated(const Config& cfg);

// Throws fp8proj::Error unless M >= 0, fp8_eligible(N, K) (include/fp8proj/selection.hpp: N
// and K multiples of 128), all < 2^31, num_sms > 0.
void check_problem(const Problem& p);
// The same test without the message: true when check_problem(p) would not throw.
bool problem_ok(const Problem& p) noexcept;

// Empty when cfg can run p correctly, else the reason (for logs and tests).
std::string why_illegal(const Config& cfg, const Problem& p);
// why_illegal(cfg, p).empty() without building the reason: for the call path.
bool can_run(const Config& cfg, const Problem& p) noexcept;

struct TileGrid {
  int64_t m_tiles = 0, n_tiles = 0, splits = 1;
  // align_up(m_tiles, cluster) * n_tiles * splits (along N: m_tiles * align_up(n_tiles,
  // cluster)): the work items (CTA tiles) of the persistent grid; a cluster's spare tile past
  // M or N (odd tile count) counts as work.
  int64_t units = 0;
  int64_t grid = 0;  // CTAs launched: min(units, num_sms rounded down to whole clusters)
};
TileGrid tile_grid(const Config& cfg, const Problem& p);

// Dynamic shared memory the launch needs (fixed part + B scales, which depend on K).
int64_t smem_bytes(const Config& cfg, int64_t k);

// Split-K workspace: tile counters + fp32 partials; 0 when split_k == 1.
size_t workspace_bytes(const Config& cfg, int64_t m, int64_t n, int64_t k);

// Split-K workspace layout: [counters | partials]. The counter region depends on N alone
// (kMaxSplitTokenTiles x N/64 slots: one per tile of the narrowest, 64-row, weight tile), so every
// configuration and M that share one workspace —
// one plan, one weight — agree on where the counters live, and partials of one launch can never
// land on the counters of the next (each launch leaves its counters at zero). A layout sized
// by the launch's own tile count let a 48-tile split-K launch write partials over the counters
// of a following 96-tile one (H200, 6144x16384: unwritten outputs at M=128).
inline constexpr int64_t kMaxSplitTokenTiles = 8;
int64_t split_counter_bytes(int64_t n);

// The split-K factor the heuristic pairs with a kSwapAB kernel for this problem.
int best_split_k(const Config& cfg, const Problem& p);

// Legal configurations worth trying for p: each kernel of the family that is legal, the
// swap-AB ones with best_split_k (and without split, when that differs), sorted by name.
// Throws (check_problem) on an invalid problem. M = 0 yields an empty list.
std::vector<Config> candidates(const Problem& p);

struct Ranked {
  Config config;
  double est_us = 0;       // modelled time; only its order matters
  double wave_eff = 0;     // units / (waves * num_sms)
  int64_t hbm_bytes = 0;   // modelled DRAM traffic
};
// candidates(p) with the model's estimate, best first (ties broken by name: deterministic).
std::vector<Ranked> rank(const Problem& p);

// rank(p).front().config; throws when M = 0 (nothing to run) or the problem is invalid.
Config choose(const Problem& p);

// For tuning: exactly the named configuration, checked for legality against p (throws
// with the reason otherwise).
Config forced(std::string_view name, const Problem& p);

// Grouped rasterization of the 1d2d tile scheduler: consecutive tiles walk `group` M
// blocks (M-block pairs with clusters) for one N block before moving on, so the ~num_sms
// tiles in flight share operands in L2. 8 or 16, whichever keeps fewer distinct A+B rows in
// flight.
int raster_group_m(const Config& cfg, const Problem& p);

// L2 policy of the 1d2d kernel's weight (B) loads: evict-first while at most 4 M blocks read
// each of its tiles, else none. Evict-first spares the dirty lines a model's L2 is full of when
// the weight streams through once (small M: 7-16% faster); when 5+ M blocks read every tile
// it evicts the tile between its readers and the weight comes from DRAM again: on weights the
// L2 holds, the 2-CTA cluster tiles at K <= 2048 ran 1.5-4% slower; on the 96 / 112 MiB ones
// (K = 16384) the kernel read 14% more DRAM bytes (6144 x 16384, M = 4096: 615 vs 532 MB; +0.2%
// without the policy). docs/kernels.md has the measurements.
bool weight_evict_first(const Config& cfg, const Problem& p);

}  // namespace fp8proj::sm90
