// The sm90 attention kernels (src/cuda/attention/) against the host reference
// (src/mla/attention_cpu.cpp), plus their speed.
//
// Correctness: relative Frobenius error <= kAttnRelTol = 1e-2 against the host reference on the
// same bf16 inputs, every output element finite (the output is poisoned with NaN bytes before
// each run, so an element never written fails). Where 1e-2 comes from: the kernels round P to
// bf16 before P.V (2^-9 relative per element, averaging out over keys) and both outputs are
// rounded to bf16 (2^-9 each); a correct kernel lands near 3e-3 on this data, and a wrong one
// (a mis-swizzled panel, a wrong mask, a lost rescale) at 1e-1 or more. On failure the error is
// broken down by sequence, 64-column panel and 16-row slice, which points at the fault.
//
// Speed (printed; the GLM-5 TP1 prefill EXPECTs >= 200 TFLOP/s): FLOPs of causal prefill are
// counted as 2 (d_qk + d_v) per (query, key) pair with key <= query, per head: 8 x 1024 tokens
// give 8 x 1024 x 1025 / 2 pairs. Decode GB/s counts the bytes that must move: the cache rows
// of every sequence once (576 bf16 each), q and out.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "cuda/attention/sm90_attention_common.cuh"
#include "fp8proj/attention.hpp"
#include "fp8proj/device.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/memory.hpp"
#include "fp8proj/ops.hpp"
#include "fp8proj/random.hpp"
#include "fp8proj/timing.hpp"
#include "gpu_test_util.hpp"

namespace fp8proj {
namespace {

using testing::GpuTest;
using testing::poisoned;
using testing::to_device;
using testing::to_host;
namespace attn = gpu::attn;

constexpr double kAttnRelTol = 1e-2;
constexpr double kPrefillMinTflops = 200.0;  // GLM-5 TP1, 8 x 1024 causal, H200

std::vector<bf16> random_bf16(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<bf16> v(n);
  for (auto& x : v) x = float_to_bf16(d(rng));
  return v;
}

struct ErrorSums {
  double err2 = 0, ref2 = 0;
  void add(double got, double ref) {
    err2 += (got - ref) * (got - ref);
    ref2 += ref * ref;
  }
  double rel() const { return ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2); }
};

// Compares rows of `cols` values; row_label(r) names the bin (sequence, slice) a row falls in.
struct Comparison {
  double rel = 0, max_abs = 0;
  int64_t non_finite = 0, worst = -1;
  std::string breakdown;
};

template <class RowBins>
Comparison compare_rows(const std::vector<bf16>& got, const std::vector<bf16>& ref, int64_t rows, int cols,
                        RowBins row_bins) {
  Comparison c;
  ErrorSums all;
  std::map<std::string, ErrorSums> bins;
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<std::string> labels = row_bins(r);
    for (int j = 0; j < cols; ++j) {
      const int64_t i = r * cols + j;
      const double g = bf16_to_float(got[i]), x = bf16_to_float(ref[i]);
      if (!std::isfinite(g)) {
        ++c.non_finite;
        if (c.worst < 0) c.worst = i;
        continue;
      }
      all.add(g, x);
      if (std::fabs(g - x) > c.max_abs) {
        c.max_abs = std::fabs(g - x);
        if (c.non_finite == 0) c.worst = i;
      }
      for (const std::string& l : labels) bins[l].add(g, x);
      bins["col panel " + std::to_string(j / 64)].add(g, x);
    }
  }
  c.rel = all.rel();
  for (const auto& [label, e] : bins) c.breakdown += "  " + label + ": rel " + std::to_string(e.rel()) + "\n";
  return c;
}

// ---- the WGMMA building blocks, alone ---------------------------------------------------------
//
// One warpgroup runs each operand form of src/cuda/attention/sm90_attention_common.cuh exactly
// as the kernels do (the same tiles, loads, descriptors and fragment mappings) on small-integer
// data, so every product is exact in fp32 and the result must match the host bit for bit. When
// an attention test fails, these say whether the layouts or the softmax/pipeline are at fault.

std::vector<bf16> small_ints(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(-2, 2);
  std::vector<bf16> v(n);
  for (auto& x : v) x = float_to_bf16(static_cast<float>(d(rng)));
  return v;
}

__device__ uint32_t probe_tile_base(uint8_t* smem_raw) {
  const uint32_t raw = attn::smem_addr(smem_raw);
  return (raw + 1023u) & ~1023u;
}

// Writes a 64 x N accumulator fragment row-major to d.
template <int N>
__device__ void probe_store(const float (&acc)[N / 2], float* d) {
  const int t = threadIdx.x, w = t / 32, g = (t % 32) / 4, q = t % 4;
#pragma unroll
  for (int i = 0; i < N / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int c = 0; c < 2; ++c) d[(16 * w + g + 8 * h) * N + 8 * i + 2 * q + c] = acc[4 * i + 2 * h + c];
}

// D[64, N] = A[64, K] . B[N, K]^T, both K-major SW128 tiles (S = Q.K^T).
template <int N, int K>
__global__ void wgmma_ss_probe(const bf16* a, const bf16* b, float* d) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t ta = probe_tile_base(smem_raw), tb = ta + 64 * K * 2;
  attn::load_tile<64, K, 128>(ta, a, K, 64, threadIdx.x);
  attn::load_tile<N, K, 128>(tb, b, K, N, threadIdx.x);
  attn::cp_async_commit();
  attn::cp_async_wait<0>();
  attn::fence_proxy_async_shared();
  __syncthreads();
  float acc[N / 2];
  attn::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    attn::WgmmaSS<N>::mma(attn::desc_advance(attn::desc_kmajor(ta), (kk / 4) * (64 * 128) + (kk % 4) * 32),
                          attn::desc_advance(attn::desc_kmajor(tb), (kk / 4) * (N * 128) + (kk % 4) * 32), acc,
                          kk > 0 ? 1 : 0);
  attn::wgmma_commit_group();
  attn::wgmma_wait_group<0>();
  attn::reg_fence(acc);
  probe_store<N>(acc, d);
}

