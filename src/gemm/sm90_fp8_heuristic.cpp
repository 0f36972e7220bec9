// Enumerates and ranks the sm90_fp8_block configurations (see the header for the family).
// The model is a roofline per SM, used only to order candidates; `fp8proj tune` measures.
#include "gemm/sm90_fp8_heuristic.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "fp8proj/error.hpp"
#include "fp8proj/gemm.hpp"

namespace fp8proj::sm90 {

namespace {

// ---- H200 numbers the model uses (leads from KERNEL_NOTES.md; only ratios matter) ----
constexpr double kClockGHz = 1.75;              // sustained SM clock under FP8 WGMMA load
constexpr double kTensorFlopPerClkPerSm = 8192;  // 1979 TFLOP/s dense FP8 / 132 SMs / 1.83 GHz
constexpr double kHbmBytesPerUs = 3.0e6;         // weight streaming by our kernels: 2.7-2.9 TB/s at M <= 128
constexpr double kSmLoadBytesPerUs = 1.1e5;      // ~110 GB/s of L2->SM traffic per SM (TMA, 64 B/clk peak)
constexpr double kSmDramBytesPerUs = 4.5e4;      // ~45 GB/s of DRAM streaming per SM: all SMs are needed
                                                 // to reach HBM speed (132 x 45 GB/s = 5.9 TB/s)
constexpr double kSmDramSwapBytesPerUs = 6.0e4;  // the swap-AB kernel: 2.7 TB/s from 48 SMs (16 KB of weight per stage)
constexpr double kLaunchUs = 3.0;                // launch + prologue + first TMA round trip
constexpr double kUnitOverheadUs = 0.25;         // epilogue sync + store issue per unit
// _c configurations: half of a carried epilogue stays on the critical path, and the carry
// itself costs ~0.4 us per unit. Fit on `fp8proj tune` measurements of every candidate on the
// H200 (994 problems; tests/data/ holds the six model shapes' share, checked by a CPU test):
// _c runs 2-4% slower than its plain twin at K = 1536/2048 (e.g. 256x128 at 16384x2048,
// M = 1024: 62.4 vs 60.9 us) and within +-1% from K = 4096 on; a cost of 0.05 us per unit
// made the heuristic carry wherever it could (regret 2.5% at M > 512 instead of 0.3%).
constexpr double kCarryEpilogueShare = 0.5;
constexpr double kCarryUnitUs = 0.4;
// A split-K unit's hand-over: partial to global memory, fence, counter atomic, and for the last
// split the wait for and read of the others. H200 (GEMM harness, every configuration): splitting
// swap-AB m16..m64 tiles cost 0.6-1.6 us per launch where the model expected a gain.
constexpr double kSplitUnitUs = 1.5;
constexpr int kMaxSplitK = 32;
constexpr int64_t kMaxWorkspaceBytes = int64_t{256} << 20;

// Fraction of the FP8 peak the main loop sustains when compute-bound (rough, per kernel
// shape: one consumer warpgroup cannot hide its own promotion; narrow WGMMA N runs the
// tensor cores below peak).
// H200: 128x128 and 256x128 sustained 1100-1340 TFLOP/s at large M
// (0.56-0.68 of the 1979 peak, clocks included), DeepGEMM 1300-1475 with wider tiles and
// 2-CTA multicast. Narrower N (96/112) costs tensor throughput per tile but fills 132 SMs at
// M = 128-512 where 128-wide tiles leave 27-58% of them idle. Multicast mostly relieves L2
// bandwidth, which matters once every SM streams (many tiles).
double tensor_efficiency(const Config& c) {
  if (c.kind == KernelKind::kGemm1d2d) {
    // One warpgroup waits for its own WGMMAs before promoting; narrow N runs the tensor
    // cores below peak (m64n32: a quarter of the work per instruction of m64n128).
    // The one-warpgroup loop keeps two K blocks in flight (3-23% faster; docs/kernels.md).
    if (c.math_wgs == 1) return c.block_n >= 128 ? 0.62 : (c.block_n >= 64 ? 0.50 : 0.30);
    // 128x192 and 256x128 refit with the carry (above): per tile in steady state at
    // 4096x4096x2048 (per-CTA globaltimer trace) 128x192 does 6% more MACs per us than
    // 256x128 (8.93 us per 24576 outputs vs 12.58 per 32768); the refit cuts the heuristic's
    // regret against the best measured configuration at M > 512 from 2.5% to 0.3% (geometric
    // mean over 492 problems).
    double e = 0.72;
    if (c.block_n <= 96) e = 0.64;
    else if (c.block_n <= 112) e = 0.68;
    else if (c.block_m == 256) e = 0.80;
    else if (c.block_n >= 192) e = 0.84;
    else if (c.block_n >= 160) e = 0.78;
    // H200: with the peer arrivals at .cta release scope (no
    // MEMBAR.GPU per arrival, ptx/cluster.cuh) the cluster variants run within 1-3% of their
    // plain twins in short bursts (GEMM harness); the model rates them 2% lower so that
    // the heuristic keeps the simpler kernel and the tuner decides.
    if (c.cluster > 1) e *= 0.98;
    return e;
  }
  switch (c.block_m) {
    case 16: return 0.25;
    case 32: return 0.40;
    case 64: return 0.55;
    default: return 0.65;
  }
}

const std::vector<Config> kFamily = {
    // Large M: two consumer warpgroups of 64 rows each, 5 stages (5 x 33 KB in flight).
    {KernelKind::kGemm1d2d, 128, 128, 2, 5, 1},
    // Large M, wider tile: 1.2x fewer A re-reads; straddles 128-column scale blocks.
    {KernelKind::kGemm1d2d, 128, 192, 2, 4, 1},
    // Large M, tallest tile: each warpgroup does two 64-row waves (192 accumulator regs).
    {KernelKind::kGemm1d2d, 256, 128, 2, 3, 1},
    // Non-power-of-two widths that fill 132 SMs where 128 leaves waves ragged, e.g.
    // N = 6144 at M = 256: 2 x 64 tiles of 96 (0.97 of a wave) vs 2 x 48 of 128 (0.73);
    // N = 7168: 2 x 64 tiles of 112. 160: N = 16384 at M = 4096 is 25.0 waves vs 31.03 -> 32.
    // All straddle 128-column scale blocks (2 B-scale rows; 4, 8 and 4 main-loop copies).
    {KernelKind::kGemm1d2d, 128, 96, 2, 7, 1},
    {KernelKind::kGemm1d2d, 128, 112, 2, 6, 1},
    {KernelKind::kGemm1d2d, 128, 160, 2, 5, 1},
    // 2-CTA clusters, B multicast: L2->SM bytes per K block and CTA 32 -> 24 KB (128x128),
    // 48 -> 40 KB (256x128), 40 -> 28 KB (128x192). For large M, many tiles per SM.
    {KernelKind::kGemm1d2d, 128, 128, 2, 5, 1, 2},
    {KernelKind::kGemm1d2d, 256, 128, 2, 3, 1, 2},
    {KernelKind::kGemm1d2d, 128, 192, 2, 4, 1, 2},
    {KernelKind::kGemm1d2d, 128, 160, 2, 5, 1, 2},
    // 2-CTA clusters along N, A multicast: one wave of tiles at M = 256..512 and long K, where
    // every CTA of an M block re-reads the same A rows from L2 (N = 6144, M = 256: 64 CTAs
    // per A row-block). L2->SM bytes per K block and CTA 28 -> 20 KB (128x96).
    {KernelKind::kGemm1d2d, 128, 96, 2, 7, 1, 2, true},
    {KernelKind::kGemm1d2d, 128, 112, 2, 6, 1, 2, true},
    {KernelKind::kGemm1d2d, 128, 128, 2, 5, 1, 2, true},
    {KernelKind::kGemm1d2d, 128, 192, 2, 4, 1, 2, true},
    // Medium M (64..512): one consumer warpgroup, 8 stages.
    {KernelKind::kGemm1d2d, 64, 128, 1, 8, 1},
    // Small and medium M, memory-bound: narrow weight tiles so that N / BLOCK_N is close to
    // the SM count without split-K (DeepGEMM's choice there), one consumer warpgroup and
    // as many stages as fit, so that most of a short K range is in flight at once:
    // N = 4096 -> 128 tiles of 32; 6144 -> 128 of 48 (M <= 64) or 2 x 64 of 96 (M <= 128);
    // 7168 -> 112 of 64 or 2 x 64 of 112.
    {KernelKind::kGemm1d2d, 64, 32, 1, 15, 1},
    {KernelKind::kGemm1d2d, 64, 48, 1, 14, 1},
    {KernelKind::kGemm1d2d, 64, 64, 1, 12, 1},
    {KernelKind::kGemm1d2d, 64, 96, 1, 10, 1},
    {KernelKind::kGemm1d2d, 64, 112, 1, 9, 1},
    // Large M, many tiles per CTA: the same tiles carrying the next tile's first K block
    // across the epilogue (harness A/B on the H200: +1-4% at M >= 4096, 2-4% slower at
    // M = 256..1024 -- hence separate configurations, offered from two tiles per CTA).
    {KernelKind::kGemm1d2d, 128, 128, 2, 5, 1, 1, false, true},
    {KernelKind::kGemm1d2d, 128, 160, 2, 5, 1, 1, false, true},
    {KernelKind::kGemm1d2d, 128, 192, 2, 4, 1, 1, false, true},
    {KernelKind::kGemm1d2d, 256, 128, 2, 3, 1, 1, false, true},
    // Small M: weights as the 64-row WGMMA operand, tokens as N = 16/32/64/128.
    {KernelKind::kSwapAB, 16, 128, 2, 11, 1},
    {KernelKind::kSwapAB, 32, 128, 2, 10, 1},
    {KernelKind::kSwapAB, 64, 128, 2, 8, 1},
    {KernelKind::kSwapAB, 128, 128, 2, 5, 1},
    // ... and 64 weight rows, the two warpgroups on alternate K blocks: twice the CTAs on the
    // same weight (N = 4096: 64 instead of 32), no split-K hand-over.
    {KernelKind::kSwapAB, 16, 64, 2, 14, 1},
};

bool parse_int(std::string_view& s, std::string_view prefix, int& out) {
  if (s.substr(0, prefix.size()) != prefix) return false;
  s.remove_prefix(prefix.size());
  const char* first = s.data();
  const char* last = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(first, last, out);
  if (ec != std::errc() || ptr == first) return false;
  s.remove_prefix(static_cast<size_t>(ptr - first));
  return true;
}

int64_t k_blocks(const Problem& p) { return p.k / kBlockK; }

struct Model {
  double est_us;
  double wave_eff;
  int64_t hbm_bytes;
};

Model model(const Config& c, const Problem& p) {
  const TileGrid g = tile_grid(c, p);
  const int64_t kb = k_blocks(p);
  const int64_t kb_per_unit = ceil_div(kb, g.splits);
  const int64_t units_per_sm = ceil_div(g.units, std::max<int64_t>(g.grid, 1));
  const int64_t active_sms = std::min<int64_t>(g.units, p.num_sms);

  // Per unit: tensor time vs. operand load time (whichever bounds the main loop).
  const double rows = c.kind == KernelKind::kGemm1d2d ? c.block_m : c.block_n;  // WGMMA M side
  const double cols = c.kind == KernelKind::kGemm1d2d ? c.block_n : c.block_m;
  const double flop_per_kb = 2.0 * rows * cols * kBlockK;
  const double t_tensor = kb_per_unit * flop_per_kb /
                          (kTensorFlopPerClkPerSm * tensor_efficiency(c) * kClockGHz * 1e3);
  const double shared_rows = c.cluster_on_n ? c.block_m : c.block_n;  // the multicast operand
  const double load_bytes = static_cast<double>(stage_bytes(c.kind, c.block_m, c.block_n)) -
                            (c.cluster > 1 ? shared_rows * kBlockK * (c.cluster - 1) / c.cluster : 0.0);
  const double t_load = kb_per_unit * load_bytes / kSmLoadBytesPerUs;
  const double d_tile_bytes = 2.0 * c.block_m * c.block_n;
  const double partial_bytes = g.splits > 1 ? 4.0 * c.block_m * c.block_n : 0.0;
  // Non-last splits write their partial; the last one reads all of them.
  const double t_epilogue = kUnitOverheadUs + (g.splits > 1 ? kSplitUnitUs : 0.0) +
                            (d_tile_bytes + partial_bytes) / kSmLoadBytesPerUs;
  // The last split of each tile reads all split_k partials back (fixed order).
  const int64_t tiles = g.m_tiles * g.n_tiles;
  const double t_reduce = g.splits > 1 ? ceil_div(tiles, p.num_sms) * g.splits * partial_bytes / kSmLoadBytesPerUs
                                       : 0.0;
  // Carrying (_c): every unit's epilogue but the CTA's last runs under the next tile's first
  // MMAs; the peeled first K block costs a little per unit.
  const double epilogues = c.carry ? 1.0 + (units_per_sm - 1) * kCarryEpilogueShare : units_per_sm;
  const double t_sm = units_per_sm * (std::max(t_tensor, t_load) + (c.carry ? kCarryUnitUs : 0.0)) +
                      epilogues * t_epilogue + t_reduce;

  // DRAM: the weight and activation once (L2 catches re-reads of tiles in flight), the
  // output once, split-K partials half the time (they mostly stay in the 50 MB L2).
  const int64_t m_pad = g.m_tiles * c.block_m;
  const int64_t bytes = p.n * p.k + p.m * p.k + 2 * p.m * p.n + 4 * ceil_div(p.n, 128) * kb +
                        4 * p.m * kb + (g.splits > 1 ? 4 * m_pad * p.n * g.splits : 0);
  // Per-SM streaming rate (H200, 6144x16384 at M = 16): the swap-AB kernel
  // 57 GB/s (48 CTAs, 37 us); the 64-row tiles, of which 16 rows exist, 8-45 GB/s from n32 to
  // n112 (40-64 us): they are rated at half the rate there.
  const double sm_dram = c.kind == KernelKind::kSwapAB ? kSmDramSwapBytesPerUs
                                                        : (p.m <= 16 ? 0.5 : 1.0) * kSmDramBytesPerUs;
  const double t_hbm = std::max(bytes / kHbmBytesPerUs, bytes / (active_sms * sm_dram));

  // The smaller of the two still costs a little (they overlap imperfectly); this also
  // breaks ties between memory-bound configs in favour of less SM work (e.g. swap-AB at M=1).
  const double waves = static_cast<double>(units_per_sm);
  return {kLaunchUs + std::max(t_sm, t_hbm) + 0.15 * std::min(t_sm, t_hbm), g.units / (waves * p.num_sms), bytes};
}

}  // namespace

std::string Config::name() const {
  std::string s = kind == KernelKind::kSwapAB ? "swapab_" : "";
  auto field = [&s](const char* key, int v) { s.append(key).append(std::to_string(v)); };
  field("m", block_m);
  field("n", block_n);
  field("_ws", math_wgs);
  field("_st", stages);
  if (cluster > 1) field(cluster_on_n ? "_mcn" : "_mc", cluster);
  if (carry) s.append("_c");
  if (split_k > 1) field("_sk", split_k);
  return s;
}

Config Config::parse(std::string_view name) {
  Config c;
  std::string_view s = name;
  c.kind = KernelKind::kGemm1d2d;
  if (s.substr(0, 7) == "swapab_") {
    c.kind = KernelKind::kSwapAB;
    s.remove_prefix(7);
  }
  bool ok = parse_int(s, "m", c.block_m) && parse_int(s, "n", c.block_n) &&
            parse_int(s, "_ws", c.math_wgs) && parse_int(s, "_st", c.stages);
  c.split_k = 1;
  c.cluster = 1;
  c.cluster_on_n = false;
  c.carry = false;
  if (ok && s.substr(0, 4) == "_mcn") {
    ok = parse_int(s, "_mcn", c.cluster) && c.cluster > 1;
    c.cluster_on_n = true;
  } else if (ok && s.substr(0, 3) == "_mc") {
    ok = parse_int(s, "_mc", c.cluster) && c.cluster > 1;
  }
  if (ok && s.substr(0, 2) == "_c") {
    c.carry = true;
    s.remove_prefix(2);
  }
  if (ok && !s.empty()) ok = parse_int(s, "_sk", c.split_k) && c.split_k > 1;
  FP8PROJ_CHECK(ok && s.empty(), "sm90 config name '", name,
                "' is not of the form [swapab_]m<BM>n<BN>_ws<W>_st<S>[_mc<C>|_mcn<C>][_c][_sk<K>], e.g. m128n128_ws2_st5");
  FP8PROJ_CHECK(c.cluster == 1 || c.kind == KernelKind::kGemm1d2d, "sm90 config name '", name,
                "': clusters (_mc) exist only for the 1d2d kernels");
  FP8PROJ_CHECK(c.split_k == 1 || c.kind == KernelKind::kSwapAB, "sm90 config name '", name,
                "': split-K (_sk) exists only for swapab_ kernels");
  FP8PROJ_CHECK(!c.carry || (c.kind == KernelKind::kGemm1d2d && c.math_wgs == 2), "sm90 config name '", name,
                "': the carried K block (_c) exists only for two-warpgroup 1d2d kernels");
  return c;
}

const std::vector<Config>& kernel_family() { return kFamily; }

bool is_instantiated(const Config& cfg) {
  Config base = cfg;
  base.split_k = 1;
  return std::find(kFamily.begin(), kFamily.end(), base) != kFamily.end();
}

void check_problem(const Problem& p) {
  FP8PROJ_CHECK(p.m >= 0, "sm90 FP8 GEMM: M must be >= 0, got ", p.m);
  // fp8_block_shape_reason (gemm.hpp): K % 128, N % 16. A last 128-row weight block that is
  // partial needs no code in the kernels: TMA zero-fills the weight rows >= N on load and
  // clips the stores at N; the B-scale row index runs to ceil(N / 128) - 1.
  const std::string why = fp8_block_shape_reason(p.n, p.k);
  FP8PROJ_CHECK(why.empty(), "sm90 FP8 GEMM: ", why, "; run such a layer in bf16");
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  FP8PROJ_CHECK(p.m <= kMax && p.n <= kMax && p.k <= kMax,
                "sm90 FP8 GEMM: M, N, K must be < 2^31 (TMA coordinates are 32-bit), got M=", p.m,
                " N=", p.n, " K=", p.k);
  FP8PROJ_CHECK(p.num_sms > 0, "sm90 FP8 GEMM: num_sms must be > 0, got ", p.num_sms);
}

bool problem_ok(const Problem& p) noexcept {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  return p.m >= 0 && fp8_eligible(p.n, p.k) && p.m <= kMax && p.n <= kMax && p.k <= kMax && p.num_sms > 0;
}

TileGrid tile_grid(const Config& cfg, const Problem& p) {
  TileGrid g;
  g.m_tiles = ceil_div(p.m, cfg.block_m);
  g.n_tiles = ceil_div(p.n, cfg.block_n);
  g.splits = cfg.kind == KernelKind::kSwapAB ? cfg.split_k : 1;
  const int64_t cl = std::max(1, cfg.cluster);
  g.units = (cfg.cluster_on_n ? g.m_tiles * align_up(g.n_tiles, cl) : align_up(g.m_tiles, cl) * g.n_tiles) * g.splits;
  g.grid = std::min<int64_t>(g.units, p.num_sms / cl * cl);
  return g;
}

int64_t smem_bytes(const Config& cfg, int64_t k) {
  const int64_t kb = k / kBlockK;
  const int64_t fixed = smem_fixed_bytes(cfg.kind, cfg.block_m, cfg.block_n, cfg.stages);
  // kGemm1d2d: each consumer warpgroup keeps its own copy of the tile's B scales (the two
  // may be on different tiles; see the kernel's epilogue).
  if (cfg.kind == KernelKind::kGemm1d2d) return fixed + cfg.math_wgs * align_up(kb * b_scale_rows(cfg.block_n) * 4, 16);
  return fixed + align_up(ceil_div(kb, std::max(1, cfg.split_k)) * 4, 16);
}

int64_t split_counter_bytes(int64_t n) { return align_up(kMaxSplitTokenTiles * ceil_div(n, 64) * 4, 256); }

size_t workspace_bytes(const Config& cfg, int64_t m, int64_t n, int64_t k) {
  (void)k;
  if (cfg.kind != KernelKind::kSwapAB || cfg.split_k <= 1 || m <= 0) return 0;
  const int64_t tiles = ceil_div(m, cfg.block_m) * ceil_div(n, cfg.block_n);
  return static_cast<size_t>(split_counter_bytes(n) + tiles * cfg.split_k * int64_t{cfg.block_m} * cfg.block_n * 4);
}

namespace {

// The rules a configuration must keep to run a problem, in the order they are checked.
enum class Rule : uint8_t {
  none, problem, instantiated, nonempty, split_on_swapab, cluster_on_1d2d, cluster_fits,
  split_token_tiles, split_range, smem, workspace
};

Rule broken_rule(const Config& cfg, const Problem& p) noexcept {
  if (!problem_ok(p)) return Rule::problem;
  if (!is_instantiated(cfg)) return Rule::instantiated;
  if (p.m < 1) return Rule::nonempty;
  if (cfg.kind == KernelKind::kGemm1d2d && cfg.split_k != 1) return Rule::split_on_swapab;
  if (cfg.kind == KernelKind::kSwapAB && cfg.cluster != 1) return Rule::cluster_on_1d2d;
  if (cfg.cluster > 1 && p.num_sms < cfg.cluster) return Rule::cluster_fits;
  if (cfg.split_k > 1 && ceil_div(p.m, cfg.block_m) > kMaxSplitTokenTiles) return Rule::split_token_tiles;
  if (cfg.split_k < 1 || cfg.split_k > std::min<int64_t>(kMaxSplitK, k_blocks(p))) return Rule::split_range;
  if (smem_bytes(cfg, p.k) > kMaxSmemPerBlock) return Rule::smem;
  if (static_cast<int64_t>(workspace_bytes(cfg, p.m, p.n, p.k)) > kMaxWorkspaceBytes) return Rule::workspace;
  return Rule::none;
}

}  // namespace

bool can_run(const Config& cfg, const Problem& p) noexcept { return broken_rule(cfg, p) == Rule::none; }

std::string why_illegal(const Config& cfg, const Problem& p) {
  switch (broken_rule(cfg, p)) {
    case Rule::none: return {};
    case Rule::problem:
      try {
        check_problem(p);
      } catch (const Error& e) {
        return e.what();
      }
      return "invalid problem";
    case Rule::instantiated: return "no kernel is instantiated for " + cfg.name();
    case Rule::nonempty: return "M = 0: nothing to compute";
    case Rule::split_on_swapab: return "split-K only exists for swapab kernels";
    case Rule::cluster_on_1d2d: return "clusters only exist for the 1d2d kernels";
    case Rule::cluster_fits:
      return "a cluster of " + std::to_string(cfg.cluster) + " CTAs needs at least as many SMs";
    case Rule::split_token_tiles:
      return "split-K runs at most " + std::to_string(kMaxSplitTokenTiles) + " token tiles (its tile counters are " +
             "laid out for that many), M=" + std::to_string(p.m) + " needs " + std::to_string(ceil_div(p.m, cfg.block_m));
    case Rule::split_range:
      return "split_k " + std::to_string(cfg.split_k) + " outside [1, min(" + std::to_string(kMaxSplitK) +
             ", K/128 = " + std::to_string(k_blocks(p)) + ")]";
    case Rule::smem:
      return "needs " + std::to_string(smem_bytes(cfg, p.k)) + " B of shared memory (K = " + std::to_string(p.k) +
             " adds its B scales), limit " + std::to_string(kMaxSmemPerBlock);
    case Rule::workspace: return "split-K workspace over " + std::to_string(kMaxWorkspaceBytes >> 20) + " MB";
  }
  return "?";
}

int best_split_k(const Config& cfg, const Problem& p) {
  if (cfg.kind != KernelKind::kSwapAB || p.m < 1) return 1;
  Config c = cfg;
  int best = 1;
  double best_us = std::numeric_limits<double>::infinity();
  const int64_t max_split = std::min<int64_t>(kMaxSplitK, k_blocks(p));
  for (int s = 1; s <= max_split; ++s) {
    c.split_k = s;
    if (!can_run(c, p)) continue;
    const double us = model(c, p).est_us;
    if (us < best_us * 0.95) {  // 5%: a split must earn its workspace traffic and reduction
      best_us = us;
      best = s;
    }
  }
  return best;
}

std::vector<Config> candidates(const Problem& p) {
  check_problem(p);
  std::vector<Config> out;
  if (p.m == 0) return out;
  for (const Config& base : kFamily) {
    if (base.kind == KernelKind::kSwapAB) {
      // Swap-AB re-reads the weight once per token tile: worth trying up to 2 tiles (the
      // 64-row tile, made for M <= 16, only with one; not measured with two).
      if (ceil_div(p.m, base.block_m) > (swap_ab_k_split(base.kind, base.block_n) ? 1 : 2)) continue;
      Config c = base;
      c.split_k = best_split_k(base, p);
      if (can_run(c, p)) out.push_back(c);
      if (c.split_k != 1 && can_run(base, p)) out.push_back(base);
    } else if (can_run(base, p)) {
      // Multicast (of B along M, of A along N) cuts L2->SM traffic, which bounds one-wave
      // long-K problems too (M = 512 on 6144 x 16384: 40 KB per CTA and K block at 128 x 192):
      // offered once the pairs fill at least half of the SMs; the measurement decides.
      const int64_t tiles = ceil_div(p.m, base.block_m) * ceil_div(p.n, base.block_n);
      if (base.cluster > 1 && tiles < p.num_sms / 2) continue;
      // Carrying a K block into the next tile needs a next tile: offered from two per CTA.
      if (base.carry && tiles < 2 * p.num_sms) continue;
      out.push_back(base);
    }
  }
  std::sort(out.begin(), out.end(), [](const Config& a, const Config& b) { return a.name() < b.name(); });
  return out;
}

std::vector<Ranked> rank(const Problem& p) {
  std::vector<Ranked> out;
  for (const Config& c : candidates(p)) {
    const Model m = model(c, p);
    out.push_back({c, m.est_us, m.wave_eff, m.hbm_bytes});
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Ranked& a, const Ranked& b) { return a.est_us < b.est_us; });
  return out;
}

