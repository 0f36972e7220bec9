// Persistent-grid work decomposition for the sm90_fp8_block kernels. Every CTA (one per SM)
// walks units blockIdx.x, blockIdx.x + gridDim.x, ...; the producer and consumer
// warpgroups of a CTA walk the same sequence, which keeps their pipeline stage/phase
// counters in lock step. Pure integer arithmetic, no shared state.
#pragma once

#include <cstdint>

namespace fp8proj::sm90::kernels {

// 1d2d kernel: tiles of BLOCK_M x BLOCK_N with grouped rasterization.
// Tiles are numbered in groups of `group_m` M blocks; inside a group, M varies fastest:
//   tile t -> group g = t / (group_m * n_blocks), first M block g * group_m,
//             m_block = first + r % rows, n_block = r / rows, r = t mod (group_m * n_blocks),
//             rows = min(group_m, m_blocks - first) (the last group may be short).
// Example, m_blocks = 20, n_blocks = 48, group_m = 16, 132 CTAs: the first wave covers M
// blocks 0-15 x N blocks 0-8, i.e. 16 A row-blocks and 9 B row-blocks live in L2 instead of
// 1 x 132 (A) or 132 x 1 (B).
struct GroupedTileScheduler {
  uint32_t m_blocks, n_blocks, group_m, num_tiles;

  __device__ __forceinline__ GroupedTileScheduler(uint32_t m, uint32_t n, uint32_t block_m,
                                                  uint32_t block_n, uint32_t group)
      : m_blocks((m + block_m - 1) / block_m),
        n_blocks((n + block_n - 1) / block_n),
        group_m(group),
        num_tiles(m_blocks * n_blocks) {}

  __device__ __forceinline__ void decode(uint32_t tile, uint32_t& m_block, uint32_t& n_block) const {
    const uint32_t per_group = group_m * n_blocks;
    const uint32_t g = tile / per_group;
    const uint32_t r = tile - g * per_group;
    const uint32_t first = g * group_m;
    const uint32_t rows = min(group_m, m_blocks - first);
    m_block = first + r % rows;
    n_block = r / rows;
  }
};

// Swap-AB kernel: units (n_tile, split, m_tile) with m_tile fastest, then split, then
// n_tile. Consecutive units (running at the same time on neighbouring SMs) share the same
// weight tile and K range, so a weight block leaves DRAM once even with several token tiles.
// K blocks of split s: [s * kb / S, (s + 1) * kb / S), non-empty because S <= kb.
struct SplitKUnitScheduler {
  uint32_t m_tiles, n_tiles, splits, k_blocks, num_units;

  __device__ __forceinline__ SplitKUnitScheduler(uint32_t m, uint32_t n, uint32_t k, uint32_t tok_tile,
                                                 uint32_t weight_tile, uint32_t split_k)
      : m_tiles((m + tok_tile - 1) / tok_tile),
        n_tiles((n + weight_tile - 1) / weight_tile),  // N % 16: the last weight tile may be partial
        splits(split_k),
        k_blocks(k / 128),
        num_units(m_tiles * n_tiles * split_k) {}

  __device__ __forceinline__ void decode(uint32_t unit, uint32_t& m_tile, uint32_t& n_tile, uint32_t& split,
                                         uint32_t& kb_begin, uint32_t& kb_end) const {
    m_tile = unit % m_tiles;
    const uint32_t rest = unit / m_tiles;
    split = rest % splits;
    n_tile = rest / splits;
    kb_begin = split * k_blocks / splits;
    kb_end = (split + 1) * k_blocks / splits;
  }
};

}  // namespace fp8proj::sm90::kernels
