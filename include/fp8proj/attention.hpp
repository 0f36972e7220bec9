// Attention for the MLA block, on the host (fp32 reference) and the device.
//
// Prefill: causal attention within each of B packed sequences (variable lengths).
//   q   [T, H, d_qk] : [q_stride, d_qk, 1]   bf16   (T = total tokens; rows may be strided so
//   k   [T, H, d_qk] : [k_stride, d_qk, 1]   bf16    q/k/v can be views into wider buffers)
//   v   [T, H, d_v]  : [v_stride, d_v, 1]    bf16
//   out [T, H, d_v]  : [H*d_v, d_v, 1]       bf16
//   seq_offsets [B+1] int32, in the memory space of the tensors: sequence b is tokens
//   [seq_offsets[b], seq_offsets[b+1]); token i of a sequence attends to tokens 0..i of it.
//   scores = softmax_scale * q.k, softmax in fp32, output normalized in fp32, bf16 out (or, with
//   out_fp8, that bf16 output quantized to e4m3 + 1x128 scales in the same kernel).
//
// Decode (absorbed MLA): one query token per sequence attends to the latent KV cache.
//   q_latent [B, H, kv_lora] bf16  (q_nope already multiplied by W_UK, so scores are taken
//   q_rope   [B, H, d_rope]  bf16   directly against the cached latent c_kv)
//   cache    [capacity, kv_lora + d_rope] bf16, row = [c_kv | k_rope] of one token (576 wide
//            for DeepSeek-V3 / GLM-5: 512 + 64)
//   cache_start [B], cache_len [B] int32 in the memory space of the tensors (read on the
//            device, so a CUDA graph replays with new lengths): sequence b's tokens are cache
//            rows [cache_start[b], cache_start[b] + cache_len[b]), len >= 1.
//   cache_rows: the capacity (rows the cache buffer holds). The device kernel loads whole
//            64-row blocks through a TMA descriptor of that extent: rows past a sequence's end
//            are never used (whatever they hold, NaN included), rows past cache_rows read as
//            zeros instead of faulting. Required on the device; on the host, every sequence
//            must end within it when it is set.
//   out_latent [B, H, kv_lora] bf16 = softmax(scale * (q_latent.c_kv + q_rope.k_rope)) . c_kv
#pragma once

#include <cstddef>
#include <cstdint>

#include "fp8proj/bf16.hpp"
#include "fp8proj/tensor.hpp"

namespace fp8proj {

struct PrefillAttentionArgs {
  const bf16* q = nullptr;
  const bf16* k = nullptr;
  const bf16* v = nullptr;
  bf16* out = nullptr;
  int64_t q_stride = 0, k_stride = 0, v_stride = 0;  // elements between tokens
  const int32_t* seq_offsets = nullptr;
  int num_seqs = 0;
  int64_t total_tokens = 0;
  int max_seqlen = 0;  // longest sequence (host-known; sizes the grid)
  int heads = 0, d_qk = 0, d_v = 0;
  float softmax_scale = 0;
  // Optional FP8 output in place of `out` (o_proj's input, quantized in the attention epilogue):
  // values [T, H*d_v] e4m3 and 1x128 UE8M0 scales [H*d_v/128][scale_ld] (M-contiguous), exactly
  // quantize_activation() of the bf16 output. Needs d_v % 128 == 0 (every group inside one head:
  // GLM-5 d_v 256, DeepSeek-V3 128), out_fp8.k = H*d_v, out_fp8.m >= total_tokens and the
  // sequences to cover all total_tokens rows. `out` may then be null and is not written.
  Fp8ActivationOut out_fp8;
};

struct DecodeAttentionArgs {
  const bf16* q_latent = nullptr;
  const bf16* q_rope = nullptr;
  const bf16* cache = nullptr;
  int64_t cache_rows = 0;  // capacity of `cache` in rows (see above)
  const int32_t* cache_start = nullptr;
  const int32_t* cache_len = nullptr;
  bf16* out_latent = nullptr;
  int batch = 0, heads = 0, kv_lora = 0, d_rope = 0;
  int max_cache_len = 0;  // upper bound of cache_len (host-known; sizes split-KV work)
  float softmax_scale = 0;
  // Split-KV scratch, device memory of decode_attention_workspace_bytes() bytes, 16-byte aligned:
  // lets a small batch spread each sequence over several CTAs. nullptr: one CTA per (sequence,
  // head group), correct but slower when batch x heads/64 is far below the SM count.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

void prefill_attention(MemorySpace space, const PrefillAttentionArgs& args, StreamHandle stream);
void decode_attention(MemorySpace space, const DecodeAttentionArgs& args, StreamHandle stream);
// Workspace that lets decode_attention split the KV length (depends on batch, heads,
// max_cache_len and the GPU; 0 on the host). Size it once, outside CUDA-graph capture.
size_t decode_attention_workspace_bytes(MemorySpace space, const DecodeAttentionArgs& args);

}  // namespace fp8proj
