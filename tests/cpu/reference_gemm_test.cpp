// The CPU reference GEMMs against naive fp64 loops, and the error metric itself.
#include <gtest/gtest.h>

#include <cmath>

#include "fp8proj/quantize.hpp"
#include "fp8proj/reference.hpp"
#include "test_util.hpp"

namespace fp8proj {
namespace {

using testing::random_bf16;

struct Shape {
  int64_t m, n, k;
};

class ReferenceGemm : public ::testing::TestWithParam<Shape> {};

TEST_P(ReferenceGemm, Bf16MatchesNaiveFp64) {
  const auto [m, n, k] = GetParam();
  const auto a = random_bf16(m * k, 1), b = random_bf16(n * k, 2, 0.05f);
  std::vector<bf16> d(m * n);
  cpu::gemm_bf16(a.data(), b.data(), d.data(), m, n, k);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += double(bf16_to_float(a[i * k + p])) * bf16_to_float(b[j * k + p]);
      // bf16 output rounding (2^-9 relative) plus fp32 accumulation over K terms.
      ASSERT_NEAR(bf16_to_float(d[i * n + j]), s, std::fabs(s) / 256 + 1e-4 * std::sqrt(double(k))) << i << "," << j;
    }
}

TEST_P(ReferenceGemm, Fp8BlockMatchesNaiveFp64OfScaledCodes) {
  const auto [m, n, k] = GetParam();
  const auto a = random_bf16(m * k, 3), b = random_bf16(n * k, 4, 0.05f);
  HostFp8Activation qa = make_host_fp8_activation(m, k);
  HostFp8Weight qb = make_host_fp8_weight(n, k);
  cpu::quantize_activation(a.data(), m, k, qa.out());
  cpu::quantize_weight(b.data(), n, k, qb.out());
  std::vector<bf16> d(m * n);
  cpu::gemm_fp8_block(qa.view(), qb.view(), d.data());
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      // The block-scaled definition: sum over K blocks of sa * sb * (sum of code products).
      double s = 0;
      for (int64_t kb = 0; kb < k / 128; ++kb) {
        double part = 0;
        for (int64_t p = kb * 128; p < kb * 128 + 128; ++p)
          part += double(e4m3_to_float(qa.values[i * k + p])) * e4m3_to_float(qb.values[j * k + p]);
        s += part * qa.scales[kb * qa.scale_ld + i] * qb.scales[(j / 128) * (k / 128) + kb];
      }
      ASSERT_NEAR(bf16_to_float(d[i * n + j]), s, std::fabs(s) / 256 + 1e-4 * std::sqrt(double(k))) << i << "," << j;
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ReferenceGemm,
                         ::testing::Values(Shape{1, 128, 128}, Shape{3, 256, 384}, Shape{17, 384, 256},
                                           Shape{65, 130, 128}, Shape{129, 256, 512}),
                         [](const auto& info) {
                           return "m" + std::to_string(info.param.m) + "_n" + std::to_string(info.param.n) + "_k" +
                                  std::to_string(info.param.k);
                         });

TEST(ReferenceGemm, F64OracleAndCompare) {
  const std::vector<float> a = {1, 2, 3, 4}, b = {1, 0, 0, 1, 1, 1};  // a [2,2], b [3,2]
  const auto c = cpu::gemm_f64(a.data(), b.data(), 2, 3, 2);
  EXPECT_EQ(c, (std::vector<double>{1, 2, 3, 3, 4, 7}));
  std::vector<bf16> out = cpu::to_bf16(std::vector<float>{1, 2, 3, 3, 4, 7}.data(), 6);
  EXPECT_EQ(compare(out.data(), c.data(), 6).rel_frobenius, 0.0);
  out[2] = float_to_bf16(NAN);
  const ErrorStats e = compare(out.data(), c.data(), 6);
  EXPECT_EQ(e.non_finite, 1);  // a NaN output never passes silently
  // Against a bf16 reference: the same metric.
  const std::vector<bf16> ref = cpu::to_bf16(std::vector<float>{1, 2, 3, 3, 4, 7}.data(), 6);
  const ErrorStats eb = compare(out.data(), ref.data(), 6);
  EXPECT_EQ(eb.non_finite, 1);
  EXPECT_EQ(eb.rel_frobenius, 0.0);  // the other five agree exactly
}

}  // namespace
}  // namespace fp8proj