// D[64, N] = P[64, KEYS] . V[KEYS, 64 p0 : 64 p0 + N], P taken from global memory into the A
// fragments by the documented register layout, V an N-major SW128 tile of COLS columns.
template <int N, int KEYS, int COLS>
__global__ void wgmma_rs_probe(const bf16* p, const bf16* v, int p0, float* d) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t tv = probe_tile_base(smem_raw);
  attn::load_tile<KEYS, COLS, 128>(tv, v, COLS, KEYS, threadIdx.x);
  attn::cp_async_commit();
  attn::cp_async_wait<0>();
  attn::fence_proxy_async_shared();
  __syncthreads();
  const int t = threadIdx.x, w = t / 32, g = (t % 32) / 4, q = t % 4;
  uint32_t frag[KEYS / 4];
#pragma unroll
  for (int kk = 0; kk < KEYS / 16; ++kk)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int row = 16 * w + g + 8 * (j % 2), col = 16 * kk + 8 * (j / 2) + 2 * q;
      frag[4 * kk + j] = attn::pack_bf16x2(bf16_to_float(p[row * KEYS + col]), bf16_to_float(p[row * KEYS + col + 1]));
    }
  float acc[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = 0.0f;
  attn::reg_fence(acc);
  attn::reg_fence(frag);
  attn::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < KEYS / 16; ++kk) {
    const uint32_t a[4] = {frag[4 * kk], frag[4 * kk + 1], frag[4 * kk + 2], frag[4 * kk + 3]};
    attn::WgmmaRSTransB<N>::mma(
        a, attn::desc_advance(attn::desc_nmajor(tv + p0 * (KEYS * 128), KEYS * 128), kk * 16 * 128), acc, 1);
  }
  attn::wgmma_commit_group();
  attn::wgmma_wait_group<0>();
  attn::reg_fence(acc);
  probe_store<N>(acc, d);
}

// The kernels' chain: S = Q.K^T (SS), P = bf16(S) packed straight from the S accumulators
// (pf[j] = S pair j), O = P.V (RS).
template <int KEYS, int D, int NV>
__global__ void wgmma_chain_probe(const bf16* qm, const bf16* km, const bf16* vm, float* d) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t tq = probe_tile_base(smem_raw), tk = tq + 64 * D * 2, tv = tk + KEYS * D * 2;
  attn::load_tile<64, D, 128>(tq, qm, D, 64, threadIdx.x);
  attn::load_tile<KEYS, D, 128>(tk, km, D, KEYS, threadIdx.x);
  attn::load_tile<KEYS, NV, 128>(tv, vm, NV, KEYS, threadIdx.x);
  attn::cp_async_commit();
  attn::cp_async_wait<0>();
  attn::fence_proxy_async_shared();
  __syncthreads();
  float s[KEYS / 2];
  attn::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    attn::WgmmaSS<KEYS>::mma(attn::desc_advance(attn::desc_kmajor(tq), (kk / 4) * (64 * 128) + (kk % 4) * 32),
                             attn::desc_advance(attn::desc_kmajor(tk), (kk / 4) * (KEYS * 128) + (kk % 4) * 32), s,
                             kk > 0 ? 1 : 0);
  attn::wgmma_commit_group();
  attn::wgmma_wait_group<0>();
  attn::reg_fence(s);
  uint32_t pf[KEYS / 4];
#pragma unroll
  for (int j = 0; j < KEYS / 4; ++j) pf[j] = attn::pack_bf16x2(s[2 * j], s[2 * j + 1]);
  float o[NV / 2];
#pragma unroll
  for (int i = 0; i < NV / 2; ++i) o[i] = 0.0f;
  attn::reg_fence(o);
  attn::reg_fence(pf);
  attn::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < KEYS / 16; ++kk) {
    const uint32_t a[4] = {pf[4 * kk], pf[4 * kk + 1], pf[4 * kk + 2], pf[4 * kk + 3]};
    attn::WgmmaRSTransB<NV>::mma(a, attn::desc_advance(attn::desc_nmajor(tv, KEYS * 128), kk * 16 * 128), o, 1);
  }
  attn::wgmma_commit_group();
  attn::wgmma_wait_group<0>();
  attn::reg_fence(o);
  probe_store<NV>(o, d);
}

template <class Kernel, class... Args>
void launch_probe(Kernel kernel, int smem_bytes, Args... args) {
  ASSERT_EQ(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes + 1024), cudaSuccess);
  kernel<<<1, 128, smem_bytes + 1024>>>(args...);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// Host matrix product on bf16-exact small integers: exact in double and in fp32.
std::vector<float> host_matmul(const std::vector<bf16>& a, const std::vector<bf16>& b, int m, int n, int k,
                               bool b_is_nk, int b_ld, int b_col0) {
  std::vector<float> d(static_cast<size_t>(m) * n);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double acc = 0;
      for (int x = 0; x < k; ++x) {
        const bf16 bv = b_is_nk ? b[static_cast<size_t>(j) * b_ld + x] : b[static_cast<size_t>(x) * b_ld + b_col0 + j];
        acc += double(bf16_to_float(a[static_cast<size_t>(i) * k + x])) * bf16_to_float(bv);
      }
      d[static_cast<size_t>(i) * n + j] = static_cast<float>(acc);
    }
  return d;
}

void expect_exact(const std::vector<float>& got, const std::vector<float>& want, int n, const char* what) {
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i]) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size() << " differ; first at row " << first / n << " col "
                    << first % n << ": got " << (first >= 0 ? got[first] : 0.f) << ", want "
                    << (first >= 0 ? want[first] : 0.f);
}

