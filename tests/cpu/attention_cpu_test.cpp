// The host reference attention (src/mla/attention_cpu.cpp through include/fp8proj/attention.hpp)
// against naive fp64 loops written straight from the formulas, on small shapes with odd and
// empty sequence lengths, strided views and single-token sequences; plus the exact properties
// (a one-key softmax copies its value row; causality) and the argument checks.
//
// Tolerance: the reference rounds an fp64-accumulated result to bf16 once, so each element is
// within half a bf16 ulp (2^-9 relative) of the exact value, plus fp32 dot-product noise
// (~1e-6 of |v|): |got - exact| <= 2^-8 |exact| + 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "fp8proj/attention.hpp"
#include "fp8proj/device.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/memory.hpp"
#include "test_util.hpp"

namespace fp8proj {
namespace {

using testing::random_bf16;

constexpr double kRelTol = 1.0 / 256, kAbsTol = 1e-5;
const bf16 kPoison = bf16::from_bits(0xffff);  // NaN

// Packed sequences with strided q (padding after the heads) and k/v as views into one
// [T, H*(d_qk + d_v) + 8] buffer, the way a fused projection output would hold them.
struct PrefillCase {
  std::vector<int32_t> lengths;
  int heads, d_qk, d_v;
  float scale;

  std::vector<int32_t> offsets;
  int64_t tokens = 0, q_stride = 0, kv_stride = 0;
  std::vector<bf16> q, kv, out;

  PrefillCase(std::vector<int32_t> lens, int h, int dqk, int dv, float scale_mult = 1.0f)
      : lengths(std::move(lens)), heads(h), d_qk(dqk), d_v(dv) {
    scale = scale_mult / std::sqrt(static_cast<float>(d_qk));
    offsets.push_back(0);
    for (int32_t l : lengths) offsets.push_back(offsets.back() + l);
    tokens = offsets.back();
    q_stride = int64_t{heads} * d_qk + 8;
    kv_stride = int64_t{heads} * (d_qk + d_v) + 8;
    q = random_bf16(static_cast<size_t>(tokens * q_stride), 11u + d_qk);
    kv = random_bf16(static_cast<size_t>(tokens * kv_stride), 23u + d_v);
    out.assign(static_cast<size_t>(tokens * heads * d_v), kPoison);
  }

  const bf16* k() const { return kv.data(); }
  const bf16* v() const { return kv.data() + int64_t{heads} * d_qk; }

  PrefillAttentionArgs args() {
    PrefillAttentionArgs a;
    a.q = q.data();
    a.k = k();
    a.v = v();
    a.out = out.data();
    a.q_stride = q_stride;
    a.k_stride = a.v_stride = kv_stride;
    a.seq_offsets = offsets.data();
    a.num_seqs = static_cast<int>(lengths.size());
    a.total_tokens = tokens;
    a.max_seqlen = 0;
    for (int32_t l : lengths) a.max_seqlen = std::max(a.max_seqlen, l);
    a.heads = heads;
    a.d_qk = d_qk;
    a.d_v = d_v;
    a.softmax_scale = scale;
    return a;
  }

