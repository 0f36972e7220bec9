// prefill_attention / decode_attention (include/fp8proj/attention.hpp): the argument checks
// both memory spaces share, then the host reference (src/mla/attention_cpu.cpp) or the sm90
// kernels (src/cuda/attention/). The device path reads nothing back from the GPU and allocates
// nothing, so a call can be captured in a CUDA graph.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "fp8proj/attention.hpp"
#include "fp8proj/device.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/log.hpp"
#include "fp8proj/quantize.hpp"
#include "mla/attention_cpu.hpp"

#if FP8PROJ_WITH_CUDA
#include "cuda/attention/attention_kernels.hpp"
#endif

namespace fp8proj {

namespace {

[[maybe_unused]] void check_aligned(const void* p, const char* what) {
  FP8PROJ_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, what,
                " must be 16-byte aligned for the device attention kernels (got address ", p, ")");
}

void check_scale(float scale) {
  FP8PROJ_CHECK(std::isfinite(scale) && scale > 0.0f, "attention softmax_scale must be finite and > 0, got ", scale);
}

// True when there is work to do.
bool check_prefill(const PrefillAttentionArgs& a) {
  FP8PROJ_CHECK(a.num_seqs >= 0 && a.total_tokens >= 0 && a.max_seqlen >= 0,
                "prefill attention needs num_seqs, total_tokens and max_seqlen >= 0, got ", a.num_seqs, ", ",
                a.total_tokens, ", ", a.max_seqlen);
  FP8PROJ_CHECK(a.heads > 0 && a.d_qk > 0 && a.d_v > 0, "prefill attention needs heads, d_qk, d_v > 0, got ",
                a.heads, ", ", a.d_qk, ", ", a.d_v);
  check_scale(a.softmax_scale);
  if (a.num_seqs == 0 || a.total_tokens == 0) return false;
  FP8PROJ_CHECK(a.total_tokens <= std::numeric_limits<int32_t>::max(),
                "prefill attention takes int32 sequence offsets, so at most 2^31-1 tokens, got ", a.total_tokens);
  const bool fp8_out = a.out_fp8.values != nullptr;
  FP8PROJ_CHECK(a.q && a.k && a.v && (a.out || fp8_out) && a.seq_offsets, "prefill attention: a tensor pointer is null");
  if (fp8_out) {
    const int64_t width = int64_t{a.heads} * a.d_v;
    FP8PROJ_CHECK(a.d_v % 128 == 0, "prefill attention's FP8 output needs d_v % 128 == 0 (1x128 groups inside a head), ",
                  "got d_v=", a.d_v);
    FP8PROJ_CHECK(a.out_fp8.scales != nullptr && a.out_fp8.k == width && a.out_fp8.m >= a.total_tokens &&
                      a.out_fp8.scale_ld >= (a.total_tokens + 3) / 4 * 4 && a.out_fp8.scale_ld % 4 == 0,
                  "prefill attention's FP8 output must be ", a.total_tokens, " x ", width,
                  " with scales and a scale stride >= round_up(T, 4) (a multiple of 4), got ", a.out_fp8.m, " x ",
                  a.out_fp8.k, ", scale_ld ", a.out_fp8.scale_ld);
  }
  const int64_t qk_row = int64_t{a.heads} * a.d_qk, v_row = int64_t{a.heads} * a.d_v;
  FP8PROJ_CHECK(a.q_stride >= qk_row && a.k_stride >= qk_row && a.v_stride >= v_row,
                "prefill attention strides must cover a token's heads (q/k >= heads*d_qk = ", qk_row,
                ", v >= heads*d_v = ", v_row, "), got q_stride=", a.q_stride, " k_stride=", a.k_stride,
                " v_stride=", a.v_stride);
  return true;
}

// The host can afford to check what the device must trust: the offsets against the sizes.
void check_prefill_offsets_host(const PrefillAttentionArgs& a) {
  FP8PROJ_CHECK(a.seq_offsets[0] >= 0, "seq_offsets[0] must be >= 0, got ", a.seq_offsets[0]);
  for (int b = 0; b < a.num_seqs; ++b) {
    const int64_t len = int64_t{a.seq_offsets[b + 1]} - a.seq_offsets[b];
    FP8PROJ_CHECK(len >= 0, "seq_offsets must not decrease: sequence ", b, " has length ", len);
    FP8PROJ_CHECK(len <= a.max_seqlen, "sequence ", b, " has ", len, " tokens, more than max_seqlen=", a.max_seqlen,
                  " (the device path sizes its grid by max_seqlen)");
  }
  FP8PROJ_CHECK(a.seq_offsets[a.num_seqs] <= a.total_tokens, "seq_offsets end at ", a.seq_offsets[a.num_seqs],
                ", past total_tokens=", a.total_tokens);
}

bool check_decode(const DecodeAttentionArgs& a) {
  FP8PROJ_CHECK(a.batch >= 0 && a.max_cache_len >= 0, "decode attention needs batch, max_cache_len >= 0, got ",
                a.batch, ", ", a.max_cache_len);
  FP8PROJ_CHECK(a.heads > 0 && a.kv_lora > 0 && a.d_rope >= 0,
                "decode attention needs heads > 0, kv_lora > 0, d_rope >= 0, got ", a.heads, ", ", a.kv_lora, ", ",
                a.d_rope);
  check_scale(a.softmax_scale);
  if (a.batch == 0) return false;
  FP8PROJ_CHECK(a.q_latent && (a.q_rope || a.d_rope == 0) && a.cache && a.cache_start && a.cache_len && a.out_latent,
                "decode attention: a tensor pointer is null");
  return true;
}

[[noreturn]] [[maybe_unused]] void no_cuda(const char* what) {
  FP8PROJ_FAIL(what, " on the device asked for, but this build has no CUDA (configure with FP8PROJ_CUDA=ON)");
}

#if FP8PROJ_WITH_CUDA
void check_sm90(const char* what) {
  const DeviceInfo& d = current_device();
  FP8PROJ_CHECK(d.present, what, " on the device: no GPU (", d.why_absent, ")");
  FP8PROJ_CHECK(d.is_sm90(), what, " runs on sm_90 GPUs (H100/H200) only; this is ", d.name, " (", d.arch(), ")");
}
#endif

}  // namespace

