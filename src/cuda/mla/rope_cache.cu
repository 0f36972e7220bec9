// The MLA block's element-wise glue between its GEMMs: RoPE, the latent cache write and, for
// prefill, the key assembly. Bit-identical to the host reference (src/mla/mla_ops_cpu.cpp).
//
// prefill_rope_kernel, token t of sequence b at position p = t - offsets[b]:
//   q[t, h, nope:]     <- rope(q[t, h, nope:], p)             in place, every local head h
//   kr                 =  rope(k_rope_raw[t, :], p)            one shared (MQA) rope key
//   k[t, h, :]         <- [kv[t, h*nope : (h+1)*nope] | kr]    the attention's key rows
//   cache[row, :]      <- [kv_c[t, :] | kr],  row = cache_start[b] + p  (skipped outside capacity)
// decode_rope_kernel, sequence b at position p = positions[b]:
//   q_rope[b, h, :]    <- rope(q[b, h, nope:], p)
//   cache[row, :]      <- [n(kv_c[b, :]) | rope(k_rope_raw[b, :], p)],  row = cache_start[b] + p,
//                         n = rmsnorm * kv_norm where kv_norm is given (kv_a_layernorm, by one
//                         warp in the norm kernels' order: cuda/quant/rmsnorm_row.cuh), else identity
//   cache_len[b]       <- p + 1
//
// Layouts (shape : stride, elements): see src/mla/mla_ops.hpp. RoPE pairs are interleaved:
// pair i is elements (2i, 2i+1), angle p * inv_freq[i] in fp32 (the reference's fp32 outer
// product); cos and sin are taken in double precision through sincospi, whose argument
// reduction is exact (sin/cos of a large double would take the Payne-Hanek slow path and a
// local-memory stack frame), then rounded to fp32 and scaled by the YaRN mscale.
//
// Launch: one CTA of 256 threads per token (prefill) or per sequence (decode); every global
// access is a 16-byte vector (8 bf16: 4 rope pairs, or 8 key/cache elements), consecutive
// threads on consecutive vectors. Per prefill token of GLM-5 at TP 1 (64 heads): 24 KB of
// k_nope read, 32 KB of keys written, 8 KB of q rope read and written, 1.2 KB of cache: a
// memory-bound pass, ~1.5 ms for 64 x 1024 tokens at 3 TB/s (the k copy is what an engine's
// torch.cat of k_nope and k_pe costs too). The sequence lookup is a binary search over
// offsets[0..B] by thread 0 (B <= a few hundred: 8 L1-resident loads).
#include <cuda_runtime.h>

#include "core/cuda_check.hpp"
#include "cuda/common/launch.hpp"
#include "cuda/common/pdl.cuh"
#include "cuda/mla/mla_kernels.hpp"
#include "cuda/quant/rmsnorm_row.cuh"