  // Exact (fp64) output of token t, head h, straight from the definition.
  std::vector<double> naive(int64_t t, int h) const {
    int b = 0;
    while (offsets[b + 1] <= t) ++b;
    const int64_t t0 = offsets[b];
    std::vector<double> s;
    for (int64_t j = t0; j <= t; ++j) {
      double dot = 0;
      for (int d = 0; d < d_qk; ++d)
        dot += double(bf16_to_float(q[t * q_stride + h * d_qk + d])) * bf16_to_float(k()[j * kv_stride + h * d_qk + d]);
      s.push_back(dot * scale);
    }
    double mx = -INFINITY, sum = 0;
    for (double x : s) mx = std::max(mx, x);
    std::vector<double> o(d_v, 0.0);
    for (size_t j = 0; j < s.size(); ++j) {
      const double p = std::exp(s[j] - mx);
      sum += p;
      for (int d = 0; d < d_v; ++d) o[d] += p * bf16_to_float(v()[(t0 + int64_t(j)) * kv_stride + h * d_v + d]);
    }
    for (double& x : o) x /= sum;
    return o;
  }
};

void expect_close(const bf16* got, const std::vector<double>& exact, const std::string& where) {
  for (size_t d = 0; d < exact.size(); ++d) {
    const double g = bf16_to_float(got[d]);
    ASSERT_TRUE(std::isfinite(g)) << where << " element " << d << " is not finite (never written?)";
    ASSERT_LE(std::fabs(g - exact[d]), kRelTol * std::fabs(exact[d]) + kAbsTol)
        << where << " element " << d << ": got " << g << ", exact " << exact[d];
  }
}

struct Dims {
  int d_qk, d_v;
  float scale_mult;
};

class PrefillReference : public ::testing::TestWithParam<Dims> {};

TEST_P(PrefillReference, MatchesNaiveLoopsOnOddAndEmptySequences) {
  const Dims dims = GetParam();
  // Lengths: single tokens, an empty sequence in the middle, odd lengths around 64.
  PrefillCase c({1, 7, 0, 65, 2, 33, 1}, 3, dims.d_qk, dims.d_v, dims.scale_mult);
  prefill_attention(MemorySpace::host, c.args(), nullptr);
  for (int64_t t = 0; t < c.tokens; ++t)
    for (int h = 0; h < c.heads; ++h)
      expect_close(c.out.data() + (t * c.heads + h) * c.d_v, c.naive(t, h),
                   "token " + std::to_string(t) + " head " + std::to_string(h));
}

INSTANTIATE_TEST_SUITE_P(Dims, PrefillReference,
                         ::testing::Values(Dims{64, 64, 1.0f}, Dims{24, 40, 1.0f}, Dims{8, 16, 1.0f},
                                           Dims{192, 128, 1.0f}, Dims{64, 64, 8.0f}),
                         [](const auto& info) {
                           return "qk" + std::to_string(info.param.d_qk) + "_v" + std::to_string(info.param.d_v) +
                                  (info.param.scale_mult > 1 ? "_sharp" : "");
                         });

TEST(PrefillReference, SingleTokenSequenceCopiesItsValueRow) {
  PrefillCase c({1, 1, 5}, 2, 64, 64);
  prefill_attention(MemorySpace::host, c.args(), nullptr);
  for (int64_t t = 0; t < 2; ++t)
    for (int h = 0; h < c.heads; ++h)
      for (int d = 0; d < c.d_v; ++d)
        EXPECT_EQ(c.out[(t * c.heads + h) * c.d_v + d].bits, c.v()[t * c.kv_stride + h * c.d_v + d].bits);
  // Token 0 of every sequence also sees only itself.
  for (int h = 0; h < c.heads; ++h)
    for (int d = 0; d < c.d_v; ++d)
      EXPECT_EQ(c.out[(2 * c.heads + h) * c.d_v + d].bits, c.v()[2 * c.kv_stride + h * c.d_v + d].bits);
}

TEST(PrefillReference, IsCausalAndKeepsSequencesApart) {
  PrefillCase c({9, 12}, 2, 64, 64);
  prefill_attention(MemorySpace::host, c.args(), nullptr);
  const std::vector<bf16> before = c.out;
  // Change everything of sequence 1 from its token 4 on: its rows 0..3 and all of sequence 0
  // must not move by a bit.
  const int64_t first_changed = c.offsets[1] + 4;
  for (int64_t t = first_changed; t < c.tokens; ++t) {
    for (int64_t i = 0; i < c.q_stride; ++i) c.q[t * c.q_stride + i] = float_to_bf16(3.0f);
    for (int64_t i = 0; i < c.kv_stride; ++i) c.kv[t * c.kv_stride + i] = float_to_bf16(-2.0f);
  }
  prefill_attention(MemorySpace::host, c.args(), nullptr);
  for (int64_t i = 0; i < first_changed * c.heads * c.d_v; ++i) ASSERT_EQ(c.out[i].bits, before[i].bits) << i;
}

TEST(PrefillReference, NothingToDoIsANoOp) {
  PrefillCase c({3}, 1, 64, 64);
  PrefillAttentionArgs a = c.args();
  a.num_seqs = 0;
  prefill_attention(MemorySpace::host, a, nullptr);
  a = c.args();
  a.total_tokens = 0;
  prefill_attention(MemorySpace::host, a, nullptr);
  for (const bf16 x : c.out) EXPECT_EQ(x.bits, kPoison.bits);
}

TEST(PrefillReference, RejectsBadArguments) {
  PrefillCase c({3, 4}, 2, 64, 64);
  auto expect_error = [&](auto mutate, const char* what) {
    PrefillAttentionArgs a = c.args();
    mutate(a);
    EXPECT_THROW(prefill_attention(MemorySpace::host, a, nullptr), Error) << what;
  };
  expect_error([](PrefillAttentionArgs& a) { a.heads = 0; }, "no heads");
  expect_error([](PrefillAttentionArgs& a) { a.q_stride = a.heads * a.d_qk - 1; }, "q stride below heads*d_qk");
  expect_error([](PrefillAttentionArgs& a) { a.softmax_scale = 0; }, "zero scale");
  expect_error([](PrefillAttentionArgs& a) { a.softmax_scale = NAN; }, "NaN scale");
  expect_error([](PrefillAttentionArgs& a) { a.max_seqlen = 3; }, "a sequence longer than max_seqlen");
  expect_error([](PrefillAttentionArgs& a) { a.total_tokens = 6; }, "offsets past total_tokens");
  expect_error([](PrefillAttentionArgs& a) { a.v = nullptr; }, "null v");
  std::vector<int32_t> decreasing = {0, 5, 4};
  expect_error([&](PrefillAttentionArgs& a) { a.seq_offsets = decreasing.data(); }, "decreasing offsets");
}

TEST(PrefillReference, DevicePathWithoutAGpuSaysWhy) {
  if (gpu_available()) GTEST_SKIP() << "a GPU is present: the GPU tests cover the device path";
  PrefillCase c({3}, 1, 64, 64);
  try {
    prefill_attention(MemorySpace::device, c.args(), nullptr);
    FAIL() << "expected fp8proj::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("CUDA") != std::string::npos || msg.find("GPU") != std::string::npos) << msg;
  }
}

// ---- decode ------------------------------------------------------------------------------------

struct DecodeCase {
  int batch, heads, kv_lora, d_rope;
  std::vector<int32_t> start, len;
  int64_t capacity;
  float scale;
  std::vector<bf16> q_latent, q_rope, cache, out;

