// CPU quantizers against naive fp64 loops, including partial edge blocks, the M-contiguous
// scale layout, non-finite groups and bad arguments.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "fp8proj/error.hpp"
#include "fp8proj/quantize.hpp"
#include "quant/silu_exact.hpp"
#include "test_util.hpp"

namespace fp8proj {
namespace {

using testing::naive_e4m3;
using testing::naive_ue8m0_scale;
using testing::random_bf16;

std::string shape_name(const ::testing::TestParamInfo<std::pair<int64_t, int64_t>>& info) {
  return std::to_string(info.param.first) + "x" + std::to_string(info.param.second);
}

class WeightQuant : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(WeightQuant, MatchesNaiveBlockReference) {
  const auto [n, k] = GetParam();
  const auto w = random_bf16(n * k, 10 + n + k, 0.05f);
  HostFp8Weight q = make_host_fp8_weight(n, k);
  cpu::quantize_weight(w.data(), n, k, q.out());
  ASSERT_EQ(q.scales.size(), size_t(ceil_div(n, 128) * ceil_div(k, 128)));
  for (int64_t br = 0; br < ceil_div(n, 128); ++br)
    for (int64_t bc = 0; bc < ceil_div(k, 128); ++bc) {
      double amax = 0;  // over the (possibly partial) block only
      for (int64_t r = br * 128; r < std::min(n, br * 128 + 128); ++r)
        for (int64_t c = bc * 128; c < std::min(k, bc * 128 + 128); ++c)
          amax = std::max(amax, std::fabs(double(bf16_to_float(w[r * k + c]))));
      const float s = naive_ue8m0_scale(static_cast<float>(amax), kWeightAmaxEps);
      ASSERT_EQ(q.scales[br * ceil_div(k, 128) + bc], s) << "block " << br << "," << bc;
      for (int64_t r = br * 128; r < std::min(n, br * 128 + 128); ++r)
        for (int64_t c = bc * 128; c < std::min(k, bc * 128 + 128); ++c)
          ASSERT_EQ(q.values[r * k + c], naive_e4m3(double(bf16_to_float(w[r * k + c])) / s))
              << "element " << r << "," << c;
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, WeightQuant,
                         ::testing::Values(std::pair<int64_t, int64_t>{128, 128}, std::pair<int64_t, int64_t>{1, 1},
                                           std::pair<int64_t, int64_t>{300, 200}, std::pair<int64_t, int64_t>{129, 257},
                                           std::pair<int64_t, int64_t>{256, 640}),
                         shape_name);

class ActivationQuant : public ::testing::TestWithParam<std::pair<int64_t, int64_t>> {};

TEST_P(ActivationQuant, MatchesNaiveGroupReferenceAndLayout) {
  const auto [m, k] = GetParam();
  const auto x = random_bf16(m * k, 20 + m + k, 2.0f);
  HostFp8Activation q = make_host_fp8_activation(m, k);
  ASSERT_EQ(q.scale_ld, round_up(m, 4));
  cpu::quantize_activation(x.data(), m, k, q.out());
  for (int64_t r = 0; r < m; ++r)
    for (int64_t g = 0; g < k / 128; ++g) {
      double amax = 0;
      for (int64_t c = g * 128; c < g * 128 + 128; ++c) amax = std::max(amax, std::fabs(double(bf16_to_float(x[r * k + c]))));
      const float s = naive_ue8m0_scale(static_cast<float>(amax), kActAmaxEps);
      ASSERT_EQ(q.scales[g * q.scale_ld + r], s) << "row " << r << " group " << g;  // M-contiguous
      for (int64_t c = g * 128; c < g * 128 + 128; ++c)
        ASSERT_EQ(q.values[r * k + c], naive_e4m3(double(bf16_to_float(x[r * k + c])) / s));
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ActivationQuant,
                         ::testing::Values(std::pair<int64_t, int64_t>{1, 128}, std::pair<int64_t, int64_t>{3, 384},
                                           std::pair<int64_t, int64_t>{5, 256}, std::pair<int64_t, int64_t>{64, 128},
                                           std::pair<int64_t, int64_t>{65, 512}),
                         shape_name);

TEST(ActivationQuant, ZeroGroupUsesEpsilonScale) {
  std::vector<bf16> x(256, float_to_bf16(0.0f));
  HostFp8Activation q = make_host_fp8_activation(2, 128);
  cpu::quantize_activation(x.data(), 2, 128, q.out());
  EXPECT_EQ(q.scales[0], naive_ue8m0_scale(0.0f, kActAmaxEps));
  for (uint8_t v : q.values) EXPECT_EQ(v, 0);
}

TEST(ActivationQuant, NonFiniteGroupBecomesNaNAndStaysLocal) {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    auto x = random_bf16(3 * 256, 5);
    x[1 * 256 + 130] = float_to_bf16(bad);  // row 1, group 1
    HostFp8Activation q = make_host_fp8_activation(3, 256);
    cpu::quantize_activation(x.data(), 3, 256, q.out());
    EXPECT_TRUE(std::isnan(q.scales[1 * q.scale_ld + 1]));
    for (int c = 128; c < 256; ++c) EXPECT_EQ(q.values[256 + c], kE4m3NaN);
    EXPECT_FALSE(std::isnan(q.scales[0 * q.scale_ld + 1]));  // row 1, group 0 untouched
    EXPECT_FALSE(std::isnan(q.scales[1 * q.scale_ld + 0]));  // row 0, group 1 untouched
    const auto d = cpu::dequantize(q.view());
    EXPECT_TRUE(std::isnan(d[256 + 200]));
    EXPECT_FALSE(std::isnan(d[256 + 5]));
  }
}

TEST(WeightQuant, NaNBlockBecomesNaN) {
  auto w = random_bf16(256 * 256, 6, 0.02f);
  w[200 * 256 + 3] = float_to_bf16(NAN);  // block (1, 0)
  HostFp8Weight q = make_host_fp8_weight(256, 256);
  cpu::quantize_weight(w.data(), 256, 256, q.out());
  EXPECT_TRUE(std::isnan(q.scales[2]));
  EXPECT_FALSE(std::isnan(q.scales[0]));
  EXPECT_FALSE(std::isnan(q.scales[3]));
}

// The fp32 ("float") weight rule of formats.hpp, block by block, edge blocks partial, against the
// fp64 oracle of test_util.hpp: scale fl32(max(amax, 1e-4) / 448), code e4m3(fl32(w / scale)).
TEST_P(WeightQuant, Fp32ScalesMatchTheFloatRule) {
  const auto [n, k] = GetParam();
  auto w = random_bf16(n * k, 20 + n + k, 0.05f);
  for (int64_t c = 0; c < std::min<int64_t>(k, 128); ++c) w[c] = float_to_bf16(0.0f);  // row 0 of block (0, 0)
  HostFp8Weight q = make_host_fp8_weight(n, k);
  cpu::quantize_weight(w.data(), n, k, q.out(), ScaleMode::fp32);
  int64_t not_pow2 = 0;
  for (int64_t br = 0; br < ceil_div(n, 128); ++br)
    for (int64_t bc = 0; bc < ceil_div(k, 128); ++bc) {
      float amax = 0;
      for (int64_t r = br * 128; r < std::min(n, br * 128 + 128); ++r)
        for (int64_t c = bc * 128; c < std::min(k, bc * 128 + 128); ++c)
          amax = std::max(amax, std::fabs(bf16_to_float(w[r * k + c])));
      const float s = testing::naive_fp32_scale(amax, kWeightAmaxEps);
      ASSERT_EQ(q.scales[br * ceil_div(k, 128) + bc], s) << "block " << br << "," << bc;
      int e;
      not_pow2 += std::frexp(s, &e) != 0.5f;
      for (int64_t r = br * 128; r < std::min(n, br * 128 + 128); ++r)
        for (int64_t c = bc * 128; c < std::min(k, bc * 128 + 128); ++c)
          ASSERT_EQ(q.values[r * k + c], testing::naive_fp32_code(bf16_to_float(w[r * k + c]), s))
              << "element " << r << "," << c;
    }
  EXPECT_GT(not_pow2, 0) << "fp32 scales of Gaussian blocks are not powers of two";
}

TEST(WeightQuant, Fp32ScalesEdgeBlocks) {
  // An all-zero block takes eps / 448 (codes 0); a NaN block a NaN scale and NaN codes; a block
  // whose amax is 448 x 2^j gets exactly 2^j (the rule's fixed points), and its amax encodes to 448.
  std::vector<bf16> w(256 * 384, float_to_bf16(0.0f));
  w[130 * 384 + 3] = float_to_bf16(NAN);                // block (1, 0)
  for (int64_t c = 128; c < 256; ++c) w[5 * 384 + c] = float_to_bf16(0.25f);
  w[7 * 384 + 200] = float_to_bf16(-448.0f * 0.125f);    // block (0, 1): amax 56
  HostFp8Weight q = make_host_fp8_weight(256, 384);
  cpu::quantize_weight(w.data(), 256, 384, q.out(), ScaleMode::fp32);
  EXPECT_EQ(q.scales[0], kWeightAmaxEps / 448.0f);
  EXPECT_EQ(q.values[0], 0);
  EXPECT_EQ(q.scales[1], 0.125f);
  EXPECT_EQ(q.values[7 * 384 + 200], 0xfe);  // -448
  EXPECT_EQ(q.values[5 * 384 + 128], float_to_e4m3(2.0f));
  EXPECT_TRUE(std::isnan(q.scales[3]));
  EXPECT_EQ(q.values[130 * 384 + 3], kE4m3NaN);
  EXPECT_EQ(q.values[131 * 384 + 5], kE4m3NaN);
  EXPECT_FALSE(std::isnan(q.scales[4]));
}

TEST(ScaleModeNames, ParseAndPrint) {
  EXPECT_EQ(parse_scale_mode("ue8m0"), ScaleMode::ue8m0);
  EXPECT_EQ(parse_scale_mode("float"), ScaleMode::fp32);
  EXPECT_EQ(parse_scale_mode("fp32"), ScaleMode::fp32);
  EXPECT_FALSE(parse_scale_mode("UE8M0").has_value());
  EXPECT_FALSE(parse_scale_mode("").has_value());
  EXPECT_STREQ(scale_mode_name(ScaleMode::ue8m0), "ue8m0");
  EXPECT_STREQ(scale_mode_name(ScaleMode::fp32), "float");
}

TEST(ActivationQuant, Fp32ScaleMode) {
  const auto x = random_bf16(2 * 128, 7);
  HostFp8Activation q = make_host_fp8_activation(2, 128);
  cpu::quantize_activation(x.data(), 2, 128, q.out(), ScaleMode::fp32);
  double amax = 0;
  for (int c = 0; c < 128; ++c) amax = std::max(amax, std::fabs(double(bf16_to_float(x[c]))));
  const float s = static_cast<float>(amax) / 448.0f;
  EXPECT_EQ(q.scales[0], s);
  for (int c = 0; c < 128; ++c) EXPECT_EQ(q.values[c], naive_e4m3(double(bf16_to_float(x[c]) / s)));
}

TEST(Dequantize, IsValueTimesScale) {
  const auto w = random_bf16(130 * 260, 8, 0.02f);
  HostFp8Weight q = make_host_fp8_weight(130, 260);
  cpu::quantize_weight(w.data(), 130, 260, q.out());
  const auto d = cpu::dequantize(q.view());
  for (int64_t r = 0; r < 130; r += 7)
    for (int64_t c = 0; c < 260; c += 5)
      EXPECT_EQ(d[r * 260 + c], e4m3_to_float(q.values[r * 260 + c]) * q.scales[(r / 128) * 3 + c / 128]);
}

TEST(QuantArgs, RejectsBadInputWithClearMessages) {
  const auto x = random_bf16(4 * 256, 9);
  HostFp8Activation q = make_host_fp8_activation(4, 256);
  auto expect_error = [](auto&& fn, const char* needle) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([&] { cpu::quantize_activation(x.data(), 4, 200, q.out()); }, "multiple of 128");
  expect_error([&] { cpu::quantize_activation(static_cast<const bf16*>(nullptr), 4, 256, q.out()); }, "null");
  expect_error([&] { cpu::quantize_activation(x.data(), 8, 256, q.out()); }, "too small");
  expect_error([&] { cpu::quantize_activation(x.data(), -1, 256, q.out()); }, ">= 0");
  expect_error([&] { make_host_fp8_activation(4, 100); }, "multiple of 128");
  HostFp8Weight w = make_host_fp8_weight(4, 256);
  expect_error([&] { cpu::quantize_weight(static_cast<const bf16*>(nullptr), 4, 256, w.out()); }, "null");
  expect_error([&] { cpu::quantize_weight(x.data(), 4, 128, w.out()); }, "FP8 weight output is");
  // M = 0 is a no-op, not an error.
  HostFp8Activation empty = make_host_fp8_activation(0, 256);
  EXPECT_NO_THROW(cpu::quantize_activation(static_cast<const bf16*>(nullptr), 0, 256, empty.out()));
}

TEST(RmsNorm, MatchesFp64WithinBf16Rounding) {
  const int64_t m = 7, k = 2048;
  const auto x = random_bf16(m * k, 11, 3.0f), g = random_bf16(k, 12);
  std::vector<bf16> y(m * k);
  cpu::rmsnorm(x.data(), k, g.data(), kRmsNormEps, m, k, y.data());
  for (int64_t r = 0; r < m; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < k; ++c) ss += std::pow(double(bf16_to_float(x[r * k + c])), 2);
    const double inv = 1.0 / std::sqrt(ss / k + kRmsNormEps);
    for (int64_t c = 0; c < k; ++c) {
      const double ref = double(bf16_to_float(x[r * k + c])) * inv * bf16_to_float(g[c]);
      ASSERT_NEAR(bf16_to_float(y[r * k + c]), ref, std::fabs(ref) * (1.0 / 256) + 1e-30) << r << "," << c;
    }
  }
}

// silu(g) = g / (1 + exp(-g)) rounded to bf16, times up, rounded again: PyTorch's bf16
// act_fn(gate) * up. Checked value by value against that formula in double (both roundings
// applied), then fused == silu_mul then quantize, for two halves of one [M, 2K] buffer too.
// silu_exact (the exp both the CPU reference and the GPU kernel use) over every bf16 gate: within
// 3 fp32 ulps of silu in double (1.76 at worst), and bf16(silu_exact(g)) the correctly rounded
// bf16 of the double value except where that value lies within those 3 ulps of a bf16 tie (none
// is off now). The special values as g / (1 + expf(-g)) gives them.
TEST(SiluMul, SiluExactOverEveryBf16Gate) {
  // How far |v| lies from the nearest bf16 rounding tie (the midpoint of the two bf16 around it).
  auto tie_distance = [](double v) {
    const uint32_t lo = float_bits(static_cast<float>(std::fabs(v))) & 0xffff0000u;
    return std::fabs(std::fabs(v) - (static_cast<double>(bits_float(lo)) + bits_float(lo + 0x10000u)) / 2);
  };
  int64_t finite = 0, near_tie = 0, bf16_off = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    const float g = bf16_to_float(bf16::from_bits(static_cast<uint16_t>(i)));
    if (!std::isfinite(g)) continue;
    ++finite;
    // Where silu is subnormal (|g| < 2^-125: exactly g / 2, ties included) or exp(-g) overflows
    // fp32 (g < -88.7: -0, as any fp32 g / (1 + expf(-g))), ulps of the true value say nothing.
    if (std::fabs(g) < 0x1p-125f || g < -88.0f) continue;
    const float s = detail::silu_exact(g);
    const double want = static_cast<double>(g) / (1.0 + std::exp(-static_cast<double>(g)));
    const double ulp = std::ldexp(1.0, std::max(std::ilogb(static_cast<float>(want)), -126) - 23);
    ASSERT_LE(std::fabs(s - want), 3 * ulp) << "g = " << g << ": silu_exact " << s << ", silu " << want;
    const bool tie_close = tie_distance(want) <= 3 * ulp;
    near_tie += tie_close;
    if (float_to_bf16(s).bits != float_to_bf16(static_cast<float>(want)).bits) {
      ++bf16_off;
      EXPECT_TRUE(tie_close) << "g = " << g << ": bf16(silu_exact) is off away from a tie";
    }
  }
  EXPECT_EQ(finite, 65536 - 2 * 128);  // the exponent-255 patterns: +-inf and the NaNs
  EXPECT_LE(bf16_off, near_tie);
  EXPECT_LE(near_tie, 16) << "a handful of gates lie near a tie (3 now), not thousands";
  EXPECT_EQ(detail::silu_exact(0.0f), 0.0f);
  EXPECT_EQ(detail::silu_exact(-100.0f), 0.0f);  // -100 / inf = -0
  EXPECT_TRUE(std::signbit(detail::silu_exact(-100.0f)));
  EXPECT_EQ(detail::silu_exact(100.0f), 100.0f);  // 1 + exp(-100) rounds to 1
  EXPECT_EQ(detail::silu_exact(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(detail::silu_exact(-INFINITY)));
  EXPECT_TRUE(std::isnan(detail::silu_exact(NAN)));
  EXPECT_EQ(detail::exp_for_silu(0.0f), 1.0f);
  EXPECT_EQ(detail::exp_for_silu(88.8f), INFINITY);
}

TEST(SiluMul, TwoBf16RoundingsThenTheQuantization) {
  const int64_t m = 4, k = 384;
  auto gu = random_bf16(m * 2 * k, 21, 6.0f);
  gu[0] = float_to_bf16(0.0f);
  gu[1] = float_to_bf16(-100.0f);  // silu -> -0 (exp(100) overflows fp32: -100 / inf)
  gu[2] = float_to_bf16(100.0f);   // silu -> 100
  std::vector<bf16> y(m * k);
  cpu::silu_mul(gu.data(), gu.data() + k, 2 * k, m, k, y.data());
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const double g = bf16_to_float(gu[r * 2 * k + c]), u = bf16_to_float(gu[r * 2 * k + k + c]);
      const float s = bf16_to_float(float_to_bf16(static_cast<float>(g / (1.0 + std::exp(-g)))));
      const float want = bf16_to_float(float_to_bf16(s * static_cast<float>(u)));
      // fp32 exp against the double one may move the first rounding by one bf16 step, rarely.
      EXPECT_NEAR(bf16_to_float(y[r * k + c]), want, std::fabs(want) * 0x1p-7f + 1e-30f) << r << "," << c;
    }
  EXPECT_EQ(bf16_to_float(y[0]), 0.0f);
  EXPECT_EQ(bf16_to_float(y[1]), 0.0f);  // -0 times up: a zero of either sign, never NaN
  EXPECT_EQ(bf16_to_float(y[2]), bf16_to_float(float_to_bf16(100.0f * bf16_to_float(gu[k + 2]))));
  for (const ScaleMode mode : {ScaleMode::ue8m0, ScaleMode::fp32}) {
    HostFp8Activation a = make_host_fp8_activation(m, k), b = make_host_fp8_activation(m, k);
    cpu::quantize_activation(y.data(), m, k, a.out(), mode);
    cpu::silu_mul_quantize(gu.data(), gu.data() + k, 2 * k, m, k, b.out(), mode);
    EXPECT_EQ(a.values, b.values);
    EXPECT_EQ(0, std::memcmp(a.scales.data(), b.scales.data(), a.scales.size() * 4));
  }
  HostFp8Activation o = make_host_fp8_activation(m, k);
  EXPECT_THROW(cpu::silu_mul(gu.data(), gu.data() + k, k - 1, m, k, y.data()), Error);  // stride below K
  EXPECT_THROW(cpu::silu_mul_quantize(gu.data(), gu.data() + k, 2 * k, m, 200, o.out()), Error);
  EXPECT_NO_THROW(cpu::silu_mul_quantize(nullptr, nullptr, k, 0, k, {nullptr, nullptr, 0, k, 0}));
}

// Rows x, a norm weight g and y = cpu::rmsnorm(x) * g, for the fused-quantization tests.
struct NormedRows {
  std::vector<bf16> x, g, y;
  NormedRows(int64_t m, int64_t k, uint32_t seed)
      : x(random_bf16(m * k, seed, 2.0f)), g(random_bf16(k, seed + 1)), y(static_cast<size_t>(m * k)) {
    cpu::rmsnorm(x.data(), k, g.data(), kRmsNormEps, m, k, y.data());
  }
};

TEST(RmsNorm, FusedQuantizeEqualsNormThenQuantize) {
  const int64_t m = 5, k = 1536;
  const NormedRows rows(m, k, 13);
  const auto &x = rows.x, &g = rows.g, &y = rows.y;
  HostFp8Activation a = make_host_fp8_activation(m, k), b = make_host_fp8_activation(m, k);
  cpu::quantize_activation(y.data(), m, k, a.out());
  cpu::rmsnorm_quantize(x.data(), k, g.data(), kRmsNormEps, m, k, b.out());
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(0, std::memcmp(a.scales.data(), b.scales.data(), a.scales.size() * 4));
}

// The fp32 scale format (what an FP8 checkpoint's FP8Linear takes): each group's scale is
// fl(max(amax, eps) / 448) of the normalized bf16 values, not a power of two in general, and the
// codes are e4m3(x / scale); the default stays UE8M0.
TEST(RmsNorm, FusedQuantizeTakesTheFloatScaleFormat) {
  const int64_t m = 3, k = 512;
  const NormedRows rows(m, k, 15);
  const auto &x = rows.x, &g = rows.g, &y = rows.y;
  HostFp8Activation f = make_host_fp8_activation(m, k), u = make_host_fp8_activation(m, k);
  cpu::rmsnorm_quantize(x.data(), k, g.data(), kRmsNormEps, m, k, f.out(), ScaleMode::fp32);
  cpu::rmsnorm_quantize(x.data(), k, g.data(), kRmsNormEps, m, k, u.out());
  int not_pow2 = 0;
  for (int64_t r = 0; r < m; ++r)
    for (int64_t grp = 0; grp < k / 128; ++grp) {
      float amax = 0.0f;
      for (int64_t c = grp * 128; c < grp * 128 + 128; ++c) amax = std::max(amax, std::fabs(bf16_to_float(y[r * k + c])));
      const float s = f.scales[grp * f.scale_ld + r];
      EXPECT_EQ(s, std::max(amax, kActAmaxEps) / 448.0f) << "row " << r << " group " << grp;
      int e = 0;
      not_pow2 += std::frexp(s, &e) != 0.5f;
      EXPECT_EQ(std::frexp(u.scales[grp * u.scale_ld + r], &e), 0.5f) << "the default is UE8M0";
      for (int64_t c = grp * 128; c < grp * 128 + 128; ++c)
        EXPECT_NEAR(e4m3_to_float(f.values[r * k + c]) * s, bf16_to_float(y[r * k + c]),
                    std::fabs(bf16_to_float(y[r * k + c])) / 16 + s / 512)
            << r << "," << c;
    }
  EXPECT_GT(not_pow2, 0) << "every fp32 scale a power of two: the format was not applied";
}

}  // namespace
}  // namespace fp8proj
