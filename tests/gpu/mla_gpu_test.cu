// The MLA block on the GPU against its CPU reference (the host block: same stages, same
// roundings, so the two differ by GEMM and attention summation order only):
//   - the small kernels on their own: RoPE / cache / key assembly (bit-exact but for a rare
//     one-ulp cos/sin difference), the absorbed per-head projections, the strided RMSNorm;
//   - prefill and decode, flag off and on, odd sequence lengths, two head shapes
//     (DeepSeek-V3's 192/128 and GLM-5's 256/256), the latent cache included;
//   - decode with the flag on under the prefill policy is bit-identical to the flag off;
//   - a decode step captured in a CUDA graph and replayed with new positions equals eager.
// Every test skips, with the reason, where there is no GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fp8proj/error.hpp"
#include "fp8proj/mla.hpp"
#include "fp8proj/ops.hpp"
#include "fp8proj/quantize.hpp"
#include "gpu_test_util.hpp"
#include "pdl_test_util.hpp"
#include "mla/mla_ops.hpp"

namespace fp8proj {
namespace {

using testing::GpuTest;
using testing::poisoned;
using testing::to_device;
using testing::to_host;

std::vector<bf16> normal_bf16(size_t n, uint32_t seed, float stddev) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<bf16> v(n);
  for (auto& x : v) x = float_to_bf16(d(rng));
  return v;
}

double rel_error(const std::vector<bf16>& got, const std::vector<bf16>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = bf16_to_float(got[i]), r = bf16_to_float(ref[i]);
    num += (g - r) * (g - r);
    den += r * r;
  }
  return std::sqrt(num / den);
}

int64_t non_finite(const std::vector<bf16>& v) {
  int64_t n = 0;
  for (const bf16 x : v) n += std::isfinite(bf16_to_float(x)) ? 0 : 1;
  return n;
}

class CudaStream {
 public:
  CudaStream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), cudaSuccess); }
  ~CudaStream() { cudaStreamDestroy(s_); }
  StreamHandle handle() const { return s_; }
  void sync() const { ASSERT_EQ(cudaStreamSynchronize(s_), cudaSuccess); }

 private:
  cudaStream_t s_ = nullptr;
};

// Head shapes the device attention kernels are built for: (d_qk, d_v) = (192, 128) as
// DeepSeek-V3, (256, 256) as GLM-5; the decode kernel needs kv_lora 512 and rope 64.
// Projections stay 128-aligned where the real ones are: q_b_proj N = heads x d_qk, o_proj
// K = heads x v; fused_qkv_a (q_lora + 576 rows) is not.
MlaConfig gpu_config(bool glm_like) {
  MlaConfig c;
  c.model = glm_like ? "glm-like" : "dsv3-like";
  c.hidden = 512;
  c.heads = glm_like ? 2 : 4;
  c.q_lora_rank = 256;
  c.kv_lora_rank = 512;
  c.qk_nope_dim = glm_like ? 192 : 128;
  c.qk_rope_dim = 64;
  c.v_head_dim = glm_like ? 256 : 128;
  c.rope_theta = glm_like ? 1e6 : 1e4;
  if (!glm_like) c.yarn = YarnScaling{40.0, 4096, 32.0, 1.0, 1.0, 1.0};
  c.rms_norm_eps = glm_like ? 1e-5f : 1e-6f;
  return c;
}

struct HostTensors {
  std::vector<bf16> q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b, o;
  MlaHostWeights view() const {
    return {q_a.data(), q_a_norm.data(), q_b.data(), kv_a.data(), kv_a_norm.data(), kv_b.data(), o.data()};
  }
};

std::vector<bf16> near_one(size_t n, uint32_t seed) {
  auto v = normal_bf16(n, seed, 0.1f);
  for (auto& x : v) x = float_to_bf16(1.0f + bf16_to_float(x));
  return v;
}

// Scales as MlaBlock's random init (N(0, 0.02^2) projections), so activations stay O(1).
HostTensors make_tensors(const MlaConfig& c, uint32_t seed) {
  HostTensors t;
  t.q_a = normal_bf16(c.q_lora_rank * c.hidden, seed + 1, 0.044f);
  t.q_a_norm = near_one(c.q_lora_rank, seed + 2);
  t.q_b = normal_bf16(int64_t{c.heads} * c.qk_head_dim() * c.q_lora_rank, seed + 3, 0.0625f);
  t.kv_a = normal_bf16((c.kv_lora_rank + c.qk_rope_dim) * c.hidden, seed + 4, 0.044f);
  t.kv_a_norm = near_one(c.kv_lora_rank, seed + 5);
  t.kv_b = normal_bf16(int64_t{c.heads} * (c.qk_nope_dim + c.v_head_dim) * c.kv_lora_rank, seed + 6, 0.044f);
  t.o = normal_bf16(c.hidden * c.heads * c.v_head_dim, seed + 7, 0.06f);
  return t;
}

// flag on: FP8 for the tagged projections at every M (threshold and decode ceiling 0), so
// decode exercises the FP8 path too; the gate itself is tested elsewhere.
MlaOptions options(bool fp8) {
  MlaOptions o;
  o.tagged.fp8 = fp8;
  o.tagged.apply_env = false;
  o.tagged.threshold = 0;
  o.tagged.decode_ceiling = 0;
  o.max_tokens = 512;
  o.max_batch = 8;
  o.cache_capacity = 2048;
  return o;
}

// Packed sequences with odd lengths, each with its own cache region.
struct Batch {
  std::vector<int32_t> offsets, cache_start, lens;
  int64_t tokens() const { return offsets.back(); }
  int num_seqs() const { return static_cast<int>(lens.size()); }
};
Batch make_batch(std::vector<int32_t> lens) {
  Batch b;
  b.lens = lens;
  b.offsets = {0};
  for (size_t i = 0; i < lens.size(); ++i) {
    b.offsets.push_back(b.offsets.back() + lens[i]);
    b.cache_start.push_back(static_cast<int32_t>(400 * i + 3));  // odd starts: rows need no alignment
  }
  return b;
}

// ---- the small kernels -----------------------------------------------------------------------

class MlaKernelsGpu : public GpuTest {};

TEST_F(MlaKernelsGpu, StridedRmsNormBitExact) {
  // q_a read straight out of fused_qkv_a's rows (GLM-5: 2048 of 2624 columns); c_kv at column
  // offset 2048 (512 wide).
  const int64_t m = 33, ld = 2624;
  const auto x = normal_bf16(m * ld, 1, 2.0f);
  const Buffer dx = to_device(x);
  const QuantOps& dev = quant_ops(MemorySpace::device);
  for (const auto& [col, k] : {std::pair<int64_t, int64_t>{0, 2048}, {2048, 512}}) {
    const auto g = near_one(k, uint32_t(k));
    const Buffer dg = to_device(g);
    std::vector<bf16> ref(m * k);
    cpu::rmsnorm(x.data() + col, ld, g.data(), 1e-5f, m, k, ref.data());
    Buffer dy = poisoned(static_cast<size_t>(m * k) * 2);
    dev.rmsnorm(dx.data<bf16>() + col, ld, dg.data<bf16>(), 1e-5f, m, k, dy.data<bf16>(), nullptr);
    const auto got = to_host<bf16>(dy.data(), ref.size());
    EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), ref.size() * 2)) << "rmsnorm, column " << col;
    HostFp8Activation qref = make_host_fp8_activation(m, k);
    cpu::rmsnorm_quantize(x.data() + col, ld, g.data(), 1e-5f, m, k, qref.out());
    Buffer qv = poisoned(static_cast<size_t>(m * k)), qs = poisoned(static_cast<size_t>(k / 128 * qref.scale_ld) * 4);
    dev.rmsnorm_quantize(dx.data<bf16>() + col, ld, dg.data<bf16>(), 1e-5f, m, k,
                         {qv.data<uint8_t>(), qs.data<float>(), m, k, qref.scale_ld}, nullptr);
    EXPECT_EQ(to_host<uint8_t>(qv.data(), qref.values.size()), qref.values) << "rmsnorm+quant, column " << col;
    const auto scales = to_host<float>(qs.data(), qref.scales.size());
    for (int64_t g2 = 0; g2 < k / 128; ++g2)
      for (int64_t r = 0; r < m; ++r)
        ASSERT_EQ(scales[g2 * qref.scale_ld + r], qref.scales[g2 * qref.scale_ld + r]) << "scale " << g2 << "," << r;
  }
}