Config choose(const Problem& p) {
  check_problem(p);
  FP8PROJ_CHECK(p.m > 0, "sm90 FP8 GEMM: M = 0 has no configuration (the launcher returns early)");
  const std::vector<Ranked> r = rank(p);
  FP8PROJ_CHECK(!r.empty(), "sm90 FP8 GEMM: no legal configuration for M=", p.m, " N=", p.n, " K=", p.k,
                " (K too large for the B-scale buffer of every kernel?)");
  return r.front().config;
}

Config forced(std::string_view name, const Problem& p) {
  const Config c = Config::parse(name);
  const std::string why = why_illegal(c, p);
  FP8PROJ_CHECK(why.empty(), "sm90 config '", name, "' cannot run M=", p.m, " N=", p.n, " K=", p.k,
                ": ", why);
  return c;
}

int raster_group_m(const Config& cfg, const Problem& p) {
  int best = 8;
  int64_t best_rows = std::numeric_limits<int64_t>::max();
  // The scheduler walks cluster units: block_m x (cluster x block_n) along N, else
  // (cluster x block_m) x block_n; num_sms / cluster of them run at once.
  const int64_t cl = std::max(1, cfg.cluster);
  const int64_t unit_m = int64_t{cfg.block_m} * (cfg.cluster_on_n ? 1 : cl);
  const int64_t unit_n = int64_t{cfg.block_n} * (cfg.cluster_on_n ? cl : 1);
  for (int g : {8, 16}) {
    const int64_t rows = g * unit_m + ceil_div(p.num_sms / cl, g) * unit_n;
    if (rows < best_rows) {
      best_rows = rows;
      best = g;
    }
  }
  return best;
}

bool weight_evict_first(const Config& cfg, const Problem& p) {
  const int64_t m_blocks = ceil_div(p.m, int64_t{cfg.block_m});
  return m_blocks <= 4;  // see the header
}

}  // namespace fp8proj::sm90