namespace fp8proj::mla::gpu {

namespace {

constexpr int kThreads = 256;
constexpr int kVec = 8;             // bf16 per 16-byte access
constexpr int kMaxPairs = 128;      // rope <= 256 (MlaConfig::validate)

__device__ __forceinline__ float lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ uint32_t pack(float a, float b) {
  return static_cast<uint32_t>(float_to_bf16(a).bits) | (static_cast<uint32_t>(float_to_bf16(b).bits) << 16);
}

// cos/sin of the rope pairs at `pos` into shared memory (threads 0 .. pairs-1).
__device__ __forceinline__ void fill_cos_sin(const RopeDims& d, int32_t pos, float* cs, float* sn) {
  const int pairs = d.rope / 2;
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const double a = static_cast<double>(rope_angle(pos, __ldg(d.inv_freq + i)));
    double s, c;
    sincospi(a * 0.318309886183790671537767526745028724, &s, &c);  // a / pi
    cs[i] = static_cast<float>(c) * d.mscale;
    sn[i] = static_cast<float>(s) * d.mscale;
  }
}

// Rotates the 4 interleaved pairs of one 16-byte vector; `pair0` is the index of its first pair.
__device__ __forceinline__ uint4 rope_vec(uint4 v, int pair0, const float* cs, const float* sn) {
  uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float y0, y1;
    rope_pair(lo(w[j]), hi(w[j]), cs[pair0 + j], sn[pair0 + j], y0, y1);
    w[j] = pack(y0, y1);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ uint4 ld16(const bf16* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ void st16(bf16* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }

__global__ void __launch_bounds__(kThreads) prefill_rope_kernel(const PrefillRopeArgs a) {
  __shared__ float cs[kMaxPairs], sn[kMaxPairs];
  __shared__ __align__(16) bf16 kr[2 * kMaxPairs];
  __shared__ int32_t seq_pos[2];  // sequence, position
  const RopeDims& d = a.dims;
  const int64_t t = blockIdx.x;
  if (threadIdx.x == 0) {
    int lo_b = 0, hi_b = a.num_seqs - 1;  // last b with offsets[b] <= t
    while (lo_b < hi_b) {
      const int mid = (lo_b + hi_b + 1) / 2;
      if (__ldg(a.seq_offsets + mid) <= t) lo_b = mid;
      else hi_b = mid - 1;
    }
    seq_pos[0] = lo_b;
    seq_pos[1] = static_cast<int32_t>(t - __ldg(a.seq_offsets + lo_b));
  }
  __syncthreads();
  const int b = seq_pos[0];
  const int32_t pos = seq_pos[1];
  fill_cos_sin(d, pos, cs, sn);
  __syncthreads();
  const int rv = d.rope / kVec;  // 16-byte vectors per rope part
  if (threadIdx.x < rv)
    st16(kr + threadIdx.x * kVec, rope_vec(ld16(a.k_rope_raw + t * a.k_rope_stride + threadIdx.x * kVec),
                                           threadIdx.x * (kVec / 2), cs, sn));
  __syncthreads();

  const int qk = d.nope + d.rope;
  const int nv = d.nope / kVec, kvecs = qk / kVec;
  // Work items, in order: key vectors (heads x kvecs), q rope vectors (heads x rv), cache
  // vectors (kv_lora / 8 + rv). Ranges are contiguous, so warps rarely straddle two kinds.
  const int n_keys = d.heads * kvecs, n_q = d.heads * rv;
  const int n_cache = static_cast<int>(d.kv_lora / kVec) + rv;
  const int64_t row = int64_t{__ldg(a.cache_start + b)} + pos;
  const bool cache_ok = row >= 0 && row < a.cache_capacity;
  bf16* k_row = a.k + t * d.heads * qk;
  for (int i = threadIdx.x; i < n_keys + n_q + n_cache; i += kThreads) {
    if (i < n_keys) {
      const int h = i / kvecs, j = i % kvecs;
      const uint4 v = j < nv ? ld16(a.kv + t * a.kv_stride + h * d.nope + j * kVec)
                             : *reinterpret_cast<const uint4*>(kr + (j - nv) * kVec);
      st16(k_row + h * qk + j * kVec, v);
    } else if (i < n_keys + n_q) {
      const int e = i - n_keys, h = e / rv, j = e % rv;
      bf16* p = a.q + t * a.q_stride + h * qk + d.nope + j * kVec;
      st16(p, rope_vec(*reinterpret_cast<const uint4*>(p), j * (kVec / 2), cs, sn));
    } else if (cache_ok) {
      const int j = i - n_keys - n_q;
      bf16* c = a.cache + row * (d.kv_lora + d.rope) + j * kVec;
      const int lv = static_cast<int>(d.kv_lora / kVec);
      st16(c, j < lv ? ld16(a.kv_c + t * d.kv_lora + j * kVec) : *reinterpret_cast<const uint4*>(kr + (j - lv) * kVec));
    }
  }
}

__global__ void __launch_bounds__(kThreads) decode_rope_kernel(const DecodeRopeArgs a) {
  __shared__ float cs[kMaxPairs], sn[kMaxPairs];
  const RopeDims& d = a.dims;
  const int b = blockIdx.x;
  // positions and q come from earlier work, cache_len is read by the attention after it
  // (cuda/common/pdl.cuh).
  fp8proj::gpu::pdl_wait_then_release();
  const int32_t pos = __ldg(a.positions + b);
  if (threadIdx.x == 0) a.cache_len[b] = pos + 1;
  fill_cos_sin(d, pos, cs, sn);
  __syncthreads();

  const int qk = d.nope + d.rope, rv = d.rope / kVec;
  const int n_q = d.heads * rv, lv = static_cast<int>(d.kv_lora / kVec);
  const int64_t row = int64_t{__ldg(a.cache_start + b)} + pos;
  const bool cache_ok = row >= 0 && row < a.cache_capacity;
  const bf16* kv_c = a.kv_c + b * a.kv_c_stride;
  bf16* c = a.cache + (cache_ok ? row : 0) * (d.kv_lora + d.rope);  // written only where cache_ok
  // With kv_a_layernorm the last warp writes the c_kv part (the norm's own order, one warp per
  // row); the loop below copies it otherwise.
  const bool norm = a.kv_norm != nullptr;
  if (norm && cache_ok && threadIdx.x >= kThreads - 32)
    fp8proj::gpu::warp_rmsnorm_row(kv_c, a.kv_norm, a.kv_norm_eps, d.kv_lora, c, threadIdx.x % 32);
  const int kv_first = norm ? lv : 0;  // the first cache vector the loop writes
  for (int i = threadIdx.x; i < n_q + lv - kv_first + rv; i += kThreads) {
    if (i < n_q) {
      const int h = i / rv, j = i % rv;
      const uint4 v = ld16(a.q + b * a.q_stride + h * qk + d.nope + j * kVec);
      st16(a.q_rope + (int64_t{b} * d.heads + h) * d.rope + j * kVec, rope_vec(v, j * (kVec / 2), cs, sn));
    } else if (cache_ok) {
      const int j = i - n_q + kv_first;
      if (j < lv) st16(c + j * kVec, ld16(kv_c + j * kVec));
      else
        st16(c + j * kVec,
             rope_vec(ld16(a.k_rope_raw + b * a.k_rope_stride + (j - lv) * kVec), (j - lv) * (kVec / 2), cs, sn));
    }
  }
}

}  // namespace

void launch_prefill_rope(const PrefillRopeArgs& a, cudaStream_t stream) {
  if (a.tokens == 0) return;
  prefill_rope_kernel<<<static_cast<unsigned>(a.tokens), kThreads, 0, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

void launch_decode_rope(const DecodeRopeArgs& a, cudaStream_t stream) {
  if (a.batch == 0) return;
  fp8proj::gpu::launch_kernel({dim3(static_cast<unsigned>(a.batch)), dim3(kThreads), 0, stream}, decode_rope_kernel, a);
}

}  // namespace fp8proj::mla::gpu
