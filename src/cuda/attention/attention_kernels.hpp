// Host launchers of the sm90 attention kernels (src/cuda/attention/*.cu). They launch on
// `stream` and return: no allocation, no synchronisation, no read of device data, so a call can
// be captured in a CUDA graph. Arguments are assumed valid: src/mla/attention_dispatch.cpp
// checks them (supported head dims, alignment, strides) before calling.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fp8proj/attention.hpp"
#include "fp8proj/tensor.hpp"

namespace fp8proj::gpu {

// (d_qk, d_v) pairs with a compiled prefill kernel: GLM-5 (256, 256), DeepSeek-V3 (192, 128),
// the two mixed pairs, and (64, 64) for small tests.
bool prefill_attention_supported(int d_qk, int d_v);
void launch_prefill_attention(const PrefillAttentionArgs& args, StreamHandle stream);

// The decode kernel is built for the MLA latent cache of DeepSeek-V2/V3 and GLM-5.
inline constexpr int kDecodeKvLora = 512;
inline constexpr int kDecodeRope = 64;
// Heads one CTA processes: the WGMMA M extent (fewer heads are zero-padded).
inline constexpr int kDecodeHeadsPerCta = 64;

// Number of KV splits per (sequence, head group) for this call: enough CTAs to fill `sm_count`
// SMs when batch x head groups is small, at least two 64-token blocks per split, and no more
// than `workspace_bytes` holds (1 = no split, no workspace used).
int decode_attention_splits(const DecodeAttentionArgs& args, int sm_count, size_t workspace_bytes);
size_t decode_attention_workspace_bytes_for(const DecodeAttentionArgs& args, int splits);
void launch_decode_attention(const DecodeAttentionArgs& args, int splits, StreamHandle stream);

}  // namespace fp8proj::gpu