  DecodeCase(int h, int lora, int rope, std::vector<int32_t> starts, std::vector<int32_t> lens, int64_t cap)
      : batch(static_cast<int>(lens.size())), heads(h), kv_lora(lora), d_rope(rope), start(std::move(starts)),
        len(std::move(lens)), capacity(cap) {
    scale = 1.0f / std::sqrt(static_cast<float>(kv_lora + d_rope));
    q_latent = random_bf16(static_cast<size_t>(batch * heads * kv_lora), 5);
    q_rope = random_bf16(static_cast<size_t>(batch * heads * d_rope), 6);
    cache = random_bf16(static_cast<size_t>(capacity * (kv_lora + d_rope)), 7);
    out.assign(static_cast<size_t>(batch * heads * kv_lora), kPoison);
  }

  DecodeAttentionArgs args() {
    DecodeAttentionArgs a;
    a.q_latent = q_latent.data();
    a.q_rope = q_rope.data();
    a.cache = cache.data();
    a.cache_rows = capacity;
    a.cache_start = start.data();
    a.cache_len = len.data();
    a.out_latent = out.data();
    a.batch = batch;
    a.heads = heads;
    a.kv_lora = kv_lora;
    a.d_rope = d_rope;
    a.max_cache_len = 0;
    for (int32_t l : len) a.max_cache_len = std::max(a.max_cache_len, l);
    a.softmax_scale = scale;
    return a;
  }