class Sm90AttentionBlocks : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (!IsSkipped() && !current_device().is_sm90()) GTEST_SKIP() << "WGMMA needs sm_90, this is " << current_device().arch();
  }
};

template <int N, int K>
void run_ss_probe() {
  const auto a = small_ints(64 * K, 1), b = small_ints(N * K, 2);
  Buffer da = to_device(a), db = to_device(b), dd = poisoned(64 * N * sizeof(float));
  launch_probe(wgmma_ss_probe<N, K>, (64 + N) * K * 2, da.data<bf16>(), db.data<bf16>(), dd.data<float>());
  expect_exact(to_host<float>(dd.data(), 64 * N), host_matmul(a, b, 64, N, K, true, K, 0), N,
               ("SS K-major m64n" + std::to_string(N) + ", K=" + std::to_string(K)).c_str());
}

TEST_F(Sm90AttentionBlocks, WgmmaSSKMajorMatchesHost) {
  run_ss_probe<64, 256>();   // GLM-5 S block (4 panels of K)
  run_ss_probe<128, 192>();  // DeepSeek-V3 S block
  run_ss_probe<64, 576>();   // decode S block (9 panels)
}

template <int N, int KEYS, int COLS>
void run_rs_probe(int p0) {
  const auto p = small_ints(64 * KEYS, 3), v = small_ints(size_t(KEYS) * COLS, 4);
  Buffer dp = to_device(p), dv = to_device(v), dd = poisoned(64 * N * sizeof(float));
  launch_probe(wgmma_rs_probe<N, KEYS, COLS>, KEYS * COLS * 2, dp.data<bf16>(), dv.data<bf16>(), p0, dd.data<float>());
  expect_exact(to_host<float>(dd.data(), 64 * N), host_matmul(p, v, 64, N, KEYS, false, COLS, 64 * p0), N,
               ("RS N-major m64n" + std::to_string(N) + ", keys " + std::to_string(KEYS) + ", panel " +
                std::to_string(p0))
                   .c_str());
}

TEST_F(Sm90AttentionBlocks, WgmmaRSTransposedBMatchesHost) {
  run_rs_probe<256, 64, 256>(0);  // GLM-5 P.V
  run_rs_probe<128, 128, 128>(0);  // DeepSeek-V3 P.V
  run_rs_probe<64, 128, 64>(0);    // the (64, 64) test kernel
  run_rs_probe<256, 64, 576>(0);   // decode, warpgroup 0: latent columns 0..255
  run_rs_probe<256, 64, 576>(4);   // decode, warpgroup 1: latent columns 256..511
}

template <int KEYS, int D, int NV>
void run_chain_probe() {
  // |S| <= 2 * 2 * D and exact; bf16 holds integers up to 256 exactly, so keep D * 4 <= 256 by
  // using entries in {-1, 0, 1} for Q and K.
  auto q = small_ints(64 * D, 5), k = small_ints(size_t(KEYS) * D, 6);
  for (auto* m : {&q, &k})
    for (auto& x : *m) x = float_to_bf16(std::fmax(-1.0f, std::fmin(1.0f, bf16_to_float(x))));
  const auto v = small_ints(size_t(KEYS) * NV, 7);
  Buffer dq = to_device(q), dk = to_device(k), dv = to_device(v), dd = poisoned(64 * NV * sizeof(float));
  launch_probe(wgmma_chain_probe<KEYS, D, NV>, (64 * D + KEYS * D + KEYS * NV) * 2, dq.data<bf16>(), dk.data<bf16>(),
               dv.data<bf16>(), dd.data<float>());
  const auto s = host_matmul(q, k, 64, KEYS, D, true, D, 0);
  std::vector<bf16> sb(s.size());
  for (size_t i = 0; i < s.size(); ++i) sb[i] = float_to_bf16(s[i]);
  expect_exact(to_host<float>(dd.data(), 64 * NV), host_matmul(sb, v, 64, NV, KEYS, false, NV, 0), NV,
               ("chain S=QK^T -> P -> P.V, keys " + std::to_string(KEYS)).c_str());
}

TEST_F(Sm90AttentionBlocks, ScoresFeedPVWithoutShuffles) {
  run_chain_probe<64, 64, 256>();
  run_chain_probe<128, 64, 128>();
}

// ---- prefill -----------------------------------------------------------------------------------

// Packed sequences; q strided (8 elements of padding after the heads), k and v views into one
// [T, H*(d_qk + d_v) + 8] buffer, as a fused projection output would hold them.
struct PrefillProblem {
  int heads, d_qk, d_v;
  float scale;
  std::vector<int32_t> lengths, offsets;
  int64_t tokens = 0, q_stride = 0, kv_stride = 0;
  int max_len = 0;
  std::vector<bf16> q, kv;

  PrefillProblem(std::vector<int32_t> lens, int h, int dqk, int dv, float scale_mult, uint32_t seed)
      : heads(h), d_qk(dqk), d_v(dv), lengths(std::move(lens)) {
    scale = scale_mult / std::sqrt(static_cast<float>(d_qk));
    offsets.push_back(0);
    for (int32_t l : lengths) {
      offsets.push_back(offsets.back() + l);
      max_len = std::max(max_len, l);
    }
    tokens = offsets.back();
    q_stride = int64_t{heads} * d_qk + 8;
    kv_stride = int64_t{heads} * (d_qk + d_v) + 8;
    q = random_bf16(static_cast<size_t>(tokens * q_stride), seed);
    kv = random_bf16(static_cast<size_t>(tokens * kv_stride), seed + 1);
  }

  PrefillAttentionArgs args(const bf16* q_ptr, const bf16* kv_ptr, bf16* out, const int32_t* offs) const {
    PrefillAttentionArgs a;
    a.q = q_ptr;
    a.k = kv_ptr;
    a.v = kv_ptr + int64_t{heads} * d_qk;
    a.out = out;
    a.q_stride = q_stride;
    a.k_stride = a.v_stride = kv_stride;
    a.seq_offsets = offs;
    a.num_seqs = static_cast<int>(lengths.size());
    a.total_tokens = tokens;
    a.max_seqlen = max_len;
    a.heads = heads;
    a.d_qk = d_qk;
    a.d_v = d_v;
    a.softmax_scale = scale;
    return a;
  }