void prefill_attention(MemorySpace space, const PrefillAttentionArgs& a, StreamHandle stream) {
  if (!check_prefill(a)) return;
  if (space == MemorySpace::host) {
    check_prefill_offsets_host(a);
    if (a.out_fp8.values == nullptr) {
      cpu::prefill_attention(a);
      return;
    }
    // The reference of the fused epilogue: the bf16 output, then the 1x128 quantizer.
    std::vector<bf16> out(static_cast<size_t>(a.total_tokens * a.heads * a.d_v));
    PrefillAttentionArgs b = a;
    b.out = out.data();
    b.out_fp8 = {};
    cpu::prefill_attention(b);
    Fp8ActivationOut q = a.out_fp8;
    q.m = a.total_tokens;
    cpu::quantize_activation(out.data(), a.total_tokens, int64_t{a.heads} * a.d_v, q);
    return;
  }
#if FP8PROJ_WITH_CUDA
  FP8PROJ_CHECK(gpu::prefill_attention_supported(a.d_qk, a.d_v), "prefill attention has no device kernel for d_qk=",
                a.d_qk, ", d_v=", a.d_v, "; supported: (64, 64) and d_qk in {192, 256} with d_v in {128, 256}");
  check_sm90("prefill attention");
  FP8PROJ_CHECK(a.q_stride % 8 == 0 && a.k_stride % 8 == 0 && a.v_stride % 8 == 0,
                "device prefill attention needs token strides that are multiples of 8 elements (16 bytes), got q=",
                a.q_stride, " k=", a.k_stride, " v=", a.v_stride);
  check_aligned(a.q, "q");
  check_aligned(a.k, "k");
  check_aligned(a.v, "v");
  if (a.out_fp8.values) {
    check_aligned(a.out_fp8.values, "out_fp8.values");
    check_aligned(a.out_fp8.scales, "out_fp8.scales");
  } else {
    check_aligned(a.out, "out");
  }
  FP8PROJ_CHECK(a.num_seqs <= 65535 && a.heads <= 65535, "device prefill attention takes at most 65535 sequences",
                " and heads per call (grid z and y), got ", a.num_seqs, " and ", a.heads);
  if (a.max_seqlen == 0) return;  // every sequence is empty
  gpu::launch_prefill_attention(a, stream);
#else
  (void)stream;
  no_cuda("prefill attention");
#endif
}

