// Host reference of the MLA attention (include/fp8proj/attention.hpp): the oracle the device
// kernels are tested against. Any head dims; fp32 dot products (8 partial sums), fp64 softmax
// sums and output accumulation, one bf16 rounding at the end. Arguments are checked by
// src/mla/attention_dispatch.cpp before these run.
#pragma once

#include "fp8proj/attention.hpp"

namespace fp8proj::cpu {

void prefill_attention(const PrefillAttentionArgs& args);
// cache_len[b] == 0 gives zeros for sequence b (an empty softmax), as the device path does.
void decode_attention(const DecodeAttentionArgs& args);

}  // namespace fp8proj::cpu