TEST_F(MlaKernelsGpu, AbsorbedProjectionsMatchHost) {
  // Both absorbed shapes of GLM-5 (q_nope . W_UK: k 192 -> n 512; out . W_UV^T: k 512 -> n 256)
  // and DeepSeek-V3's (k 128 -> n 512, k 512 -> n 128); odd row counts (one, a partial 16-row
  // tile, exactly one 64-row block, three blocks with a partial last one); n with a lone 8-column
  // tile (136, 8); k where the shared-memory rows need the 64-byte pad (64, 128, 512) and where
  // they do not (96), k = 32 (the first cp.async group is empty) and the largest k (864). The
  // three CTA shapes: 4 warps (k < 384), 8 warps as two row groups (k >= 384 on a small grid) and
  // 8 warps over 128 columns (k = 512 on 72 heads: 144 CTAs, enough for any GPU up to 288 SMs;
  // n = 136 leaves the second column CTA one live warp).
  struct Case {
    int rows, heads, n, k;
  };
  for (const Case cs : {Case{1, 3, 512, 192}, Case{17, 2, 256, 512}, Case{100, 3, 136, 64}, Case{64, 2, 512, 128},
                        Case{130, 2, 128, 512}, Case{16, 1, 8, 96}, Case{5, 2, 72, 32}, Case{33, 1, 64, 864},
                        Case{40, 72, 136, 512}}) {
    const int64_t x_head = cs.k + 64, x_row = int64_t{cs.heads} * x_head;  // strided input, as q's nope part
    const auto x = normal_bf16(cs.rows * x_row, 11, 1.0f), w = normal_bf16(int64_t{cs.heads} * cs.n * cs.k, 12, 0.05f);
    std::vector<bf16> ref(int64_t{cs.rows} * cs.heads * cs.n);
    mla::HeadGemmArgs a;
    a.x = x.data();
    a.x_row_stride = x_row;
    a.x_head_stride = x_head;
    a.w = w.data();
    a.y = ref.data();
    a.y_row_stride = int64_t{cs.heads} * cs.n;
    a.y_head_stride = cs.n;
    a.rows = cs.rows;
    a.heads = cs.heads;
    a.n = cs.n;
    a.k = cs.k;
    mla::mla_ops(MemorySpace::host).head_gemm(a, nullptr);
    const Buffer dx = to_device(x), dw = to_device(w);
    Buffer dy = poisoned(ref.size() * 2);
    a.x = dx.data<bf16>();
    a.w = dw.data<bf16>();
    a.y = dy.data<bf16>();
    mla::mla_ops(MemorySpace::device).head_gemm(a, nullptr);
    const auto got = to_host<bf16>(dy.data(), ref.size());
    EXPECT_EQ(non_finite(got), 0) << "rows " << cs.rows << ": an output was not written";
    // fp32 accumulation in another order, then one bf16 rounding: <= 1 ulp apart, ~1e-3 RMS.
    EXPECT_LT(rel_error(got, ref), 2e-3) << "rows " << cs.rows << " n " << cs.n << " k " << cs.k;
  }
  // k past what one CTA's shared memory holds: a clear error before anything is launched.
  const Buffer bx = poisoned(4096), bw = poisoned(8 * 896 * 2), by = poisoned(64);
  mla::HeadGemmArgs big;
  big.x = bx.data<bf16>();
  big.x_row_stride = 896;
  big.x_head_stride = 0;
  big.w = bw.data<bf16>();
  big.y = by.data<bf16>();
  big.y_row_stride = 8;
  big.y_head_stride = 8;
  big.rows = 1;
  big.heads = 1;
  big.n = 8;
  big.k = 896;
  EXPECT_THROW(mla::mla_ops(MemorySpace::device).head_gemm(big, nullptr), Error);
}