void decode_attention(MemorySpace space, const DecodeAttentionArgs& a, StreamHandle stream) {
  if (!check_decode(a)) return;
  if (space == MemorySpace::host) {
    for (int b = 0; b < a.batch; ++b) {
      FP8PROJ_CHECK(a.cache_start[b] >= 0 && a.cache_len[b] >= 0, "decode attention: sequence ", b,
                    " has cache_start=", a.cache_start[b], " cache_len=", a.cache_len[b], " (both must be >= 0)");
      FP8PROJ_CHECK(a.cache_rows <= 0 || int64_t{a.cache_start[b]} + a.cache_len[b] <= a.cache_rows,
                    "decode attention: sequence ", b, " ends at cache row ", int64_t{a.cache_start[b]} + a.cache_len[b],
                    ", past cache_rows=", a.cache_rows);
    }
    cpu::decode_attention(a);
    return;
  }
#if FP8PROJ_WITH_CUDA
  FP8PROJ_CHECK(a.kv_lora == gpu::kDecodeKvLora && a.d_rope == gpu::kDecodeRope,
                "device decode attention is built for the MLA cache of DeepSeek-V3 / GLM-5 (kv_lora ",
                gpu::kDecodeKvLora, ", rope ", gpu::kDecodeRope, "), got kv_lora=", a.kv_lora, " d_rope=", a.d_rope);
  check_sm90("decode attention");
  check_aligned(a.q_latent, "q_latent");
  check_aligned(a.q_rope, "q_rope");
  check_aligned(a.cache, "cache");
  FP8PROJ_CHECK(a.cache_rows > 0 && a.cache_rows < (int64_t{1} << 31),
                "device decode attention needs cache_rows, the cache's capacity in rows (1 .. 2^31 - 1; the "
                "kernel's TMA descriptor spans it), got ",
                a.cache_rows);
  check_aligned(a.out_latent, "out_latent");
  FP8PROJ_CHECK(a.batch <= 65535, "device decode attention takes at most 65535 sequences per call, got ", a.batch);
  size_t workspace_bytes = 0;
  if (a.workspace != nullptr) {
    check_aligned(a.workspace, "decode attention workspace");
    workspace_bytes = a.workspace_bytes;
  }
  const int sm_count = current_device().sm_count;
  const int splits = gpu::decode_attention_splits(a, sm_count, workspace_bytes);
  if (splits == 1 && gpu::decode_attention_splits(a, sm_count, std::numeric_limits<size_t>::max()) > 1)
    log_once(LogLevel::info, "decode_attention.no_workspace",
             "decode attention: batch x head groups leaves SMs idle, but the workspace is missing or too small "
             "to split the KV length; running one CTA per (sequence, 64 heads). Size it with "
             "decode_attention_workspace_bytes().");
  gpu::launch_decode_attention(a, splits, stream);
#else
  (void)stream;
  no_cuda("decode attention");
#endif
}

size_t decode_attention_workspace_bytes(MemorySpace space, const DecodeAttentionArgs& a) {
  if (space == MemorySpace::host || a.batch <= 0 || a.heads <= 0) return 0;
#if FP8PROJ_WITH_CUDA
  const int splits = gpu::decode_attention_splits(a, current_device().sm_count, std::numeric_limits<size_t>::max());
  return gpu::decode_attention_workspace_bytes_for(a, splits);
#else
  no_cuda("decode attention workspace");
#endif
}

}  // namespace fp8proj
