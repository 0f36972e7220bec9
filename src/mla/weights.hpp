// Internal: one rank's MLA weights in the block's memory space, in the layouts its passes use.
//
//   fused_qkv_a [q_lora + kv_lora + rope, hidden]   rows: q_a_proj, then kv_a_proj_with_mqa
//                                                   (replicated on every rank)
//   q_a_norm [q_lora], kv_a_norm [kv_lora]           replicated
//   q_b [H*(nope+rope), q_in]                        rows of the rank's heads (column-parallel)
//   kv_b [H*nope + H*v, kv_lora]                     the rank's heads, rows permuted: every head's
//                                                   W_UK rows [nope, kv_lora] first, then every
//                                                   head's W_UV rows [v, kv_lora] -- so v is a
//                                                   strided view of kv_b_proj's output with head
//                                                   stride v, and W_UV is one dense [H, v, kv_lora]
//   w_uk_t [H, kv_lora, nope]                        W_UK transposed per head, for the absorbed
//                                                   q_nope . W_UK in the decode (+ nope*kv_lora*2
//                                                   bytes per head: 192 KB for GLM-5)
//   o [hidden, H*v]                                  the rank's columns (row-parallel)
//
// Example (GLM-5, tp 4, rank 1, H = 16): q_b takes rows [4096, 8192) of q_b_proj [16384, 2048];
// kv_b row 16*192 + 3*256 + j is kv_b_proj row (16 + 3)*448 + 192 + j (v row j of global head 19);
// o takes columns [4096, 8192) of o_proj [6144, 16384].
#pragma once

#include <cstdint>

#include "fp8proj/memory.hpp"
#include "fp8proj/mla.hpp"

namespace fp8proj::mla {

struct MlaWeights {
  Buffer fused_qkv_a, q_a_norm, q_b, kv_a_norm, kv_b, w_uk_t, o;

  // From the full host tensors.
  static MlaWeights from_host(MemorySpace space, const MlaConfig& c, const MlaHostWeights& w);
  // Random full tensors (generated in `space`, then sharded): projections N(0, stddev^2), norms
  // 1 + N(0, 0.05^2).
  static MlaWeights random(MemorySpace space, const MlaConfig& c, uint64_t seed, float stddev);

  size_t bytes() const;
  const bf16* w_uv(const MlaConfig& c) const {  // [H, v, kv_lora]
    return kv_b.data<bf16>() + int64_t{c.local_heads()} * c.qk_nope_dim * c.kv_lora_rank;
  }
};

}  // namespace fp8proj::mla
