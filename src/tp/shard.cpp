// Shard arithmetic and weight slicing (include/fp8proj/tp.hpp). Host code; the device copies
// go through cudaMemcpy2D in CUDA builds.
#include <cstring>
#include <string>
#include <variant>

#include "fp8proj/error.hpp"
#include "fp8proj/formats.hpp"
#include "fp8proj/memory.hpp"
#include "fp8proj/tp.hpp"

#if FP8PROJ_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_check.hpp"
#endif

namespace fp8proj {

const char* to_string(ShardKind kind) {
  switch (kind) {
    case ShardKind::replicated: return "replicated";
    case ShardKind::column: return "column";
    case ShardKind::row: return "row";
  }
  return "?";
}

namespace {

// A range [offset, offset + extent) of a dimension of length `full` covers whole 128-blocks:
// it starts on a block boundary and ends on one or at the edge (where the last block of the
// full weight is itself partial and is taken whole).
bool block_aligned(int64_t offset, int64_t extent, int64_t full) {
  const int64_t end = offset + extent;
  return offset % kScaleBlock == 0 && (end % kScaleBlock == 0 || end == full);
}

void check_split(const char* what, int64_t full_n, int64_t full_k, int rank, int size, int64_t split, int64_t unit,
                 const char* dim) {
  FP8PROJ_CHECK(full_n > 0 && full_k > 0, what, ": weight shape must be positive, got ", full_n, "x", full_k);
  FP8PROJ_CHECK(size >= 1, what, ": tensor-parallel size must be >= 1, got ", size);
  FP8PROJ_CHECK(rank >= 0 && rank < size, what, ": rank ", rank, " is outside [0, ", size, ")");
  FP8PROJ_CHECK(unit >= 1 && split % unit == 0, what, ": ", dim, "=", split, " is not a whole number of units of ",
                unit, " (one head's width)");
  FP8PROJ_CHECK((split / unit) % size == 0, what, ": ", split / unit, " heads (", dim, "=", split, " in units of ",
                unit, ") cannot be split evenly across ", size, " ranks; choose a TP size that divides ", split / unit);
}

}  // namespace

bool ShardSpec::scales_slice_exactly() const {
  return block_aligned(n_offset, n, full_n) && block_aligned(k_offset, k, full_k);
}

bool ShardSpec::fp8_ok() const { return scales_slice_exactly() && n % kScaleBlock == 0 && k % kScaleBlock == 0; }

std::string ShardSpec::fp8_refusal() const {
  if (fp8_ok()) return "";
  const std::string who = "rank " + std::to_string(rank) + "/" + std::to_string(size) + " " + to_string(kind) +
                          " shard " + std::to_string(n) + "x" + std::to_string(k);
  if (n_offset % kScaleBlock != 0)
    return who + " starts at row " + std::to_string(n_offset) + ", inside 128x128 scale block row " +
           std::to_string(n_offset / kScaleBlock) + ": FP8 needs 128-aligned shards, so it stays bf16";
  if (k_offset % kScaleBlock != 0)
    return who + " starts at column " + std::to_string(k_offset) + ", inside 128x128 scale block column " +
           std::to_string(k_offset / kScaleBlock) + ": FP8 needs 128-aligned shards, so it stays bf16";
  return who + ": N=" + std::to_string(n) + ", K=" + std::to_string(k) +
         " are not both multiples of 128, so it stays bf16";
}

std::string ShardSpec::describe() const {
  const std::string head = "rank " + std::to_string(rank) + "/" + std::to_string(size) + " " + to_string(kind) + ": ";
  const std::string full = std::to_string(full_n) + "x" + std::to_string(full_k);
  const std::string mine = std::to_string(n) + "x" + std::to_string(k);
  switch (kind) {
    case ShardKind::column:
      return head + "rows [" + std::to_string(n_offset) + ", " + std::to_string(n_offset + n) + ") of " + full +
             " -> " + mine;
    case ShardKind::row:
      return head + "columns [" + std::to_string(k_offset) + ", " + std::to_string(k_offset + k) + ") of " + full +
             " -> " + mine;
    case ShardKind::replicated: break;
  }
  return head + "all of " + full;
}

ShardSpec column_shard(int64_t full_n, int64_t full_k, int rank, int size, int64_t unit) {
  check_split("column shard", full_n, full_k, rank, size, full_n, unit, "N");
  ShardSpec s{ShardKind::column, rank, size, full_n, full_k, full_n / size, full_k, 0, 0, unit};
  s.n_offset = rank * s.n;
  return s;
}

ShardSpec row_shard(int64_t full_n, int64_t full_k, int rank, int size, int64_t unit) {
  check_split("row shard", full_n, full_k, rank, size, full_k, unit, "K");
  ShardSpec s{ShardKind::row, rank, size, full_n, full_k, full_n, full_k / size, 0, 0, unit};
  s.k_offset = rank * s.k;
  return s;
}

ShardSpec replicated_shard(int64_t full_n, int64_t full_k, int rank, int size) {
  check_split("replicated shard", full_n, full_k, rank, size, /*split=*/size, /*unit=*/1, "ranks");  // nothing splits
  return {ShardKind::replicated, rank, size, full_n, full_k, full_n, full_k, 0, 0, 1};
}

ShardSpec q_b_proj_shard(const MlaDims& d, int rank, int size) {
  FP8PROJ_CHECK(d.heads > 0 && d.qk_nope + d.qk_rope > 0, "q_b_proj shard: MLA dimensions are not set");
  const int64_t k = d.q_lora_rank > 0 ? d.q_lora_rank : d.hidden;
  return column_shard(d.heads * (d.qk_nope + d.qk_rope), k, rank, size, d.qk_nope + d.qk_rope);
}

ShardSpec o_proj_shard(const MlaDims& d, int rank, int size) {
  FP8PROJ_CHECK(d.heads > 0 && d.v_head > 0 && d.hidden > 0, "o_proj shard: MLA dimensions are not set");
  return row_shard(d.hidden, d.heads * d.v_head, rank, size, d.v_head);
}

void copy_shard(void* dst, MemorySpace dst_space, const void* full, MemorySpace full_space, const ShardSpec& s,
                size_t elem_bytes) {
  FP8PROJ_CHECK(dst != nullptr && full != nullptr, "copy_shard: null pointer for ", s.describe());
  FP8PROJ_CHECK(s.n_offset + s.n <= s.full_n && s.k_offset + s.k <= s.full_k, "copy_shard: ", s.describe(),
                " lies outside the weight");
  const auto* src = static_cast<const uint8_t*>(full) + (s.n_offset * s.full_k + s.k_offset) * elem_bytes;
  const size_t row_bytes = static_cast<size_t>(s.k) * elem_bytes, src_pitch = static_cast<size_t>(s.full_k) * elem_bytes;
  if (dst_space == MemorySpace::host && full_space == MemorySpace::host) {
    auto* d = static_cast<uint8_t*>(dst);
    for (int64_t r = 0; r < s.n; ++r) std::memcpy(d + r * row_bytes, src + r * src_pitch, row_bytes);
    return;
  }
#if FP8PROJ_WITH_CUDA
  // One strided copy: a column shard is contiguous (pitch == width), a row shard is n rows of
  // k elements taken every full_k.
  CUDA_CHECK(cudaMemcpy2D(dst, row_bytes, src, src_pitch, row_bytes, static_cast<size_t>(s.n), cudaMemcpyDefault));
#else
  FP8PROJ_FAIL("copy_shard: device memory asked for, but this build has no CUDA");
#endif
}

std::vector<bf16> slice_bf16(const bf16* full, const ShardSpec& s) {
  std::vector<bf16> out(static_cast<size_t>(s.n * s.k));
  copy_shard(out.data(), MemorySpace::host, full, MemorySpace::host, s, sizeof(bf16));
  return out;
}

HostFp8Weight slice_fp8(const Fp8WeightView& full, const ShardSpec& s) {
  FP8PROJ_CHECK(full.n == s.full_n && full.k == s.full_k, "slice_fp8: the FP8 weight is ", full.n, "x", full.k,
                ", the shard was made for ", s.full_n, "x", s.full_k);
  FP8PROJ_CHECK(full.values != nullptr && full.scales != nullptr, "slice_fp8: FP8 weight without values or scales");
  FP8PROJ_CHECK(s.scales_slice_exactly(), "slice_fp8: ", s.fp8_refusal(),
                " (its scales cannot be sliced with their blocks; use dequantize_shard or shard_weight)");
  HostFp8Weight out = make_host_fp8_weight(s.n, s.k);
  copy_shard(out.values.data(), MemorySpace::host, full.values, MemorySpace::host, s, 1);
  // Scales [ceil(N/128), ceil(K/128)] : [ceil(K/128), 1]. Example: 16384x2048 column shard of
  // rank 1/2 takes scale rows [64, 128) of the full 128x16 grid, every column.
  const int64_t rows = out.view().scale_rows(), cols = out.view().scale_cols(), full_cols = full.scale_cols();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      out.scales[r * cols + c] = full.scales[(s.scale_row_offset() + r) * full_cols + s.scale_col_offset() + c];
  return out;
}

std::vector<bf16> dequantize_shard(const Fp8WeightView& full, const ShardSpec& s) {
  FP8PROJ_CHECK(full.n == s.full_n && full.k == s.full_k, "dequantize_shard: the FP8 weight is ", full.n, "x", full.k,
                ", the shard was made for ", s.full_n, "x", s.full_k);
  std::vector<bf16> out(static_cast<size_t>(s.n * s.k));
  for (int64_t r = 0; r < s.n; ++r) {
    const int64_t fr = s.n_offset + r;
    for (int64_t c = 0; c < s.k; ++c) {
      const int64_t fc = s.k_offset + c;
      // Each element keeps the scale of the block it has in the FULL weight, which is what
      // makes an unaligned shard correct here where slicing the scale grid would not be.
      out[r * s.k + c] = float_to_bf16(e4m3_to_float(full.values[fr * full.k + fc]) * full.scale(fr, fc));
    }
  }
  return out;
}

WeightShard shard_weight(const HostWeight& full, const ShardSpec& s) {
  if (const auto* b = std::get_if<HostBf16Weight>(&full)) {
    FP8PROJ_CHECK(b->n == s.full_n && b->k == s.full_k, "shard_weight: the weight is ", b->n, "x", b->k,
                  ", the shard was made for ", s.full_n, "x", s.full_k);
    return {HostBf16Weight{slice_bf16(b->values.data(), s), s.n, s.k}, ""};
  }
  const auto& f = std::get<HostFp8Weight>(full);
  if (s.scales_slice_exactly()) return {slice_fp8(f.view(), s), ""};
  return {HostBf16Weight{dequantize_shard(f.view(), s), s.n, s.k},
          s.fp8_refusal() + "; the checkpoint's FP8 values were dequantized for this shard"};
}

}  // namespace fp8proj