  std::vector<double> naive(int b, int h) const {
    const int w = kv_lora + d_rope;
    const bf16* ql = q_latent.data() + (int64_t(b) * heads + h) * kv_lora;
    const bf16* qr = q_rope.data() + (int64_t(b) * heads + h) * d_rope;
    std::vector<double> s;
    for (int t = 0; t < len[b]; ++t) {
      const bf16* row = cache.data() + (int64_t(start[b]) + t) * w;
      double dot = 0;
      for (int d = 0; d < kv_lora; ++d) dot += double(bf16_to_float(ql[d])) * bf16_to_float(row[d]);
      for (int d = 0; d < d_rope; ++d) dot += double(bf16_to_float(qr[d])) * bf16_to_float(row[kv_lora + d]);
      s.push_back(dot * scale);
    }
    std::vector<double> o(kv_lora, 0.0);
    if (s.empty()) return o;
    double mx = -INFINITY, sum = 0;
    for (double x : s) mx = std::max(mx, x);
    for (int t = 0; t < len[b]; ++t) {
      const double p = std::exp(s[t] - mx);
      sum += p;
      const bf16* row = cache.data() + (int64_t(start[b]) + t) * w;
      for (int d = 0; d < kv_lora; ++d) o[d] += p * bf16_to_float(row[d]);
    }
    for (double& x : o) x /= sum;
    return o;
  }
};

TEST(DecodeReference, MatchesNaiveLoops) {
  // Sequences at scattered cache positions, lengths 1, 17, 130 and 64 (one full block).
  DecodeCase c(5, 64, 16, {300, 0, 40, 200}, {1, 17, 130, 64}, 400);
  decode_attention(MemorySpace::host, c.args(), nullptr);
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < c.heads; ++h)
      expect_close(c.out.data() + (int64_t(b) * c.heads + h) * c.kv_lora, c.naive(b, h),
                   "sequence " + std::to_string(b) + " head " + std::to_string(h));
}

TEST(DecodeReference, MlaShapeMatchesNaiveLoops) {
  DecodeCase c(3, 512, 64, {10, 0}, {1, 77}, 100);
  decode_attention(MemorySpace::host, c.args(), nullptr);
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < c.heads; ++h)
      expect_close(c.out.data() + (int64_t(b) * c.heads + h) * c.kv_lora, c.naive(b, h), "mla shape");
}

TEST(DecodeReference, OneTokenCopiesTheLatentRowAndEmptyGivesZeros) {
  DecodeCase c(4, 64, 16, {7, 0}, {1, 0}, 10);
  decode_attention(MemorySpace::host, c.args(), nullptr);
  for (int h = 0; h < c.heads; ++h)
    for (int d = 0; d < c.kv_lora; ++d) {
      EXPECT_EQ(c.out[h * c.kv_lora + d].bits, c.cache[7 * (c.kv_lora + c.d_rope) + d].bits);
      EXPECT_EQ(bf16_to_float(c.out[(c.heads + h) * c.kv_lora + d]), 0.0f);
    }
}

TEST(DecodeReference, RejectsBadArgumentsAndNeedsNoWorkspace) {
  DecodeCase c(2, 64, 16, {0}, {5}, 8);
  EXPECT_EQ(decode_attention_workspace_bytes(MemorySpace::host, c.args()), 0u);
  DecodeAttentionArgs a = c.args();
  a.heads = 0;
  EXPECT_THROW(decode_attention(MemorySpace::host, a, nullptr), Error);
  a = c.args();
  a.softmax_scale = -1;
  EXPECT_THROW(decode_attention(MemorySpace::host, a, nullptr), Error);
  std::vector<int32_t> negative = {-1};
  a = c.args();
  a.cache_len = negative.data();
  EXPECT_THROW(decode_attention(MemorySpace::host, a, nullptr), Error);
  a = c.args();
  a.cache_rows = 4;  // sequence 0 ends at row 5
  EXPECT_THROW(decode_attention(MemorySpace::host, a, nullptr), Error);
  a = c.args();
  a.batch = 0;  // nothing to do
  decode_attention(MemorySpace::host, a, nullptr);
  for (const bf16 x : c.out) EXPECT_EQ(x.bits, kPoison.bits);
}

}  // namespace
}  // namespace fp8proj
