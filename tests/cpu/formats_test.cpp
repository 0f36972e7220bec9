// The formats by their definitions (the bit-exact comparison with ml_dtypes lives in
// tests/oracle/test_formats.py).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "fp8proj/formats.hpp"

namespace fp8proj {
namespace {

// Independent reference for the scale rule: the smallest power of two >= fl32(max(amax,eps)/448),
// found with frexp rather than from the float's bits.
int reference_ue8m0(float amax, float eps) {
  const float q = (amax > eps ? amax : eps) / 448.0f;
  int e;
  const float mant = std::frexp(q, &e);  // q = mant * 2^e, mant in [0.5, 1)
  const int ceil_log2 = mant == 0.5f ? e - 1 : e;
  return std::min(std::max(ceil_log2 + 127, 1), 254);
}

TEST(E4m3, RoundTripsEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_to_float(static_cast<uint8_t>(c));
    if (std::isnan(v)) {
      EXPECT_EQ(c & 0x7f, 0x7f) << "only 0x7f/0xff are NaN, got code " << c;
      continue;
    }
    EXPECT_EQ(float_to_e4m3(v), c) << "code " << c << " value " << v;
  }
}

TEST(E4m3, SaturatesAndKeepsNaN) {
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(-448.0f), 0xfe);
  EXPECT_EQ(float_to_e4m3(463.99f), 0x7e);
  EXPECT_EQ(float_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(float_to_e4m3(INFINITY), 0x7e);
  EXPECT_EQ(float_to_e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(float_to_e4m3(NAN) & 0x7f, 0x7f);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
}

TEST(E4m3, RoundsTiesToEven) {
  // Between 1.0 (0x38) and 1.125 (0x39) the tie 1.0625 goes to the even code 0x38;
  // between 1.125 and 1.25 (0x3a) the tie 1.1875 goes to 0x3a.
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3a);
  // Subnormals: step 2^-9. 1.5 * 2^-9 ties to 2 * 2^-9 (code 2); 0.5 * 2^-9 ties to 0.
  EXPECT_EQ(float_to_e4m3(1.5f * 0.001953125f), 0x02);
  EXPECT_EQ(float_to_e4m3(0.5f * 0.001953125f), 0x00);
  EXPECT_EQ(float_to_e4m3(2.5f * 0.001953125f), 0x02);
  // 7.5 * 2^-9 rounds up into the smallest normal 2^-6 (code 0x08).
  EXPECT_EQ(float_to_e4m3(7.5f * 0.001953125f), 0x08);
}

TEST(E4m3, NearestOnRandomInputs) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-500.0f, 500.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = u(rng) * (i % 3 == 0 ? 1e-3f : 1.0f);
    const float q = e4m3_to_float(float_to_e4m3(x));
    const float clipped = std::fmax(-448.0f, std::fmin(448.0f, x));
    // No representable value is strictly closer than the one chosen.
    const uint8_t c = float_to_e4m3(x);
    for (int d : {-1, 1}) {
      const uint8_t nb = static_cast<uint8_t>(c + d);
      const float v = e4m3_to_float(nb);
      if (std::isnan(v) || ((nb ^ c) & 0x80)) continue;
      ASSERT_LE(std::fabs(q - clipped), std::fabs(v - clipped)) << "x=" << x;
    }
  }
}

TEST(Ue8m0, PowerOfTwoAtOrAboveAmaxOver448) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> mant(0.5f, 1.0f);
  std::uniform_int_distribution<int> ex(-60, 60);
  for (int i = 0; i < 200000; ++i) {
    const float amax = std::ldexp(mant(rng), ex(rng));
    for (float eps : {kWeightAmaxEps, kActAmaxEps}) {
      const uint8_t e = ue8m0_scale_for_amax(amax, eps);
      ASSERT_EQ(e, reference_ue8m0(amax, eps)) << "amax=" << amax;
      const float s = ue8m0_to_float(e);
      int ee;
      ASSERT_EQ(std::frexp(s, &ee), 0.5f) << "scale is not a power of two";
      ASSERT_LE(static_cast<double>(std::fmax(amax, eps)) / s, 448.0);
      ASSERT_EQ(ue8m0_inverse(e) * s, 1.0f);
    }
  }
}

TEST(Ue8m0, EdgeInputs) {
  // 0 and denormal amax clamp to eps.
  EXPECT_EQ(ue8m0_scale_for_amax(0.0f, kWeightAmaxEps), reference_ue8m0(kWeightAmaxEps, kWeightAmaxEps));
  EXPECT_EQ(ue8m0_scale_for_amax(1e-42f, kActAmaxEps), reference_ue8m0(kActAmaxEps, kActAmaxEps));
  // amax = 448 * 2^k gives exactly 2^k; one ulp above goes to 2^(k+1).
  for (int k = -20; k <= 20; ++k) {
    const float a = std::ldexp(448.0f, k);
    EXPECT_EQ(ue8m0_scale_for_amax(a, kActAmaxEps), 127 + k);
    EXPECT_EQ(ue8m0_scale_for_amax(std::nextafter(a, INFINITY), kActAmaxEps), 128 + k);
  }
  EXPECT_EQ(ue8m0_to_float(127), 1.0f);
  EXPECT_TRUE(std::isnan(ue8m0_to_float(255)));
}

TEST(ScaleMode, Fp32ModeIsAmaxOver448) {
  EXPECT_EQ(group_scale(3.0f, kActAmaxEps, ScaleMode::fp32), 3.0f / 448.0f);
  EXPECT_EQ(group_scale(0.0f, kWeightAmaxEps, ScaleMode::fp32), kWeightAmaxEps / 448.0f);
  EXPECT_EQ(group_scale(3.0f, kActAmaxEps, ScaleMode::ue8m0), 1.0f / 128.0f);
}

TEST(Bf16, RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(float_to_bf16(1.0f).bits, 0x3f80);
  EXPECT_EQ(float_to_bf16(bits_float(0x3f808000u)).bits, 0x3f80);  // tie -> even
  EXPECT_EQ(float_to_bf16(bits_float(0x3f818000u)).bits, 0x3f82);  // tie -> even (up)
  EXPECT_EQ(float_to_bf16(bits_float(0x3f808001u)).bits, 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_EQ(float_to_bf16(INFINITY).bits, 0x7f80);
}

}  // namespace
}  // namespace fp8proj