  // Bins of output row r = token * heads + head: its sequence and its 16-row slice of the CTA's
  // 128-row block (slice s belongs to warp s % 4 of warpgroup s / 4).
  std::vector<std::string> bins(int64_t r) const {
    const int64_t t = r / heads;
    int b = 0;
    while (offsets[b + 1] <= t) ++b;
    const int64_t local = t - offsets[b];
    return {"sequence " + std::to_string(b) + " (len " + std::to_string(lengths[b]) + ")",
            "row slice " + std::to_string((local % 128) / 16)};
  }
};

struct PrefillCase {
  int d_qk, d_v;
  float scale_mult;
};

class PrefillAttentionGpu : public GpuTest, public ::testing::WithParamInterface<PrefillCase> {};

TEST_P(PrefillAttentionGpu, MatchesHostReference) {
  const PrefillCase pc = GetParam();
  // Odd lengths (1, 7, 129, 1000), block-boundary lengths (64, 128) and an empty sequence, in
  // mixed order so that sequence starts are not multiples of anything.
  const PrefillProblem p({129, 1, 0, 1000, 7, 64, 128}, 3, pc.d_qk, pc.d_v, pc.scale_mult, 100u + pc.d_qk + pc.d_v);
  const int64_t out_elems = p.tokens * p.heads * p.d_v;

  std::vector<bf16> ref(static_cast<size_t>(out_elems));
  prefill_attention(MemorySpace::host, p.args(p.q.data(), p.kv.data(), ref.data(), p.offsets.data()), nullptr);

  Buffer dq = to_device(p.q), dkv = to_device(p.kv), doffs = to_device(p.offsets);
  Buffer dout = poisoned(static_cast<size_t>(out_elems) * sizeof(bf16));
  prefill_attention(MemorySpace::device,
                    p.args(dq.data<bf16>(), dkv.data<bf16>(), dout.data<bf16>(), doffs.data<int32_t>()), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = to_host<bf16>(dout.data(), static_cast<size_t>(out_elems));

  const Comparison c = compare_rows(got, ref, p.tokens * p.heads, p.d_v, [&](int64_t r) { return p.bins(r); });
  std::printf("[prefill d_qk=%d d_v=%d scale x%.0f] rel Frobenius %.3e, max abs %.3e, non-finite %ld\n", p.d_qk,
              p.d_v, pc.scale_mult, c.rel, c.max_abs, long(c.non_finite));
  EXPECT_EQ(c.non_finite, 0) << "outputs never written (NaN poison) or not finite; first at element " << c.worst;
  EXPECT_LE(c.rel, kAttnRelTol) << "worst element " << c.worst << " (token " << c.worst / (p.heads * p.d_v)
                                << ", head " << (c.worst / p.d_v) % p.heads << ", col " << c.worst % p.d_v
                                << ")\nbreakdown:\n"
                                << c.breakdown;
}

INSTANTIATE_TEST_SUITE_P(HeadDims, PrefillAttentionGpu,
                         ::testing::Values(PrefillCase{256, 256, 1.0f}, PrefillCase{192, 128, 1.0f},
                                           PrefillCase{192, 256, 1.0f}, PrefillCase{256, 128, 1.0f},
                                           PrefillCase{64, 64, 1.0f},
                                           // large logits: the running max moves a lot, so the
                                           // rescaling of O and l is exercised hard
                                           PrefillCase{256, 256, 8.0f}, PrefillCase{192, 128, 8.0f}),
                         [](const auto& info) {
                           return "qk" + std::to_string(info.param.d_qk) + "_v" + std::to_string(info.param.d_v) +
                                  (info.param.scale_mult > 1 ? "_sharp" : "");
                         });

// The FP8 epilogue (o_proj's input written by the attention kernel): bit for bit the device
// quantize_activation of the kernel's own bf16 output -- codes and scales of every row, scale
// padding rows 1.0 -- for the head shapes with d_v % 128 == 0 (DeepSeek-V3 128, GLM-5 256).
class PrefillAttentionFp8OutGpu : public GpuTest, public ::testing::WithParamInterface<PrefillCase> {};

TEST_P(PrefillAttentionFp8OutGpu, EqualsQuantizedBf16Output) {
  const PrefillCase pc = GetParam();
  const PrefillProblem p({129, 1, 0, 1000, 7, 64, 131}, 3, pc.d_qk, pc.d_v, pc.scale_mult, 300u + pc.d_qk + pc.d_v);
  const int64_t T = p.tokens, width = int64_t{p.heads} * p.d_v, ld = (T + 3) / 4 * 4 + 4;
  Buffer dq = to_device(p.q), dkv = to_device(p.kv), doffs = to_device(p.offsets);
  Buffer dout = poisoned(static_cast<size_t>(T * width) * sizeof(bf16));
  prefill_attention(MemorySpace::device,
                    p.args(dq.data<bf16>(), dkv.data<bf16>(), dout.data<bf16>(), doffs.data<int32_t>()), nullptr);
  // Reference: the bf16 output through the device quantizer.
  Buffer ref_v = poisoned(static_cast<size_t>(T * width)), ref_s = poisoned(static_cast<size_t>(width / 128 * ld) * 4);
  const Fp8ActivationOut ref{ref_v.data<uint8_t>(), ref_s.data<float>(), T, width, ld};
  quant_ops(MemorySpace::device).quantize_activation(dout.data<bf16>(), T, width, ref, nullptr);
  // Fused: poisoned buffers, bf16 output pointer null.
  Buffer got_v = poisoned(static_cast<size_t>(T * width)), got_s = poisoned(static_cast<size_t>(width / 128 * ld) * 4);
  PrefillAttentionArgs a = p.args(dq.data<bf16>(), dkv.data<bf16>(), nullptr, doffs.data<int32_t>());
  a.out_fp8 = {got_v.data<uint8_t>(), got_s.data<float>(), T, width, ld};
  prefill_attention(MemorySpace::device, a, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto rv = to_host<uint8_t>(ref_v.data(), static_cast<size_t>(T * width));
  const auto gv = to_host<uint8_t>(got_v.data(), rv.size());
  const auto rs = to_host<uint32_t>(ref_s.data(), static_cast<size_t>(width / 128 * ld));
  const auto gs = to_host<uint32_t>(got_s.data(), rs.size());
  int64_t bad_v = 0, bad_s = 0;
  for (size_t i = 0; i < rv.size(); ++i) bad_v += rv[i] != gv[i];
  const int64_t padded = (T + 3) / 4 * 4;
  for (int64_t g = 0; g < width / 128; ++g)
    for (int64_t r = 0; r < padded; ++r) bad_s += rs[g * ld + r] != gs[g * ld + r];
  EXPECT_EQ(bad_v, 0) << "e4m3 codes differing from quantize_activation(bf16 output)";
  EXPECT_EQ(bad_s, 0) << "scales (padding rows included) differing from quantize_activation(bf16 output)";
  // The host path of the same arguments: the CPU attention then the CPU quantizer.
  std::vector<uint8_t> hv(static_cast<size_t>(T * width));
  std::vector<float> hs(static_cast<size_t>(width / 128 * ld));
  PrefillAttentionArgs h = p.args(p.q.data(), p.kv.data(), nullptr, p.offsets.data());
  h.out_fp8 = {hv.data(), hs.data(), T, width, ld};
  EXPECT_NO_THROW(prefill_attention(MemorySpace::host, h, nullptr));
}

INSTANTIATE_TEST_SUITE_P(HeadDims, PrefillAttentionFp8OutGpu,
                         ::testing::Values(PrefillCase{256, 256, 1.0f}, PrefillCase{192, 128, 1.0f},
                                           PrefillCase{192, 256, 1.0f}, PrefillCase{256, 128, 1.0f},
                                           PrefillCase{256, 256, 8.0f}),
                         [](const auto& info) {
                           return "qk" + std::to_string(info.param.d_qk) + "_v" + std::to_string(info.param.d_v) +
                                  (info.param.scale_mult > 1 ? "_sharp" : "");
                         });

class PrefillAttentionGpuArgs : public GpuTest {};

TEST_F(PrefillAttentionGpuArgs, RejectsWhatTheKernelsCannotDo) {
  const PrefillProblem p({5}, 1, 64, 64, 1.0f, 1u);
  Buffer dq = to_device(p.q), dkv = to_device(p.kv), doffs = to_device(p.offsets);
  Buffer dout = poisoned(static_cast<size_t>(p.tokens * p.d_v) * sizeof(bf16) + 64);
  auto args = [&] { return p.args(dq.data<bf16>(), dkv.data<bf16>(), dout.data<bf16>(), doffs.data<int32_t>()); };
  PrefillAttentionArgs a = args();
  a.d_qk = a.d_v = 128;  // no kernel for (128, 128)
  a.q_stride = a.k_stride = a.v_stride = 1024;
  EXPECT_THROW(prefill_attention(MemorySpace::device, a, nullptr), Error);
  a = args();
  a.q_stride += 4;  // not a multiple of 8 elements
  EXPECT_THROW(prefill_attention(MemorySpace::device, a, nullptr), Error);
  a = args();
  a.out = dout.data<bf16>() + 1;  // 2-byte offset
  EXPECT_THROW(prefill_attention(MemorySpace::device, a, nullptr), Error);
  a = args();
  a.num_seqs = 0;  // nothing to do
  EXPECT_NO_THROW(prefill_attention(MemorySpace::device, a, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// ---- decode ------------------------------------------------------------------------------------

constexpr int kLora = 512, kRope = 64, kRow = kLora + kRope;

struct DecodeProblem {
  int heads;
  std::vector<int32_t> start, len;
  int64_t capacity;
  float scale;
  std::vector<bf16> q_latent, q_rope, cache;

  // Sequences placed back to front with gaps in a shared cache, as a paged allocator might.
  DecodeProblem(int h, std::vector<int32_t> lens, uint32_t seed) : heads(h), len(std::move(lens)) {
    int64_t pos = 3;
    start.resize(len.size());
    for (size_t i = len.size(); i-- > 0;) {
      start[i] = static_cast<int32_t>(pos);
      pos += len[i] + 5;
    }
    capacity = pos;
    scale = 1.0f / std::sqrt(192.0f);  // the MLA scale uses d_qk of the un-absorbed head (192)
    q_latent = random_bf16(len.size() * heads * kLora, seed);
    q_rope = random_bf16(len.size() * heads * kRope, seed + 1);
    cache = random_bf16(static_cast<size_t>(capacity * kRow), seed + 2);
  }
  int batch() const { return static_cast<int>(len.size()); }

  DecodeAttentionArgs args(const bf16* ql, const bf16* qr, const bf16* c, const int32_t* st, const int32_t* ln,
                           bf16* out) const {
    DecodeAttentionArgs a;
    a.q_latent = ql;
    a.q_rope = qr;
    a.cache = c;
    a.cache_rows = capacity;
    a.cache_start = st;
    a.cache_len = ln;
    a.out_latent = out;
    a.batch = batch();
    a.heads = heads;
    a.kv_lora = kLora;
    a.d_rope = kRope;
    a.max_cache_len = *std::max_element(len.begin(), len.end());
    a.softmax_scale = scale;
    return a;
  }

  std::vector<bf16> reference() const {
    std::vector<bf16> out(static_cast<size_t>(batch()) * heads * kLora);
    decode_attention(MemorySpace::host,
                     args(q_latent.data(), q_rope.data(), cache.data(), start.data(), len.data(), out.data()), nullptr);
    return out;
  }

  std::vector<std::string> bins(int64_t r) const {
    const int b = static_cast<int>(r / heads), h = static_cast<int>(r % heads);
    return {"sequence " + std::to_string(b) + " (len " + std::to_string(len[b]) + ")",
            "head group " + std::to_string(h / 64), "head slice " + std::to_string((h % 64) / 16)};
  }
};

struct DecodeDeviceBuffers {
  Buffer ql, qr, cache, start, len, out, workspace;
  DecodeAttentionArgs args;

  DecodeDeviceBuffers(const DecodeProblem& p, bool with_workspace)
      : ql(to_device(p.q_latent)), qr(to_device(p.q_rope)), cache(to_device(p.cache)), start(to_device(p.start)),
        len(to_device(p.len)) {
    out = poisoned(static_cast<size_t>(p.batch()) * p.heads * kLora * sizeof(bf16));
    args = p.args(ql.data<bf16>(), qr.data<bf16>(), cache.data<bf16>(), start.data<int32_t>(), len.data<int32_t>(),
                  out.data<bf16>());
    if (with_workspace) {
      const size_t bytes = decode_attention_workspace_bytes(MemorySpace::device, args);
      if (bytes > 0) {
        workspace = poisoned(bytes);  // NaN: a partial never written would show
        args.workspace = workspace.data();
        args.workspace_bytes = bytes;
      }
    }
  }
};

struct DecodeCase {
  int heads;
  bool workspace;
};

class DecodeAttentionGpu : public GpuTest, public ::testing::WithParamInterface<DecodeCase> {};

TEST_P(DecodeAttentionGpu, MatchesHostReference) {
  const DecodeCase dc = GetParam();
  const DecodeProblem p(dc.heads, {1, 7, 129, 1000, 64}, 7u + dc.heads);
  const auto ref = p.reference();
  DecodeDeviceBuffers d(p, dc.workspace);
  std::printf("[decode H=%d] workspace %zu bytes\n", p.heads, d.args.workspace_bytes);
  decode_attention(MemorySpace::device, d.args, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = to_host<bf16>(d.out.data(), ref.size());
  const Comparison c = compare_rows(got, ref, int64_t{p.batch()} * p.heads, kLora, [&](int64_t r) { return p.bins(r); });
  std::printf("[decode H=%d %s] rel Frobenius %.3e, max abs %.3e, non-finite %ld\n", p.heads,
              dc.workspace ? "split-KV" : "unsplit", c.rel, c.max_abs, long(c.non_finite));
  EXPECT_EQ(c.non_finite, 0) << "outputs never written (NaN poison) or not finite; first at element " << c.worst;
  EXPECT_LE(c.rel, kAttnRelTol) << "worst element " << c.worst << "\nbreakdown:\n" << c.breakdown;
}

// 16 heads (GLM-5 TP4: one padded group), 20 (not a multiple of 16), 64 (GLM-5 TP1), 128
// (DeepSeek-V3 TP1: two groups); with a workspace (split KV for this batch of 5) and without.
INSTANTIATE_TEST_SUITE_P(Heads, DecodeAttentionGpu,
                         ::testing::Values(DecodeCase{16, true}, DecodeCase{20, true}, DecodeCase{64, true},
                                           DecodeCase{128, true}, DecodeCase{16, false}, DecodeCase{64, false},
                                           DecodeCase{128, false}),
                         [](const auto& info) {
                           return "H" + std::to_string(info.param.heads) + (info.param.workspace ? "_split" : "_unsplit");
                         });

class DecodeAttentionGpuCacheRows : public GpuTest {};

// The kernel loads whole 64-row blocks: a sequence's last block takes rows past its end (another
// sequence's, the gaps between them, never-written rows). Those rows hold NaN here, the last
// sequence ends on the cache's last row (its block reaches past cache_rows: TMA zero-fill), and
// the outputs must be those of the reference, which reads only each sequence's own rows.
TEST_F(DecodeAttentionGpuCacheRows, RowsPastASequenceNeverReachItsOutput) {
  for (const int heads : {16, 128}) {
    DecodeProblem p(heads, {1, 70, 129, 1000, 64}, 31u + heads);
    p.capacity = int64_t{p.start[0]} + p.len[0];  // sequence 0 lies last: it ends on the cache's last row
    p.cache.resize(static_cast<size_t>(p.capacity * kRow));
    std::vector<bool> used(static_cast<size_t>(p.capacity), false);
    for (int b = 0; b < p.batch(); ++b)
      for (int r = 0; r < p.len[b]; ++r) used[static_cast<size_t>(p.start[b] + r)] = true;
    int64_t poisoned_rows = 0;
    for (int64_t r = 0; r < p.capacity; ++r)
      if (!used[static_cast<size_t>(r)]) {
        ++poisoned_rows;
        for (int c = 0; c < kRow; ++c) p.cache[static_cast<size_t>(r * kRow + c)] = bf16{0x7FC0};  // NaN
      }
    ASSERT_GT(poisoned_rows, 0);
    const auto ref = p.reference();
    for (const bool split : {false, true}) {
      DecodeDeviceBuffers d(p, split);
      decode_attention(MemorySpace::device, d.args, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto got = to_host<bf16>(d.out.data(), ref.size());
      const Comparison c =
          compare_rows(got, ref, int64_t{p.batch()} * p.heads, kLora, [&](int64_t r) { return p.bins(r); });
      std::printf("[decode H=%d %s, %ld NaN rows outside the sequences] rel Frobenius %.3e, non-finite %ld\n", heads,
                  split ? "split-KV" : "unsplit", long(poisoned_rows), c.rel, long(c.non_finite));
      EXPECT_EQ(c.non_finite, 0) << "a NaN row outside the sequences reached the output; first at element " << c.worst;
      EXPECT_LE(c.rel, kAttnRelTol) << c.breakdown;
    }
  }
}

TEST_F(DecodeAttentionGpuCacheRows, DeviceNeedsTheCacheExtent) {
  const DecodeProblem p(64, {5, 9}, 3u);
  DecodeDeviceBuffers d(p, false);
  DecodeAttentionArgs a = d.args;
  a.cache_rows = 0;
  EXPECT_THROW(decode_attention(MemorySpace::device, a, nullptr), Error);
  a.cache_rows = int64_t{1} << 31;
  EXPECT_THROW(decode_attention(MemorySpace::device, a, nullptr), Error);
}

class DecodeAttentionGpuGraph : public GpuTest {};

// A graph captured once replays with new lengths written to the device arrays: the kernel reads
// them on the device, and the split count fixed at capture stays valid for any length up to
// max_cache_len.
TEST_F(DecodeAttentionGpuGraph, ReplaysWithNewLengths) {
  DecodeProblem p(64, {1000, 1000, 1000, 1000}, 77u);  // every sequence has room for 1000 rows
  p.len = {900, 3, 260, 1000};
  DecodeDeviceBuffers d(p, true);
  ASSERT_GT(d.args.workspace_bytes, 0u) << "this batch should split";
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  decode_attention(MemorySpace::device, d.args, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  for (const std::vector<int32_t>& lens : {std::vector<int32_t>{900, 3, 260, 1000}, {1, 1000, 65, 2}}) {
    p.len = lens;
    copy_bytes(d.len.data(), MemorySpace::device, p.len.data(), MemorySpace::host, p.len.size() * sizeof(int32_t));
    fill_bytes(MemorySpace::device, d.out.data(), d.out.bytes(), 0xff);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const auto ref = p.reference();
    const auto got = to_host<bf16>(d.out.data(), ref.size());
    const Comparison c = compare_rows(got, ref, int64_t{p.batch()} * p.heads, kLora, [&](int64_t r) { return p.bins(r); });
    std::printf("[decode graph replay, lengths %d %d %d %d] rel Frobenius %.3e\n", lens[0], lens[1], lens[2], lens[3],
                c.rel);
    EXPECT_EQ(c.non_finite, 0);
    EXPECT_LE(c.rel, kAttnRelTol) << c.breakdown;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// ---- speed -------------------------------------------------------------------------------------

struct PrefillBench {
  const char* name;
  int heads, d_qk, d_v;
  bool expect_target;
};

class PrefillAttentionGpuSpeed : public GpuTest, public ::testing::WithParamInterface<PrefillBench> {};

TEST_P(PrefillAttentionGpuSpeed, CausalEightSequencesOf1024) {
  const PrefillBench bench = GetParam();
  const int seqs = 8, len = 1024, heads = bench.heads;
  const int64_t tokens = int64_t{seqs} * len;
  std::vector<int32_t> offsets(seqs + 1);
  for (int b = 0; b <= seqs; ++b) offsets[b] = b * len;
  const int64_t q_elems = tokens * heads * bench.d_qk, v_elems = tokens * heads * bench.d_v;
  Buffer q(MemorySpace::device, q_elems * sizeof(bf16)), k(MemorySpace::device, q_elems * sizeof(bf16));
  Buffer v(MemorySpace::device, v_elems * sizeof(bf16));
  fill_normal(MemorySpace::device, q.data<bf16>(), q_elems, 1);
  fill_normal(MemorySpace::device, k.data<bf16>(), q_elems, 2);
  fill_normal(MemorySpace::device, v.data<bf16>(), v_elems, 3);
  Buffer out = poisoned(v_elems * sizeof(bf16));
  Buffer doffs = to_device(offsets);

  PrefillAttentionArgs a;
  a.q = q.data<bf16>();
  a.k = k.data<bf16>();
  a.v = v.data<bf16>();
  a.out = out.data<bf16>();
  a.q_stride = a.k_stride = int64_t{heads} * bench.d_qk;
  a.v_stride = int64_t{heads} * bench.d_v;
  a.seq_offsets = doffs.data<int32_t>();
  a.num_seqs = seqs;
  a.total_tokens = tokens;
  a.max_seqlen = len;
  a.heads = heads;
  a.d_qk = bench.d_qk;
  a.d_v = bench.d_v;
  a.softmax_scale = 1.0f / std::sqrt(static_cast<float>(bench.d_qk));

  const Timing t = time_device([&](StreamHandle s) { prefill_attention(MemorySpace::device, a, s); }, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const double pairs = double(seqs) * len * (len + 1) / 2;
  const double flops = 2.0 * (bench.d_qk + bench.d_v) * pairs * heads;
  const double tflops = flops / (t.median_us * 1e-6) / 1e12;
  std::printf("[prefill speed] %s: %d x %d causal, %d heads, d_qk=%d d_v=%d: median %.1f us (min %.1f), %.1f TFLOP/s "
              "(2*(d_qk+d_v)*causal pairs*heads = %.3e FLOP)\n",
              bench.name, seqs, len, heads, bench.d_qk, bench.d_v, t.median_us, t.min_us, tflops, flops);

  // The timed output is checked too: sequence 5, heads {0, heads-1}, against the host reference
  // (a 2-head view: the same strides, the pointers moved to each head).
  const int b = 5;
  const auto hq = to_host<bf16>(q.data<bf16>() + int64_t{b} * len * heads * bench.d_qk, size_t(len) * heads * bench.d_qk);
  const auto hk = to_host<bf16>(k.data<bf16>() + int64_t{b} * len * heads * bench.d_qk, size_t(len) * heads * bench.d_qk);
  const auto hv = to_host<bf16>(v.data<bf16>() + int64_t{b} * len * heads * bench.d_v, size_t(len) * heads * bench.d_v);
  const auto hout = to_host<bf16>(out.data<bf16>() + int64_t{b} * len * heads * bench.d_v, size_t(len) * heads * bench.d_v);
  for (const int h : {0, heads - 1}) {
    std::vector<bf16> ref(size_t(len) * bench.d_v), got(size_t(len) * bench.d_v);
    const int32_t offs[2] = {0, len};
    PrefillAttentionArgs r = a;
    r.q = hq.data() + h * bench.d_qk;
    r.k = hk.data() + h * bench.d_qk;
    r.v = hv.data() + h * bench.d_v;
    r.out = ref.data();
    r.seq_offsets = offs;
    r.num_seqs = 1;
    r.total_tokens = len;
    r.heads = 1;
    prefill_attention(MemorySpace::host, r, nullptr);
    for (int i = 0; i < len; ++i)
      std::copy_n(hout.data() + (int64_t{i} * heads + h) * bench.d_v, bench.d_v, got.data() + int64_t{i} * bench.d_v);
    const Comparison c = compare_rows(got, ref, len, bench.d_v, [](int64_t r) {
      return std::vector<std::string>{"row slice " + std::to_string((r % 128) / 16)};
    });
    EXPECT_EQ(c.non_finite, 0) << bench.name << " head " << h;
    EXPECT_LE(c.rel, kAttnRelTol) << bench.name << " head " << h << "\n" << c.breakdown;
  }
  if (bench.expect_target)
    EXPECT_GE(tflops, kPrefillMinTflops) << bench.name << " is below the target on " << current_device().name;
}

INSTANTIATE_TEST_SUITE_P(Models, PrefillAttentionGpuSpeed,
                         ::testing::Values(PrefillBench{"GLM-5 TP4", 16, 256, 256, false},
                                           PrefillBench{"GLM-5 TP1", 64, 256, 256, true},
                                           PrefillBench{"DeepSeek-V3 TP1", 128, 192, 128, false}),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           std::replace(n.begin(), n.end(), ' ', '_');
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

struct DecodeBench {
  const char* name;
  int batch, heads, len;
};

class DecodeAttentionGpuSpeed : public GpuTest, public ::testing::WithParamInterface<DecodeBench> {};

TEST_P(DecodeAttentionGpuSpeed, Bandwidth) {
  const DecodeBench bench = GetParam();
  const int64_t rows = int64_t{bench.batch} * bench.len;
  Buffer cache(MemorySpace::device, rows * kRow * sizeof(bf16));
  fill_normal(MemorySpace::device, cache.data<bf16>(), rows * kRow, 9);
  const int64_t qn = int64_t{bench.batch} * bench.heads;
  Buffer ql(MemorySpace::device, qn * kLora * sizeof(bf16)), qr(MemorySpace::device, qn * kRope * sizeof(bf16));
  fill_normal(MemorySpace::device, ql.data<bf16>(), qn * kLora, 10);
  fill_normal(MemorySpace::device, qr.data<bf16>(), qn * kRope, 11);
  std::vector<int32_t> start(bench.batch), len(bench.batch, bench.len);
  for (int b = 0; b < bench.batch; ++b) start[b] = b * bench.len;
  Buffer dstart = to_device(start), dlen = to_device(len);
  Buffer out = poisoned(qn * kLora * sizeof(bf16));

  DecodeAttentionArgs a;
  a.q_latent = ql.data<bf16>();
  a.q_rope = qr.data<bf16>();
  a.cache = cache.data<bf16>();
  a.cache_rows = rows;
  a.cache_start = dstart.data<int32_t>();
  a.cache_len = dlen.data<int32_t>();
  a.out_latent = out.data<bf16>();
  a.batch = bench.batch;
  a.heads = bench.heads;
  a.kv_lora = kLora;
  a.d_rope = kRope;
  a.max_cache_len = bench.len;
  a.softmax_scale = 1.0f / std::sqrt(192.0f);
  const size_t ws_bytes = decode_attention_workspace_bytes(MemorySpace::device, a);
  Buffer ws;
  if (ws_bytes > 0) {
    ws = Buffer(MemorySpace::device, ws_bytes);
    a.workspace = ws.data();
    a.workspace_bytes = ws_bytes;
  }
  const Timing t = time_device([&](StreamHandle s) { decode_attention(MemorySpace::device, a, s); }, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const double bytes = double(rows) * kRow * 2 + double(qn) * (kRow + kLora) * 2;
  const double gbps = bytes / (t.median_us * 1e-6) / 1e9;
  const double tflops = 2.0 * (kRow + kLora) * double(rows) * bench.heads / (t.median_us * 1e-6) / 1e12;
  std::printf("[decode speed] %s: batch %d x %d tokens, %d heads, workspace %zu B: median %.1f us, %.0f GB/s "
              "(cache + q + out bytes), %.1f TFLOP/s\n",
              bench.name, bench.batch, bench.len, bench.heads, ws_bytes, t.median_us, gbps, tflops);
  const auto got = to_host<bf16>(out.data(), size_t(qn) * kLora);
  int64_t non_finite = 0;
  for (const bf16 x : got) non_finite += std::isfinite(bf16_to_float(x)) ? 0 : 1;
  EXPECT_EQ(non_finite, 0) << "outputs never written (NaN poison) or not finite";
}

INSTANTIATE_TEST_SUITE_P(Models, DecodeAttentionGpuSpeed,
                         ::testing::Values(DecodeBench{"GLM-5 TP1", 64, 64, 4096}, DecodeBench{"GLM-5 TP4", 64, 16, 4096},
                                           DecodeBench{"DeepSeek-V3 TP1", 32, 128, 4096},
                                           DecodeBench{"GLM-5 TP1 small batch", 4, 64, 8192},
                                           DecodeBench{"GLM-5 TP1 one sequence", 1, 64, 32768}),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           std::replace(n.begin(), n.end(), ' ', '_');
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace fp8proj