// With FP8 output the absorbed projection's epilogue writes o_proj's input: bit for bit what
// the bf16 output run through the device quantizer gives (values, scales and the scale rows'
// padding), for every CTA shape -- 4 warps over 64 columns (k < 384) and 8 warps as two row
// groups over 64 (few CTAs), both as clusters of two sharing a group's amax, and 8 warps over
// 128 (many CTAs: 72 heads) -- with a NaN row, rows over several 64-row blocks, and 1 row.
TEST_F(MlaKernelsGpu, HeadGemmFp8OutputEqualsQuantizedBf16) {
  struct Case {
    int rows, heads, n, k;
  };
  const QuantOps& qops = quant_ops(MemorySpace::device);
  for (const Case cs : {Case{17, 3, 128, 192}, Case{5, 2, 256, 512}, Case{1, 2, 128, 512}, Case{130, 3, 128, 512},
                        Case{64, 72, 128, 512}, Case{130, 40, 256, 512}}) {
    const int64_t K = int64_t{cs.heads} * cs.n, x_row = int64_t{cs.heads} * cs.k;
    auto x = normal_bf16(cs.rows * x_row, 21, 1.0f);
    if (cs.rows > 3) x[3 * x_row + 5] = float_to_bf16(NAN);  // row 3, head 0: its groups go NaN
    const auto w = normal_bf16(int64_t{cs.heads} * cs.n * cs.k, 22, 0.05f);
    const Buffer dx = to_device(x), dw = to_device(w);
    mla::HeadGemmArgs a;
    a.x = dx.data<bf16>();
    a.x_row_stride = x_row;
    a.x_head_stride = cs.k;
    a.w = dw.data<bf16>();
    a.y_row_stride = K;
    a.y_head_stride = cs.n;
    a.rows = cs.rows;
    a.heads = cs.heads;
    a.n = cs.n;
    a.k = cs.k;
    const int64_t ld = activation_scale_ld(cs.rows), scale_bytes = K / 128 * ld * 4;
    // Reference: bf16 y, then quantize_activation.
    Buffer dy = poisoned(static_cast<size_t>(cs.rows * K) * 2);
    Buffer rv = poisoned(static_cast<size_t>(cs.rows * K)), rs = poisoned(static_cast<size_t>(scale_bytes));
    a.y = dy.data<bf16>();
    mla::mla_ops(MemorySpace::device).head_gemm(a, nullptr);
    qops.quantize_activation(dy.data<bf16>(), cs.rows, K, {rv.data<uint8_t>(), rs.data<float>(), cs.rows, K, ld},
                             nullptr);
    // Fused: y untouched, FP8 written by the epilogue.
    Buffer fv = poisoned(static_cast<size_t>(cs.rows * K)), fs = poisoned(static_cast<size_t>(scale_bytes));
    a.y = nullptr;
    a.y_fp8 = {fv.data<uint8_t>(), fs.data<float>(), cs.rows, K, ld};
    mla::mla_ops(MemorySpace::device).head_gemm(a, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto want_v = to_host<uint8_t>(rv.data(), static_cast<size_t>(cs.rows * K));
    const auto got_v = to_host<uint8_t>(fv.data(), want_v.size());
    const auto want_s = to_host<uint32_t>(rs.data(), static_cast<size_t>(scale_bytes / 4));
    const auto got_s = to_host<uint32_t>(fs.data(), want_s.size());
    EXPECT_EQ(want_v, got_v) << "values, rows " << cs.rows << " heads " << cs.heads << " n " << cs.n << " k " << cs.k;
    EXPECT_EQ(want_s, got_s) << "scales, rows " << cs.rows << " heads " << cs.heads << " n " << cs.n << " k " << cs.k;
    if (cs.rows > 3) {  // group 0 of row 3 sits at scales[0 * ld + 3]
      float s3;
      std::memcpy(&s3, &got_s[3], sizeof s3);
      EXPECT_TRUE(std::isnan(s3)) << "the NaN row's first group must carry a NaN scale";
    }
  }
  // A group may not straddle two heads: n % 128 != 0 is refused before any launch.
  const Buffer bx = poisoned(4096), bw = poisoned(2 * 136 * 64 * 2), bv = poisoned(1024), bs = poisoned(256);
  mla::HeadGemmArgs bad;
  bad.x = bx.data<bf16>();
  bad.x_row_stride = 128;
  bad.x_head_stride = 64;
  bad.w = bw.data<bf16>();
  bad.rows = 1;
  bad.heads = 2;
  bad.n = 136;
  bad.k = 64;
  bad.y_fp8 = {bv.data<uint8_t>(), bs.data<float>(), 1, 272, 4};
  EXPECT_THROW(mla::mla_ops(MemorySpace::device).head_gemm(bad, nullptr), Error);
  bad.n = 128;
  bad.y_fp8.k = 256;
  bad.y_fp8.scale_ld = 3;  // below round_up(rows, 4)
  EXPECT_THROW(mla::mla_ops(MemorySpace::device).head_gemm(bad, nullptr), Error);
}

TEST_F(MlaKernelsGpu, RopeAndCacheMatchHost) {
  const MlaConfig c = gpu_config(false);  // YaRN frequencies
  const int H = c.heads, nope = c.qk_nope_dim, rope = c.qk_rope_dim, qk = nope + rope;
  const int64_t kvl = c.kv_lora_rank, qkv_w = c.qkv_a_dim(), kv_w = int64_t{H} * (nope + c.v_head_dim);
  const Batch b = make_batch({5, 1, 70});
  const int64_t T = b.tokens(), cap = 1024, cw = kvl + rope;
  const auto q = normal_bf16(T * H * qk, 21, 1.0f), qkv = normal_bf16(T * qkv_w, 22, 1.0f),
             kvc = normal_bf16(T * kvl, 23, 1.0f), kv = normal_bf16(T * kv_w, 24, 1.0f);
  const std::vector<float> freq = c.rope_inv_freq();

  // Host.
  std::vector<bf16> hq = q, hk(T * H * qk), hcache(cap * cw, bf16::from_bits(0));
  mla::PrefillRopeArgs a;
  a.dims = {H, nope, rope, kvl, freq.data(), c.rope_mscale()};
  a.tokens = T;
  a.num_seqs = b.num_seqs();
  a.seq_offsets = b.offsets.data();
  a.cache_start = b.cache_start.data();
  a.q = hq.data();
  a.q_stride = int64_t{H} * qk;
  a.k_rope_raw = qkv.data() + c.q_lora_rank + kvl;
  a.k_rope_stride = qkv_w;
  a.kv_c = kvc.data();
  a.kv = kv.data();
  a.kv_stride = kv_w;
  a.k = hk.data();
  a.cache = hcache.data();
  a.cache_capacity = cap;
  mla::mla_ops(MemorySpace::host).prefill_rope(a, nullptr);

  // Device.
  const Buffer d_off = to_device(b.offsets), d_start = to_device(b.cache_start), d_freq = to_device(freq),
               d_qkv = to_device(qkv), d_kvc = to_device(kvc), d_kv = to_device(kv);
  Buffer d_q = to_device(q), d_k = poisoned(hk.size() * 2), d_cache = to_device(std::vector<bf16>(cap * cw));
  a.dims.inv_freq = d_freq.data<float>();
  a.seq_offsets = d_off.data<int32_t>();
  a.cache_start = d_start.data<int32_t>();
  a.q = d_q.data<bf16>();
  a.k_rope_raw = d_qkv.data<bf16>() + c.q_lora_rank + kvl;
  a.kv_c = d_kvc.data<bf16>();
  a.kv = d_kv.data<bf16>();
  a.k = d_k.data<bf16>();
  a.cache = d_cache.data<bf16>();
  mla::mla_ops(MemorySpace::device).prefill_rope(a, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  // cos/sin come from double sincospi on the device and double cos/sin on the host: both round
  // to the same fp32 value except within ~1e-11 of a rounding boundary, so a bf16 may
  // (rarely) differ by one ulp. Everything copied must be identical.
  auto compare = [](const std::vector<bf16>& got, const std::vector<bf16>& want, const char* what) {
    int64_t diff = 0, big = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (got[i].bits == want[i].bits) continue;
      ++diff;
      if (std::abs(int(got[i].bits) - int(want[i].bits)) > 1) ++big;
    }
    EXPECT_EQ(big, 0) << what << ": elements more than one ulp apart";
    EXPECT_LE(diff, int64_t(want.size() / 1000)) << what << ": too many one-ulp differences";
  };
  compare(to_host<bf16>(d_q.data(), hq.size()), hq, "q (roped in place)");
  compare(to_host<bf16>(d_k.data(), hk.size()), hk, "k");
  compare(to_host<bf16>(d_cache.data(), hcache.size()), hcache, "cache");
}

// decode_rope with kv_a_layernorm (the decode step's one launch for norm, RoPE and cache write):
// the cache's c_kv columns bit for bit the separate device norm's output and the host reference's,
// everything else bit for bit the unfused kernel's; a row past the cache's capacity and a NaN
// latent stay confined to their own rows.
TEST_F(MlaKernelsGpu, DecodeRopeNormEqualsSeparateNorm) {
  for (const bool glm_like : {false, true}) {
    const MlaConfig c = gpu_config(glm_like);
    const int H = c.heads, nope = c.qk_nope_dim, rope = c.qk_rope_dim, B = 6;
    const int64_t kvl = c.kv_lora_rank, qkv_w = c.qkv_a_dim(), cw = kvl + rope, cap = 64;
    auto qkv = normal_bf16(B * qkv_w, 51, 2.0f);
    qkv[4 * qkv_w + c.q_lora_rank + 7] = float_to_bf16(std::nanf(""));  // row 4's latent
    const auto q = normal_bf16(int64_t{B} * H * (nope + rope), 52, 1.0f), g = near_one(kvl, 53);
    const std::vector<float> freq = c.rope_inv_freq();
    const std::vector<int32_t> pos = {0, 9, 30, 1, 2, 5}, start = {0, 10, 33, 61, 50, 60};  // row 3 at 62, row 5 at 65 (past cap)
    const float eps = c.rms_norm_eps;
    const Buffer d_qkv = to_device(qkv), d_q = to_device(q), d_g = to_device(g), d_freq = to_device(freq),
                 d_pos = to_device(pos), d_start = to_device(start);

    mla::DecodeRopeArgs a;
    a.dims = {H, nope, rope, kvl, freq.data(), c.rope_mscale()};
    a.batch = B;
    a.positions = pos.data();
    a.cache_start = start.data();
    a.q_stride = int64_t{H} * (nope + rope);
    a.k_rope_stride = qkv_w;
    a.kv_c_stride = qkv_w;
    a.kv_norm_eps = eps;
    a.cache_capacity = cap;
    // Host, fused.
    std::vector<bf16> h_cache(cap * cw, bf16::from_bits(0)), h_qr(int64_t{B} * H * rope);
    std::vector<int32_t> h_len(B);
    mla::DecodeRopeArgs h = a;
    h.q = q.data();
    h.k_rope_raw = qkv.data() + c.q_lora_rank + kvl;
    h.kv_c = qkv.data() + c.q_lora_rank;
    h.kv_norm = g.data();
    h.cache_len = h_len.data();
    h.q_rope = h_qr.data();
    h.cache = h_cache.data();
    mla::mla_ops(MemorySpace::host).decode_rope(h, nullptr);

    // Device, fused and separate (QuantOps::rmsnorm, then the plain copy).
    struct Out {
      Buffer cache, q_rope, len;
    };
    auto run = [&](bool fused) {
      Out o{to_device(std::vector<bf16>(cap * cw, bf16::from_bits(0))), poisoned(h_qr.size() * 2), poisoned(B * 4)};
      const Buffer kv_c = poisoned(static_cast<size_t>(B * kvl) * 2);
      mla::DecodeRopeArgs d = a;
      d.dims.inv_freq = d_freq.data<float>();
      d.positions = d_pos.data<int32_t>();
      d.cache_start = d_start.data<int32_t>();
      d.q = d_q.data<bf16>();
      d.k_rope_raw = d_qkv.data<bf16>() + c.q_lora_rank + kvl;
      d.cache_len = o.len.data<int32_t>();
      d.q_rope = o.q_rope.data<bf16>();
      d.cache = o.cache.data<bf16>();
      if (fused) {
        d.kv_c = d_qkv.data<bf16>() + c.q_lora_rank;
        d.kv_norm = d_g.data<bf16>();
      } else {
        quant_ops(MemorySpace::device)
            .rmsnorm(d_qkv.data<bf16>() + c.q_lora_rank, qkv_w, d_g.data<bf16>(), eps, B, kvl, kv_c.data<bf16>(), nullptr);
        d.kv_c = kv_c.data<bf16>();
        d.kv_c_stride = kvl;
      }
      mla::mla_ops(MemorySpace::device).decode_rope(d, nullptr);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      return o;
    };
    const Out fused = run(true), sep = run(false);
    const auto f_cache = to_host<bf16>(fused.cache.data(), h_cache.size());
    EXPECT_EQ(0, std::memcmp(f_cache.data(), to_host<bf16>(sep.cache.data(), h_cache.size()).data(), h_cache.size() * 2))
        << "cache, fused vs separate device norm, " << c.model;
    EXPECT_EQ(0, std::memcmp(to_host<bf16>(fused.q_rope.data(), h_qr.size()).data(),
                             to_host<bf16>(sep.q_rope.data(), h_qr.size()).data(), h_qr.size() * 2))
        << "q_rope, " << c.model;
    EXPECT_EQ(to_host<int32_t>(fused.len.data(), B), h_len) << "cache_len, " << c.model;
    int64_t nan_rows = 0;
    for (int b = 0; b < B; ++b) {
      const int64_t row = int64_t{start[b]} + pos[b];
      if (row >= cap) continue;
      const bf16* got = &f_cache[row * cw];
      const bf16* want = &h_cache[row * cw];
      for (int64_t j = 0; j < kvl; ++j) {
        const bool nan_got = std::isnan(bf16_to_float(got[j]));
        ASSERT_EQ(nan_got, b == 4) << "c_kv NaN confinement, row " << b << " column " << j << ", " << c.model;
        if (nan_got) {
          nan_rows += j == 0;
          continue;
        }
        ASSERT_EQ(got[j].bits, want[j].bits) << "c_kv vs host, row " << b << " column " << j << ", " << c.model;
      }
      for (int64_t j = kvl; j < cw; ++j)  // the rope part: cos/sin may round one ulp apart (RopeAndCacheMatchHost)
        ASSERT_LE(std::abs(int(got[j].bits) - int(want[j].bits)), 1) << "k rope, row " << b << ", " << c.model;
    }
    EXPECT_EQ(nan_rows, 1) << "row 4's normalized latent is all NaN";
    for (int64_t i = 0; i < int64_t(h_cache.size()); ++i) {
      const int64_t row = i / cw;
      bool written = false;
      for (int b = 0; b < B; ++b) written |= row == int64_t{start[b]} + pos[b];
      if (!written) ASSERT_EQ(f_cache[i].bits, 0) << "cache row " << row << " was not the target of any row";
    }
  }
}

// ---- the block -----------------------------------------------------------------------------

class MlaBlockGpu : public GpuTest, public ::testing::WithParamInterface<bool> {};

std::string param_name(const ::testing::TestParamInfo<bool>& info) { return info.param ? "glm_like" : "dsv3_like"; }

// Host and device blocks on the same weights: prefill then one decode step, flag off and on.
TEST_P(MlaBlockGpu, PrefillAndDecodeMatchCpuReference) {
  const MlaConfig c = gpu_config(GetParam());
  const HostTensors t = make_tensors(c, 31);
  const Batch b = make_batch({37, 1, 130, 63});  // odd lengths, T = 231
  const int64_t T = b.tokens(), hidden = c.hidden, cw = c.cache_width();
  const auto x = normal_bf16(T * hidden, 32, 1.0f), x_dec = normal_bf16(b.num_seqs() * hidden, 33, 1.0f);
  const Buffer d_x = to_device(x), d_xdec = to_device(x_dec), d_off = to_device(b.offsets),
               d_start = to_device(b.cache_start), d_pos = to_device(b.lens);
  double err[2][3] = {};
  for (bool fp8 : {false, true}) {
    MlaBlock host(MemorySpace::host, c, t.view(), options(fp8));
    MlaBlock dev(MemorySpace::device, c, t.view(), options(fp8));
    ASSERT_EQ(dev.projection(MlaProjection::q_b_proj).path_for(T), fp8 ? Path::fp8 : Path::bf16)
        << dev.explain(T).to_string();
    ASSERT_EQ(dev.projection(MlaProjection::o_proj).path_for(4), fp8 ? Path::fp8 : Path::bf16);

    std::vector<bf16> y_host(T * hidden);
    host.prefill(x.data(), {b.num_seqs(), b.offsets.data(), b.cache_start.data(), nullptr}, y_host.data());
    Buffer d_y = poisoned(y_host.size() * 2);
    const CudaStream stream;
    dev.prefill(d_x.data<bf16>(), {b.num_seqs(), d_off.data<int32_t>(), d_start.data<int32_t>(), b.offsets.data()},
                d_y.data<bf16>(), stream.handle());
    stream.sync();
    const auto y_dev = to_host<bf16>(d_y.data(), y_host.size());
    EXPECT_EQ(non_finite(y_dev), 0) << "prefill output has unwritten or non-finite elements";
    err[fp8][0] = rel_error(y_dev, y_host);

    // The latent cache rows of every prefilled token.
    const auto cache_dev = to_host<bf16>(dev.cache(), static_cast<size_t>(dev.cache_capacity() * cw));
    std::vector<bf16> rows_dev, rows_host;
    for (int s = 0; s < b.num_seqs(); ++s)
      for (int64_t i = 0; i < b.lens[s] * cw; ++i) {
        rows_dev.push_back(cache_dev[b.cache_start[s] * cw + i]);
        rows_host.push_back(host.cache()[b.cache_start[s] * cw + i]);
      }
    err[fp8][1] = rel_error(rows_dev, rows_host);

    // One decode step per sequence at position len (after its prefill).
    const MlaDecodeBatch hd{b.num_seqs(), b.lens.data(), b.cache_start.data(), 256};
    std::vector<bf16> yd_host(b.num_seqs() * hidden);
    host.decode(x_dec.data(), hd, yd_host.data());
    Buffer d_yd = poisoned(yd_host.size() * 2);
    dev.decode(d_xdec.data<bf16>(), {b.num_seqs(), d_pos.data<int32_t>(), d_start.data<int32_t>(), 256},
               d_yd.data<bf16>(), stream.handle());
    stream.sync();
    const auto yd_dev = to_host<bf16>(d_yd.data(), yd_host.size());
    EXPECT_EQ(non_finite(yd_dev), 0) << "decode output has unwritten or non-finite elements";
    err[fp8][2] = rel_error(yd_dev, yd_host);
  }
  std::printf("%s GPU vs CPU reference, relative error  prefill / cache / decode:\n"
              "  flag off  %.2e / %.2e / %.2e\n  flag on   %.2e / %.2e / %.2e\n",
              c.model.c_str(), err[0][0], err[0][1], err[0][2], err[1][0], err[1][1], err[1][2]);
  // Flag off: the same bf16 roundings on both sides; the GEMMs sum in another order (fp32),
  // which moves an intermediate by an ulp now and then, and the device attention rounds the
  // softmax weights to bf16 before the P.V product (2^-9 relative each) where the host keeps
  // fp64: the output's own bf16 rounding (~1.1e-3 RMS) plus a few of those. Bound: 1e-2.
  EXPECT_LT(err[0][0], 1e-2);
  EXPECT_LT(err[0][1], 2e-3);  // the cache is one GEMM and two roundings from x: no attention
  EXPECT_LT(err[0][2], 1e-2);
  // Flag on: both sides quantize q_a and o_proj's input with the same bit-exact quantizers, but
  // inputs that differ by those ulps can land in different e4m3 codes (a step is 1/16 to 1/8
  // relative): bounded by the FP8 quantization error itself (~4e-2 against fp64 on the host).
  EXPECT_LT(err[1][0], 4e-2);
  EXPECT_LT(err[1][1], 2e-3);  // fused_qkv_a stays bf16: the cache does not see FP8
  EXPECT_LT(err[1][2], 4e-2);
}

// The promise for decode (docs/design.md): with the flag on and the prefill policy, a decode-sized
// batch takes exactly the bf16 path, so its output is bit-identical to the flag off.
TEST_P(MlaBlockGpu, DecodeUnchangedByFlagUnderPrefillPolicy) {
  const MlaConfig c = gpu_config(GetParam());
  const HostTensors t = make_tensors(c, 41);
  const Batch b = make_batch({9, 20});
  const auto x = normal_bf16(b.tokens() * c.hidden, 42, 1.0f);
  const Buffer d_x = to_device(x), d_off = to_device(b.offsets), d_start = to_device(b.cache_start),
               d_pos = to_device(b.lens);
  std::vector<bf16> out[2];
  for (bool fp8 : {false, true}) {
    MlaOptions o = options(fp8);
    o.tagged.threshold.reset();
    o.tagged.decode_ceiling = kDefaultDecodeCeiling;
    MlaBlock dev(MemorySpace::device, c, t.view(), o);
    EXPECT_EQ(dev.projection(MlaProjection::q_b_proj).path_for(2), Path::bf16);
    Buffer d_y = poisoned(static_cast<size_t>(b.tokens() * c.hidden) * 2);
    dev.prefill(d_x.data<bf16>(), {b.num_seqs(), d_off.data<int32_t>(), d_start.data<int32_t>(), b.offsets.data()},
                d_y.data<bf16>());
    dev.decode(d_x.data<bf16>(), {b.num_seqs(), d_pos.data<int32_t>(), d_start.data<int32_t>(), 64},
               d_y.data<bf16>());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    out[fp8] = to_host<bf16>(d_y.data(), static_cast<size_t>(b.num_seqs() * c.hidden));
  }
  EXPECT_EQ(0, std::memcmp(out[0].data(), out[1].data(), out[0].size() * 2));
}

// A decode step captured once and replayed: the same output as eager, and replaying after the
// positions (device array) and inputs change decodes the next token like eager does.
TEST_P(MlaBlockGpu, DecodeGraphReplayEqualsEager) {
  const MlaConfig c = gpu_config(GetParam());
  const HostTensors t = make_tensors(c, 51);
  const Batch b = make_batch({15, 3, 40});
  const int B = b.num_seqs();
  const int64_t hidden = c.hidden;
  const auto x = normal_bf16(b.tokens() * hidden, 52, 1.0f), x1 = normal_bf16(B * hidden, 53, 1.0f),
             x2 = normal_bf16(B * hidden, 54, 1.0f);
  std::vector<int32_t> pos2 = b.lens;
  for (auto& p : pos2) p += 1;
  const Buffer d_x = to_device(x), d_off = to_device(b.offsets), d_start = to_device(b.cache_start);
  Buffer d_pos = to_device(b.lens), d_in = to_device(x1);
  for (bool fp8 : {false, true}) {
    MlaBlock dev(MemorySpace::device, c, t.view(), options(fp8));
    Buffer d_prefill_y(MemorySpace::device, static_cast<size_t>(b.tokens() * hidden) * 2);
    dev.prefill(d_x.data<bf16>(), {B, d_off.data<int32_t>(), d_start.data<int32_t>(), b.offsets.data()},
                d_prefill_y.data<bf16>());
    const MlaDecodeBatch batch{B, d_pos.data<int32_t>(), d_start.data<int32_t>(), 128};
    copy_bytes(d_pos.data(), MemorySpace::device, b.lens.data(), MemorySpace::host, B * 4);
    copy_bytes(d_in.data(), MemorySpace::device, x1.data(), MemorySpace::host, x1.size() * 2);
    Buffer d_eager = poisoned(static_cast<size_t>(B * hidden) * 2), d_graph = poisoned(static_cast<size_t>(B * hidden) * 2);
    dev.decode(d_in.data<bf16>(), batch, d_eager.data<bf16>());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto eager1 = to_host<bf16>(d_eager.data(), static_cast<size_t>(B * hidden));

    MlaDecodeGraph graph(dev, d_in.data<bf16>(), batch, d_graph.data<bf16>());
    fill_bytes(MemorySpace::device, d_graph.data(), d_graph.bytes(), 0xff);
    const CudaStream stream;
    graph.replay(stream.handle());
    stream.sync();
    const auto graph1 = to_host<bf16>(d_graph.data(), eager1.size());
    EXPECT_EQ(non_finite(graph1), 0);
    EXPECT_EQ(0, std::memcmp(graph1.data(), eager1.data(), eager1.size() * 2)) << "step 1, fp8=" << fp8;

    // Next token: new positions and inputs in the same device buffers, no re-capture.
    copy_bytes(d_pos.data(), MemorySpace::device, pos2.data(), MemorySpace::host, B * 4);
    copy_bytes(d_in.data(), MemorySpace::device, x2.data(), MemorySpace::host, x2.size() * 2);
    fill_bytes(MemorySpace::device, d_graph.data(), d_graph.bytes(), 0xff);
    graph.replay(stream.handle());
    stream.sync();
    const auto graph2 = to_host<bf16>(d_graph.data(), eager1.size());
    dev.decode(d_in.data<bf16>(), batch, d_eager.data<bf16>());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto eager2 = to_host<bf16>(d_eager.data(), eager1.size());
    EXPECT_EQ(non_finite(graph2), 0);
    EXPECT_EQ(0, std::memcmp(graph2.data(), eager2.data(), eager2.size() * 2)) << "step 2, fp8=" << fp8;
    EXPECT_GT(rel_error(graph2, graph1), 0.05) << "step 2 should differ from step 1 (new token, new length)";
  }
}

// Every dense GEMM tagged: fused_qkv_a (N = 256 + 576 = 832, a partial last 128-row block) and
// kv_b_proj join q_b_proj and o_proj on the FP8 path; host and device blocks agree within the
// FP8 bound, prefill and decode.
TEST_P(MlaBlockGpu, AllDenseGemmsTaggedMatchCpuReference) {
  const MlaConfig c = gpu_config(GetParam());
  const HostTensors t = make_tensors(c, 61);
  const Batch b = make_batch({37, 1, 130, 63});
  const int64_t T = b.tokens(), hidden = c.hidden;
  const auto x = normal_bf16(T * hidden, 62, 1.0f), x_dec = normal_bf16(b.num_seqs() * hidden, 63, 1.0f);
  const Buffer d_x = to_device(x), d_xdec = to_device(x_dec), d_off = to_device(b.offsets),
               d_start = to_device(b.cache_start), d_pos = to_device(b.lens);
  MlaOptions o = options(true);
  o.fp8_fused_qkv_a = o.fp8_kv_b_proj = true;
  MlaBlock host(MemorySpace::host, c, t.view(), o);
  MlaBlock dev(MemorySpace::device, c, t.view(), o);
  for (MlaProjection p : {MlaProjection::fused_qkv_a, MlaProjection::q_b_proj, MlaProjection::kv_b_proj,
                          MlaProjection::o_proj})
    ASSERT_EQ(dev.projection(p).path_for(T), Path::fp8) << to_string(p) << ": " << dev.explain(T).to_string();
  EXPECT_EQ(dev.projection(MlaProjection::fused_qkv_a).n() % 128, 64);
  std::vector<bf16> y_host(T * hidden);
  host.prefill(x.data(), {b.num_seqs(), b.offsets.data(), b.cache_start.data(), nullptr}, y_host.data());
  Buffer d_y = poisoned(y_host.size() * 2);
  dev.prefill(d_x.data<bf16>(), {b.num_seqs(), d_off.data<int32_t>(), d_start.data<int32_t>(), b.offsets.data()},
              d_y.data<bf16>());
  const MlaDecodeBatch hd{b.num_seqs(), b.lens.data(), b.cache_start.data(), 256};
  std::vector<bf16> yd_host(b.num_seqs() * hidden);
  host.decode(x_dec.data(), hd, yd_host.data());
  Buffer d_yd = poisoned(yd_host.size() * 2);
  dev.decode(d_xdec.data<bf16>(), {b.num_seqs(), d_pos.data<int32_t>(), d_start.data<int32_t>(), 256},
             d_yd.data<bf16>());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto y_dev = to_host<bf16>(d_y.data(), y_host.size());
  const auto yd_dev = to_host<bf16>(d_yd.data(), yd_host.size());
  EXPECT_EQ(non_finite(y_dev), 0);
  EXPECT_EQ(non_finite(yd_dev), 0);
  const double e_pre = rel_error(y_dev, y_host), e_dec = rel_error(yd_dev, yd_host);
  std::printf("%s, every dense GEMM FP8: GPU vs CPU reference prefill %.2e, decode %.2e\n", c.model.c_str(), e_pre,
              e_dec);
  // As PrefillAndDecodeMatchCpuReference's flag-on bound, with two more quantized GEMMs whose
  // inputs can land in other e4m3 codes on the two sides.
  EXPECT_LT(e_pre, 6e-2);
  EXPECT_LT(e_dec, 6e-2);
}

// o_proj's FP8 input written by the attention epilogue is the separate pass's, bit for bit: the
// whole block's prefill output is identical with and without the fusion.
TEST_P(MlaBlockGpu, FusedAttentionQuantIsBitIdentical) {
  const MlaConfig c = gpu_config(GetParam());
  const HostTensors t = make_tensors(c, 71);
  const Batch b = make_batch({37, 1, 130, 63});
  const int64_t T = b.tokens();
  const auto x = normal_bf16(T * c.hidden, 72, 1.0f);
  const Buffer d_x = to_device(x), d_off = to_device(b.offsets), d_start = to_device(b.cache_start);
  std::vector<bf16> out[2];
  for (bool fuse : {false, true}) {
    MlaOptions o = options(true);
    o.fuse_attention_quant = fuse;
    MlaBlock dev(MemorySpace::device, c, t.view(), o);
    const std::string role = dev.explain(T).projections[3].role;
    EXPECT_EQ(role.find("attention epilogue") != std::string::npos, fuse) << role;
    Buffer d_y = poisoned(static_cast<size_t>(T * c.hidden) * 2);
    dev.prefill(d_x.data<bf16>(), {b.num_seqs(), d_off.data<int32_t>(), d_start.data<int32_t>(), b.offsets.data()},
                d_y.data<bf16>());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    out[fuse] = to_host<bf16>(d_y.data(), static_cast<size_t>(T * c.hidden));
    EXPECT_EQ(non_finite(out[fuse]), 0);
  }
  EXPECT_EQ(0, std::memcmp(out[0].data(), out[1].data(), out[0].size() * 2));
}

// The decode step as `fp8proj layer` runs it (one CUDA-graph replay) follows the policy: under
// `all` the gate's FP8 verdict at decode M is what runs (q_b_proj, o_proj and, tagged,
// fused_qkv_a: the output differs from the bf16 step by no more than the FP8 error); under
// `prefill` the step is bit-identical to the flag-off one.
TEST_P(MlaBlockGpu, DecodeGraphFollowsPolicy) {
  const MlaConfig c = gpu_config(GetParam());
  const HostTensors t = make_tensors(c, 81);
  const Batch b = make_batch({15, 3, 40});
  const int B = b.num_seqs();
  const auto x = normal_bf16(b.tokens() * c.hidden, 82, 1.0f), xd = normal_bf16(B * c.hidden, 83, 1.0f);
  const Buffer d_x = to_device(x), d_xd = to_device(xd), d_off = to_device(b.offsets),
               d_start = to_device(b.cache_start), d_pos = to_device(b.lens);
  auto step = [&](const MlaOptions& o) {
    MlaBlock dev(MemorySpace::device, c, t.view(), o);
    Buffer d_py(MemorySpace::device, static_cast<size_t>(b.tokens() * c.hidden) * 2);
    dev.prefill(d_x.data<bf16>(), {B, d_off.data<int32_t>(), d_start.data<int32_t>(), b.offsets.data()},
                d_py.data<bf16>());
    Buffer d_y = poisoned(static_cast<size_t>(B * c.hidden) * 2);
    MlaDecodeGraph graph(dev, d_xd.data<bf16>(), {B, d_pos.data<int32_t>(), d_start.data<int32_t>(), 64},
                         d_y.data<bf16>());
    fill_bytes(MemorySpace::device, d_y.data(), d_y.bytes(), 0xff);
    graph.replay(nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<Path> paths;
    for (MlaProjection p : {MlaProjection::fused_qkv_a, MlaProjection::q_b_proj, MlaProjection::o_proj})
      paths.push_back(dev.projection(p).path_for(B));
    return std::make_pair(to_host<bf16>(d_y.data(), static_cast<size_t>(B * c.hidden)), paths);
  };
  const auto off = step(options(false)).first;
  for (Fp8Policy policy : {Fp8Policy::prefill, Fp8Policy::all}) {
    MlaOptions o = options(true);
    o.tagged.policy = policy;
    o.tagged.decode_ceiling = kDefaultDecodeCeiling;
    o.fp8_fused_qkv_a = true;
    const auto [y, paths] = step(o);
    const Path want = policy == Fp8Policy::all ? Path::fp8 : Path::bf16;
    for (Path p : paths) EXPECT_EQ(p, want) << "policy " << to_string(policy);
    EXPECT_EQ(non_finite(y), 0);
    if (policy == Fp8Policy::prefill) {
      EXPECT_EQ(0, std::memcmp(y.data(), off.data(), off.size() * 2)) << "policy prefill changed the decode step";
    } else {
      const double e = rel_error(y, off);
      std::printf("%s decode graph, policy all vs bf16 step: relative error %.2e\n", c.model.c_str(), e);
      EXPECT_GT(e, 0.0) << "policy all ran no FP8 GEMM in the decode graph";
      // Three chained FP8 GEMMs (fused_qkv_a, q_b_proj, o_proj), each with the quantization's
      // own ~3.7% against bf16 on Gaussian data (docs/design.md): at most their sum. Measured on
      // an H200: 7.1e-2 (glm-like), 8.0e-2 (dsv3-like).
      EXPECT_LT(e, 3 * 4e-2);
    }
  }
}

// o_proj's FP8 input written by absorb_v's epilogue at decode is the separate pass's, bit for
// bit: the decode step's output is identical with and without the fusion, eagerly and replayed
// as a CUDA graph, and `explain` names where the input comes from.
TEST_P(MlaBlockGpu, DecodeFusedQuantIsBitIdentical) {
  const MlaConfig c = gpu_config(GetParam());
  const HostTensors t = make_tensors(c, 95);
  const Batch b = make_batch({15, 3, 40, 9, 1});
  const int B = b.num_seqs();
  const auto x = normal_bf16(b.tokens() * c.hidden, 96, 1.0f), xd = normal_bf16(B * c.hidden, 97, 1.0f);
  const Buffer d_x = to_device(x), d_xd = to_device(xd), d_off = to_device(b.offsets),
               d_start = to_device(b.cache_start), d_pos = to_device(b.lens);
  std::vector<bf16> eager[2], replay[2];
  for (bool fuse : {false, true}) {
    MlaOptions o = options(true);
    o.fuse_decode_quant = fuse;
    MlaBlock dev(MemorySpace::device, c, t.view(), o);
    const std::string role = dev.explain(B).projections[3].role;
    EXPECT_EQ(role.find("W_UV^T's epilogue") != std::string::npos, fuse) << role;
    ASSERT_EQ(dev.projection(MlaProjection::o_proj).path_for(B), Path::fp8);
    Buffer d_py(MemorySpace::device, static_cast<size_t>(b.tokens() * c.hidden) * 2);
    dev.prefill(d_x.data<bf16>(), {B, d_off.data<int32_t>(), d_start.data<int32_t>(), b.offsets.data()},
                d_py.data<bf16>());
    const MlaDecodeBatch db{B, d_pos.data<int32_t>(), d_start.data<int32_t>(), 64};
    Buffer d_y = poisoned(static_cast<size_t>(B * c.hidden) * 2);
    dev.decode(d_xd.data<bf16>(), db, d_y.data<bf16>());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    eager[fuse] = to_host<bf16>(d_y.data(), static_cast<size_t>(B * c.hidden));
    MlaDecodeGraph graph(dev, d_xd.data<bf16>(), db, d_y.data<bf16>());
    fill_bytes(MemorySpace::device, d_y.data(), d_y.bytes(), 0xff);
    graph.replay(nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    replay[fuse] = to_host<bf16>(d_y.data(), static_cast<size_t>(B * c.hidden));
    EXPECT_EQ(non_finite(eager[fuse]), 0);
  }
  EXPECT_EQ(0, std::memcmp(eager[0].data(), eager[1].data(), eager[0].size() * 2)) << "eager decode";
  EXPECT_EQ(0, std::memcmp(replay[0].data(), replay[1].data(), replay[0].size() * 2)) << "graph replay";
}

// The residual-stream entry on the device: bit for bit the norm followed by the block, on the
// bf16 path and on the FP8 one (the fused norm + quantization rounds the normalized row to bf16
// before quantizing, as the separate norm's output is; measured rel error 0 at every point).
TEST_P(MlaBlockGpu, ResidualEntryMatchesNormThenBlock) {
  const MlaConfig c = gpu_config(GetParam());
  const HostTensors t = make_tensors(c, 91);
  const Batch b = make_batch({37, 1, 130});
  const int64_t T = b.tokens();
  const auto res = normal_bf16(T * c.hidden, 92, 3.0f), g = near_one(c.hidden, 93);
  const Buffer d_res = to_device(res), d_g = to_device(g), d_off = to_device(b.offsets),
               d_start = to_device(b.cache_start);
  Buffer d_xn(MemorySpace::device, static_cast<size_t>(T * c.hidden) * 2);
  quant_ops(MemorySpace::device)
      .rmsnorm(d_res.data<bf16>(), c.hidden, d_g.data<bf16>(), 1e-6f, T, c.hidden, d_xn.data<bf16>(), nullptr);
  for (bool fp8 : {false, true}) {
    MlaOptions o = options(fp8);
    o.fp8_fused_qkv_a = fp8;
    o.residual_input = true;
    MlaBlock fused(MemorySpace::device, c, t.view(), o);
    MlaOptions po = options(fp8);
    po.fp8_fused_qkv_a = fp8;  // the same GEMMs on FP8: only the norm's fusion differs
    MlaBlock plain(MemorySpace::device, c, t.view(), po);
    Buffer y_f = poisoned(static_cast<size_t>(T * c.hidden) * 2), y_p = poisoned(static_cast<size_t>(T * c.hidden) * 2);
    const MlaPrefillBatch pb{b.num_seqs(), d_off.data<int32_t>(), d_start.data<int32_t>(), b.offsets.data()};
    fused.prefill_residual(d_res.data<bf16>(), d_g.data<bf16>(), 1e-6f, pb, y_f.data<bf16>());
    plain.prefill(d_xn.data<bf16>(), pb, y_p.data<bf16>());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto a = to_host<bf16>(y_f.data(), static_cast<size_t>(T * c.hidden));
    const auto r = to_host<bf16>(y_p.data(), a.size());
    EXPECT_EQ(non_finite(a), 0);
    EXPECT_EQ(0, std::memcmp(a.data(), r.data(), a.size() * 2))
        << (fp8 ? "FP8" : "bf16") << " path: must equal norm-then-prefill (rel error " << rel_error(a, r) << ")";
  }
}

// The decode step from the residual stream captured in a graph (the decoder layer's input
// RMSNorm inside it, fused with fused_qkv_a's quantization on the FP8 path): replays equal the
// eager decode_residual bit for bit, two tokens in a row without re-capture.
TEST_P(MlaBlockGpu, ResidualDecodeGraphReplayEqualsEager) {
  const MlaConfig c = gpu_config(GetParam());
  const HostTensors t = make_tensors(c, 95);
  const Batch b = make_batch({15, 3, 40});
  const int B = b.num_seqs();
  const int64_t hidden = c.hidden;
  const auto x = normal_bf16(b.tokens() * hidden, 96, 1.0f), r1 = normal_bf16(B * hidden, 97, 3.0f),
             r2 = normal_bf16(B * hidden, 98, 3.0f), g = near_one(hidden, 99);
  std::vector<int32_t> pos2 = b.lens;
  for (auto& p : pos2) p += 1;
  const Buffer d_x = to_device(x), d_off = to_device(b.offsets), d_start = to_device(b.cache_start), d_g = to_device(g);
  Buffer d_pos = to_device(b.lens), d_in = to_device(r1);
  for (bool fp8 : {false, true}) {
    MlaOptions o = options(fp8);
    o.fp8_fused_qkv_a = fp8;
    o.residual_input = true;
    MlaBlock dev(MemorySpace::device, c, t.view(), o);
    Buffer d_prefill_y(MemorySpace::device, static_cast<size_t>(b.tokens() * hidden) * 2);
    dev.prefill(d_x.data<bf16>(), {B, d_off.data<int32_t>(), d_start.data<int32_t>(), b.offsets.data()},
                d_prefill_y.data<bf16>());
    const MlaDecodeBatch batch{B, d_pos.data<int32_t>(), d_start.data<int32_t>(), 128};
    const float eps = c.rms_norm_eps;
    Buffer d_eager = poisoned(static_cast<size_t>(B * hidden) * 2), d_graph = poisoned(static_cast<size_t>(B * hidden) * 2);
    auto set_step = [&](const std::vector<int32_t>& pos, const std::vector<bf16>& res) {
      copy_bytes(d_pos.data(), MemorySpace::device, pos.data(), MemorySpace::host, B * 4);
      copy_bytes(d_in.data(), MemorySpace::device, res.data(), MemorySpace::host, res.size() * 2);
    };
    auto eager = [&] {
      dev.decode_residual(d_in.data<bf16>(), d_g.data<bf16>(), eps, batch, d_eager.data<bf16>());
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      return to_host<bf16>(d_eager.data(), static_cast<size_t>(B * hidden));
    };
    const CudaStream stream;
    auto replay = [&](MlaDecodeGraph& graph) {
      fill_bytes(MemorySpace::device, d_graph.data(), d_graph.bytes(), 0xff);
      graph.replay(stream.handle());
      stream.sync();
      return to_host<bf16>(d_graph.data(), static_cast<size_t>(B * hidden));
    };
    set_step(b.lens, r1);
    const auto eager1 = eager();
    MlaDecodeGraph graph(dev, d_in.data<bf16>(), d_g.data<bf16>(), eps, batch, d_graph.data<bf16>());
    const auto graph1 = replay(graph);
    EXPECT_EQ(non_finite(graph1), 0) << "fp8=" << fp8;
    EXPECT_EQ(0, std::memcmp(graph1.data(), eager1.data(), eager1.size() * 2)) << "step 1, fp8=" << fp8;
    set_step(pos2, r2);  // the next token: new positions and inputs in the same buffers, no re-capture
    const auto graph2 = replay(graph);
    const auto eager2 = eager();
    EXPECT_EQ(0, std::memcmp(graph2.data(), eager2.data(), eager2.size() * 2)) << "step 2, fp8=" << fp8;
    EXPECT_GT(rel_error(graph2, graph1), 0.05) << "step 2 should differ from step 1 (new token, new length)";
  }
}

// decode_residual is the input norm, then decode: on the bf16 path bit for bit, on the FP8 path
// (the norm fused with fused_qkv_a's quantization, which skips the bf16 rounding of the normed
// input: e4m3 ties flip) within the FP8 bound; eager and replayed alike. hidden 512 and 3072
// (above 2048 the norm takes four warps per row, two rows a CTA), B = 1, 5, 6 (the fused pass's
// scale pads then lie past the last row's CTA).
TEST_P(MlaBlockGpu, ResidualDecodeMatchesNormThenDecode) {
  for (const int64_t hidden : {int64_t{512}, int64_t{3072}})
    for (const std::vector<int32_t>& lens :
         {std::vector<int32_t>{33}, std::vector<int32_t>{15, 3, 40, 7, 22}, std::vector<int32_t>{15, 3, 40, 7, 22, 9}}) {
      MlaConfig c = gpu_config(GetParam());
      c.hidden = hidden;
      const HostTensors t = make_tensors(c, 101);
      const Batch b = make_batch(lens);
      const int B = b.num_seqs();
      const std::string what = "hidden " + std::to_string(hidden) + ", B " + std::to_string(B);
      const auto x = normal_bf16(b.tokens() * hidden, 102, 1.0f), res = normal_bf16(B * hidden, 103, 3.0f),
                 g = near_one(hidden, 104);
      const Buffer d_x = to_device(x), d_res = to_device(res), d_g = to_device(g), d_off = to_device(b.offsets),
                   d_start = to_device(b.cache_start), d_pos = to_device(b.lens);
      const float eps = c.rms_norm_eps;
      Buffer d_xn(MemorySpace::device, static_cast<size_t>(B * hidden) * 2);
      quant_ops(MemorySpace::device).rmsnorm(d_res.data<bf16>(), hidden, d_g.data<bf16>(), eps, B, hidden,
                                             d_xn.data<bf16>(), nullptr);
      const MlaPrefillBatch pb{B, d_off.data<int32_t>(), d_start.data<int32_t>(), b.offsets.data()};
      const MlaDecodeBatch batch{B, d_pos.data<int32_t>(), d_start.data<int32_t>(), 128};
      const size_t out_elems = static_cast<size_t>(B * hidden);
      for (bool fp8 : {false, true}) {
        MlaOptions o = options(fp8);
        o.fp8_fused_qkv_a = fp8;
        MlaBlock plain(MemorySpace::device, c, t.view(), o);
        o.residual_input = true;
        MlaBlock fused(MemorySpace::device, c, t.view(), o);
        Buffer d_prefill_y(MemorySpace::device, static_cast<size_t>(b.tokens() * hidden) * 2);
        plain.prefill(d_x.data<bf16>(), pb, d_prefill_y.data<bf16>());  // the same cache rows in both blocks
        fused.prefill(d_x.data<bf16>(), pb, d_prefill_y.data<bf16>());
        Buffer y_p = poisoned(out_elems * 2), y_f = poisoned(out_elems * 2), y_g = poisoned(out_elems * 2);
        plain.decode(d_xn.data<bf16>(), batch, y_p.data<bf16>());
        fused.decode_residual(d_res.data<bf16>(), d_g.data<bf16>(), eps, batch, y_f.data<bf16>());
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
        MlaDecodeGraph graph(fused, d_res.data<bf16>(), d_g.data<bf16>(), eps, batch, y_g.data<bf16>());
        const CudaStream stream;
        graph.replay(stream.handle());
        stream.sync();
        const auto p = to_host<bf16>(y_p.data(), out_elems), f = to_host<bf16>(y_f.data(), out_elems),
                   r = to_host<bf16>(y_g.data(), out_elems);
        EXPECT_EQ(non_finite(f), 0) << what << ", fp8=" << fp8;
        EXPECT_EQ(0, std::memcmp(r.data(), f.data(), f.size() * 2)) << what << ", fp8=" << fp8 << ": replay vs eager";
        // rmsnorm_quantize keeps the norm's bf16 rounding (quantize.hpp), so the fused entry equals
        // norm-then-decode bit for bit on the FP8 path too.
        EXPECT_EQ(0, std::memcmp(f.data(), p.data(), f.size() * 2))
            << what << ", fp8=" << fp8 << ": must equal norm-then-decode (rel error " << rel_error(f, p) << ")";
      }
    }
}

// Programmatic dependent launch (FP8PROJ_PDL) changes when the decode step's kernels start,
// never what they compute: PDL on and off give bitwise equal outputs, eagerly (several steps in
// a row) and as a captured graph replayed several times, on the bf16 path and with every dense
// projection on FP8 (quantizers and sm90 GEMMs, the RoPE/cache, absorbed projections, the
// attention with its split-KV combine: max_context 1024 makes it split). Each output is poisoned
// before it is produced. The step captured with PDL on holds programmatic edges, with it off none.
TEST_P(MlaBlockGpu, DecodePdlOnOffBitwiseEqual) {
  const MlaConfig c = gpu_config(GetParam());
  const HostTensors t = make_tensors(c, 91);
  const Batch b = make_batch({15, 3, 40});
  const int B = b.num_seqs();
  const auto x = normal_bf16(b.tokens() * c.hidden, 92, 1.0f), xd = normal_bf16(B * c.hidden, 93, 1.0f);
  const Buffer d_x = to_device(x), d_xd = to_device(xd), d_off = to_device(b.offsets),
               d_start = to_device(b.cache_start), d_pos = to_device(b.lens);
  const size_t out_elems = static_cast<size_t>(B * c.hidden);
  MlaOptions all_fp8 = options(true);
  all_fp8.tagged.policy = Fp8Policy::all;
  all_fp8.fp8_fused_qkv_a = true;
  all_fp8.fp8_kv_b_proj = true;
  for (const MlaOptions& o : {options(false), all_fp8}) {
    const std::string path = o.tagged.fp8 ? "all dense FP8" : "bf16";
    MlaBlock dev(MemorySpace::device, c, t.view(), o);
    Buffer d_py(MemorySpace::device, static_cast<size_t>(b.tokens() * c.hidden) * 2);
    dev.prefill(d_x.data<bf16>(), {B, d_off.data<int32_t>(), d_start.data<int32_t>(), b.offsets.data()},
                d_py.data<bf16>());
    const MlaDecodeBatch batch{B, d_pos.data<int32_t>(), d_start.data<int32_t>(), 1024};
    Buffer d_y = poisoned(out_elems * 2);
    const CudaStream stream;
    std::vector<bf16> ref;
    for (bool pdl : {false, true}) {
      const testing::PdlOverride mode(pdl);
      const std::string tag = path + ", PDL " + (pdl ? "on" : "off");
      for (int rep = 0; rep < 3; ++rep) {
        fill_bytes(MemorySpace::device, d_y.data(), d_y.bytes(), 0xff);
        dev.decode(d_xd.data<bf16>(), batch, d_y.data<bf16>(), stream.handle());
        stream.sync();
        const auto y = to_host<bf16>(d_y.data(), out_elems);
        if (ref.empty()) {
          ref = y;
          EXPECT_EQ(non_finite(ref), 0) << tag;
        }
        EXPECT_EQ(0, std::memcmp(y.data(), ref.data(), ref.size() * 2)) << tag << ", eager step " << rep;
      }
      MlaDecodeGraph graph(dev, d_xd.data<bf16>(), batch, d_y.data<bf16>());
      for (int rep = 0; rep < 3; ++rep) {
        fill_bytes(MemorySpace::device, d_y.data(), d_y.bytes(), 0xff);
        graph.replay(stream.handle());
        stream.sync();
        const auto y = to_host<bf16>(d_y.data(), out_elems);
        EXPECT_EQ(0, std::memcmp(y.data(), ref.data(), ref.size() * 2)) << tag << ", graph replay " << rep;
      }
      // The same step captured here, to read its edges (MlaDecodeGraph keeps its graph private).
      cudaStream_t s = static_cast<cudaStream_t>(stream.handle());
      cudaGraph_t g = nullptr;
      ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      try {
        dev.decode(d_xd.data<bf16>(), batch, d_y.data<bf16>(), stream.handle());
      } catch (const std::exception& e) {
        ADD_FAILURE() << tag << ", inside the capture: " << e.what();
      }
      ASSERT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess) << tag;
      const int edges = testing::programmatic_edges(g);
      std::printf("%s, %s: %d programmatic edges in the captured decode step\n", c.model.c_str(), tag.c_str(), edges);
      if (pdl)
        EXPECT_GT(edges, 0) << tag;
      else
        EXPECT_EQ(edges, 0) << tag;
      cudaGraphDestroy(g);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Heads, MlaBlockGpu, ::testing::Values(false, true), param_name);

}  // namespace
}  // namespace fp8proj
