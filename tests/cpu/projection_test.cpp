// The gated projection layer on the host: which path runs (flag, eligibility, threshold,
// environment), that each path computes what its reference does, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "env_guard.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/gemm.hpp"
#include "fp8proj/projection.hpp"
#include "fp8proj/quantize.hpp"
#include "fp8proj/reference.hpp"
#include "test_util.hpp"

namespace fp8proj {
namespace {

using testing::EnvGuard;
using testing::random_bf16;

// Clears every knob so a developer's shell cannot change the outcome.
struct CleanEnv {
  EnvGuard a{"FP8PROJ_PREFILL_FP8", nullptr}, b{"FP8PROJ_MIN_FP8_TOKENS", nullptr},
      c{"FP8PROJ_DECODE_CEILING", nullptr}, d{"FP8PROJ_FP8_BACKEND", nullptr},
      e{"FP8PROJ_WEIGHT_SCALES", nullptr};
};

ProjectionOptions opts(bool fp8, int64_t max_tokens = 64) {
  ProjectionOptions o;
  o.name = "test_proj";
  o.fp8 = fp8;
  o.max_tokens = max_tokens;
  return o;
}

TEST(Projection, PathTableFlagAndEligibility) {
  CleanEnv clean;
  const auto w = random_bf16(256 * 384, 1, 0.02f);
  const auto w_odd = random_bf16(200 * 384, 2, 0.02f);
  ProjectionLayer on(MemorySpace::host, w.data(), 256, 384, opts(true));
  ProjectionLayer off(MemorySpace::host, w.data(), 256, 384, opts(false));
  ProjectionLayer inel(MemorySpace::host, w_odd.data(), 200, 384, opts(true));
  EXPECT_TRUE(on.has_fp8_copy());
  EXPECT_FALSE(off.has_fp8_copy());
  EXPECT_FALSE(inel.has_fp8_copy());
  struct Row {
    int64_t m;
    Path on, off, inel;
  };
  for (const Row& r : {Row{0, Path::none, Path::none, Path::none}, Row{1, Path::bf16, Path::bf16, Path::bf16},
                       Row{511, Path::bf16, Path::bf16, Path::bf16}, Row{512, Path::bf16, Path::bf16, Path::bf16},
                       Row{513, Path::fp8, Path::bf16, Path::bf16}, Row{4096, Path::fp8, Path::bf16, Path::bf16}}) {
    EXPECT_EQ(on.path_for(r.m), r.on) << "M=" << r.m << " " << on.explain(r.m).to_string();
    EXPECT_EQ(off.path_for(r.m), r.off) << "M=" << r.m;
    EXPECT_EQ(inel.path_for(r.m), r.inel) << "M=" << r.m;
  }
  // fp8_block_shape_reason (gemm.hpp): N % 16 (200 is 8 mod 16), K % 128.
  EXPECT_NE(inel.explain(4096).reason.find("not a multiple of 16"), std::string::npos) << inel.explain(4096).reason;
  EXPECT_NE(off.explain(4096).reason.find("FP8 is off"), std::string::npos);
  EXPECT_EQ(on.explain(4096).backend, "cpu_reference");
}

TEST(Projection, EnvironmentKnobs) {
  CleanEnv clean;
  const auto w = random_bf16(128 * 128, 3, 0.02f);
  {
    EnvGuard g("FP8PROJ_PREFILL_FP8", "1");
    ProjectionLayer l(MemorySpace::host, w.data(), 128, 128, opts(false));
    EXPECT_TRUE(l.options().fp8);
    EXPECT_EQ(l.path_for(513), Path::fp8);
    EXPECT_EQ(l.path_for(512), Path::bf16);
  }
  {
    EnvGuard g("FP8PROJ_PREFILL_FP8", "1"), t("FP8PROJ_MIN_FP8_TOKENS", "1000");
    ProjectionLayer l(MemorySpace::host, w.data(), 128, 128, opts(false));
    EXPECT_EQ(l.path_for(1000), Path::bf16);
    EXPECT_EQ(l.path_for(1001), Path::fp8);
    EXPECT_NE(l.explain(1001).reason.find("FP8PROJ_MIN_FP8_TOKENS"), std::string::npos);
  }
  {
    EnvGuard g("FP8PROJ_PREFILL_FP8", "all"), t("FP8PROJ_MIN_FP8_TOKENS", "16");
    ProjectionLayer l(MemorySpace::host, w.data(), 128, 128, opts(false));
    EXPECT_EQ(l.options().policy, Fp8Policy::all);
    EXPECT_EQ(l.path_for(16), Path::bf16);
    EXPECT_EQ(l.path_for(17), Path::fp8);
  }
  {
    EnvGuard g("FP8PROJ_PREFILL_FP8", "1"), t("FP8PROJ_MIN_FP8_TOKENS", "16"), c("FP8PROJ_DECODE_CEILING", "64");
    ProjectionLayer l(MemorySpace::host, w.data(), 128, 128, opts(false));
    EXPECT_EQ(l.path_for(64), Path::bf16);
    EXPECT_EQ(l.path_for(65), Path::fp8);
  }
  {
    EnvGuard g("FP8PROJ_PREFILL_FP8", "0");  // the variable switches off an option that was on
    ProjectionLayer l(MemorySpace::host, w.data(), 128, 128, opts(true));
    EXPECT_EQ(l.path_for(4096), Path::bf16);
  }
  {
    EnvGuard g("FP8PROJ_PREFILL_FP8", "maybe");
    EXPECT_THROW(ProjectionLayer(MemorySpace::host, w.data(), 128, 128, opts(false)), Error);
  }
  {
    ProjectionOptions o = opts(false);
    o.apply_env = false;
    EnvGuard g("FP8PROJ_PREFILL_FP8", "1");
    ProjectionLayer l(MemorySpace::host, w.data(), 128, 128, o);
    EXPECT_EQ(l.path_for(4096), Path::bf16);  // ignores the environment when asked to
  }
}

double rel_error(const std::vector<bf16>& out, const std::vector<bf16>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    const double o = bf16_to_float(out[i]), r = bf16_to_float(ref[i]);
    num += (o - r) * (o - r);
    den += r * r;
  }
  return std::sqrt(num / den);
}

TEST(Projection, PathsComputeTheirReferences) {
  CleanEnv clean;
  const int64_t n = 256, k = 384, m = 600;  // M > max_tokens: FP8 runs in chunks
  const auto w = random_bf16(n * k, 4, 0.02f), x = random_bf16(m * k, 5);
  ProjectionLayer layer(MemorySpace::host, w.data(), n, k, opts(true, 128));
  ASSERT_EQ(layer.path_for(m), Path::fp8);
  std::vector<bf16> y(m * n, bf16::from_bits(0xffff));
  layer.forward(x.data(), m, y.data());

  HostFp8Activation qx = make_host_fp8_activation(m, k);
  HostFp8Weight qw = make_host_fp8_weight(n, k);
  cpu::quantize_activation(x.data(), m, k, qx.out());
  cpu::quantize_weight(w.data(), n, k, qw.out());
  std::vector<bf16> ref_fp8(m * n), ref_bf16(m * n);
  cpu::gemm_fp8_block(qx.view(), qw.view(), ref_fp8.data());
  cpu::gemm_bf16(x.data(), w.data(), ref_bf16.data(), m, n, k);
  EXPECT_EQ(0, std::memcmp(y.data(), ref_fp8.data(), y.size() * 2)) << "FP8 path differs from its reference";
  // The quantization's own error against bf16 (~3.7% relative on Gaussian data): report, bound loosely.
  const double qerr = rel_error(y, ref_bf16);
  std::printf("FP8 path vs bf16 GEMM: relative error %.4f\n", qerr);
  EXPECT_GT(qerr, 0.005);
  EXPECT_LT(qerr, 0.08);

  std::vector<bf16> y2(64 * n);
  layer.forward(x.data(), 64, y2.data());  // decode-sized: bf16 path
  std::vector<bf16> ref64(64 * n);
  cpu::gemm_bf16(x.data(), w.data(), ref64.data(), 64, n, k);
  EXPECT_EQ(0, std::memcmp(y2.data(), ref64.data(), y2.size() * 2));
}

TEST(Projection, RmsNormInputAndPreQuantized) {
  CleanEnv clean;
  const int64_t n = 128, k = 256, m = 520;
  const auto w = random_bf16(n * k, 6, 0.02f), x = random_bf16(m * k, 7, 4.0f), g = random_bf16(k, 8);
  ProjectionOptions o = opts(true, 1024);
  o.rmsnorm_input = true;
  ProjectionLayer layer(MemorySpace::host, w.data(), n, k, o);
  std::vector<bf16> normed(m * k), y(m * n), ref(m * n);
  cpu::rmsnorm(x.data(), k, g.data(), kRmsNormEps, m, k, normed.data());
  for (int64_t rows : {m, int64_t{100}}) {  // FP8 (fused) and bf16 paths
    layer.forward_rmsnorm(x.data(), k, g.data(), kRmsNormEps, rows, y.data());
    layer.forward(normed.data(), rows, ref.data());
    EXPECT_EQ(0, std::memcmp(y.data(), ref.data(), rows * n * 2)) << "M=" << rows;
  }
  HostFp8Activation q = make_host_fp8_activation(m, k);
  cpu::quantize_activation(normed.data(), m, k, q.out());
  layer.forward_quantized(q.view(), y.data());
  layer.forward(normed.data(), m, ref.data());
  EXPECT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * 2));
}

TEST(Projection, BadInputAndEmptyCalls) {
  CleanEnv clean;
  const auto w = random_bf16(128 * 256, 9, 0.02f), x = random_bf16(4 * 256, 10);
  std::vector<bf16> y(4 * 128);
  EXPECT_THROW(ProjectionLayer(MemorySpace::host, nullptr, 128, 256, opts(true)), Error);
  EXPECT_THROW(ProjectionLayer(MemorySpace::host, w.data(), 0, 256, opts(true)), Error);
  ProjectionOptions bad = opts(true);
  bad.max_tokens = 6;
  EXPECT_THROW(ProjectionLayer(MemorySpace::host, w.data(), 128, 256, bad), Error);
  bad = opts(true);
  bad.fp8_backend = "no_such_backend";
  EXPECT_THROW(ProjectionLayer(MemorySpace::host, w.data(), 128, 256, bad), Error);

  ProjectionLayer layer(MemorySpace::host, w.data(), 128, 256, opts(true));
  EXPECT_NO_THROW(layer.forward(nullptr, 0, nullptr));  // M = 0: no-op
  EXPECT_THROW(layer.forward(nullptr, 4, y.data()), Error);
  EXPECT_THROW(layer.forward(x.data(), 4, nullptr), Error);
  EXPECT_THROW(layer.forward(x.data(), -1, y.data()), Error);
  EXPECT_THROW(layer.forward_rmsnorm(x.data(), 256, nullptr, 1e-6f, 4, y.data()), Error);
  HostFp8Activation q = make_host_fp8_activation(4, 128);  // wrong K
  EXPECT_THROW(layer.forward_quantized(q.view(), y.data()), Error);
  ProjectionLayer off(MemorySpace::host, w.data(), 128, 256, opts(false));
  HostFp8Activation q2 = make_host_fp8_activation(4, 256);
  EXPECT_THROW(off.forward_quantized(q2.view(), y.data()), Error);  // no FP8 copy
}

// A backend named by a caller (ProjectionOptions, the C API) resolves, or says why not.
TEST(Projection, BackendNamesResolveOrSayWhy) {
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(resolve_backend("cpu_reference", GemmKind::fp8_block, MemorySpace::host, 128, 256).name(), "cpu_reference");
  EXPECT_EQ(resolve_backend("auto", GemmKind::bf16, MemorySpace::host, 100, 30).name(), "cpu_reference");
  std::string m = message([] { resolve_backend("nope", GemmKind::fp8_block, MemorySpace::host, 128, 256, "L"); });
  EXPECT_NE(m.find("L: unknown FP8 backend 'nope'"), std::string::npos) << m;
  EXPECT_NE(m.find("cpu_reference"), std::string::npos) << m;  // the known names
  m = message([] { resolve_backend("cpu_reference", GemmKind::fp8_block, MemorySpace::device, 128, 256); });
  EXPECT_NE(m.find("runs on the host, not on the device"), std::string::npos) << m;
  m = message([] { resolve_backend("cpu_reference", GemmKind::fp8_block, MemorySpace::host, 128, 200); });
  EXPECT_NE(m.find("cannot run 128x200"), std::string::npos) << m;
  m = message([] { resolve_backend("sm90_fp8_block", GemmKind::fp8_block, MemorySpace::host, 128, 256); });
  EXPECT_TRUE(m.find("is unusable") != std::string::npos || m.find("runs on the device") != std::string::npos) << m;

  CleanEnv clean;
  const auto w = random_bf16(128 * 256, 9, 0.02f);
  ProjectionOptions bad = opts(true);
  bad.name = "layers.3.q_b_proj";
  bad.fp8_backend = "no_such_backend";
  m = message([&] { ProjectionLayer(MemorySpace::host, w.data(), 128, 256, bad); });
  EXPECT_NE(m.find("layers.3.q_b_proj: unknown FP8 backend 'no_such_backend'"), std::string::npos) << m;
}

TEST(Projection, NaNRowPropagatesOnBothPaths) {
  CleanEnv clean;
  const int64_t n = 128, k = 256, m = 600;
  const auto w = random_bf16(n * k, 11, 0.02f);
  auto x = random_bf16(m * k, 12);
  x[3 * k + 7] = float_to_bf16(NAN);
  x[5 * k + 9] = float_to_bf16(INFINITY);
  ProjectionLayer layer(MemorySpace::host, w.data(), n, k, opts(true, 1024));
  for (int64_t rows : {m, int64_t{8}}) {
    std::vector<bf16> y(rows * n);
    layer.forward(x.data(), rows, y.data());
    for (int64_t j = 0; j < n; ++j) {
      EXPECT_TRUE(std::isnan(bf16_to_float(y[3 * n + j]))) << "M=" << rows << " col " << j;
      EXPECT_FALSE(std::isfinite(bf16_to_float(y[5 * n + j]))) << "M=" << rows << " col " << j;
      EXPECT_TRUE(std::isfinite(bf16_to_float(y[4 * n + j]))) << "M=" << rows << " col " << j;
    }
  }
}

// The private copy's scale format: option, environment, and the GEMM on fp32 scales. The FP8
// path with weight_scales = fp32 equals the reference GEMM on the float-rule copy bit for bit,
// and is within the numerics contract of the fp64 product of its dequantized operands.
TEST(Projection, WeightScaleFormat) {
  CleanEnv clean;
  const int64_t n = 272, k = 384, m = 200;  // N = 2 x 128 + 16: a partial last block
  const auto w = random_bf16(n * k, 21, 0.02f), x = random_bf16(m * k, 22);
  ProjectionOptions o = opts(true, 256);
  o.threshold = 0;
  o.decode_ceiling = 0;
  o.weight_scales = ScaleMode::fp32;
  ProjectionLayer layer(MemorySpace::host, w.data(), n, k, o);
  ASSERT_EQ(layer.options().weight_scales, ScaleMode::fp32);
  HostFp8Weight ref = make_host_fp8_weight(n, k);
  cpu::quantize_weight(w.data(), n, k, ref.out(), ScaleMode::fp32);
  const Fp8WeightView copy = *layer.fp8_weight();
  ASSERT_EQ(0, std::memcmp(copy.values, ref.values.data(), ref.values.size()));
  ASSERT_EQ(0, std::memcmp(copy.scales, ref.scales.data(), ref.scales.size() * sizeof(float)));

  std::vector<bf16> y(m * n, bf16::from_bits(0xffff));
  layer.forward(x.data(), m, y.data());
  HostFp8Activation qx = make_host_fp8_activation(m, k);
  cpu::quantize_activation(x.data(), m, k, qx.out());  // activations stay UE8M0
  std::vector<bf16> expect(m * n);
  cpu::gemm_fp8_block(qx.view(), ref.view(), expect.data());
  EXPECT_EQ(0, std::memcmp(y.data(), expect.data(), y.size() * 2));
  const std::vector<float> xq = cpu::dequantize(qx.view()), wq = cpu::dequantize(ref.view());
  const std::vector<double> exact = cpu::gemm_f64(xq.data(), wq.data(), m, n, k);
  const ErrorStats err = compare(y.data(), exact.data(), m * n);
  EXPECT_EQ(err.non_finite, 0);
  EXPECT_LE(err.rel_frobenius, kFp8GemmRelTol);

  // Against the bf16 GEMM the float copy is no worse than the UE8M0 one on Gaussian data (it keeps
  // up to one more bit of each block's range).
  o.weight_scales = ScaleMode::ue8m0;
  ProjectionLayer pow2(MemorySpace::host, w.data(), n, k, o);
  std::vector<bf16> y2(m * n), yb(m * n);
  pow2.forward(x.data(), m, y2.data());
  cpu::gemm_bf16(x.data(), w.data(), yb.data(), m, n, k);
  const double e_float = rel_error(y, yb), e_pow2 = rel_error(y2, yb);
  std::printf("FP8 vs bf16: float weight scales %.5f, UE8M0 %.5f\n", e_float, e_pow2);
  EXPECT_LT(e_float, e_pow2 * 1.02);

  {  // the environment overrides the option, both ways, and rejects anything else
    EnvGuard g("FP8PROJ_WEIGHT_SCALES", "float");
    EXPECT_EQ(ProjectionLayer(MemorySpace::host, w.data(), n, k, opts(true)).options().weight_scales, ScaleMode::fp32);
    ProjectionOptions no_env = opts(true);
    no_env.apply_env = false;
    EXPECT_EQ(ProjectionLayer(MemorySpace::host, w.data(), n, k, no_env).options().weight_scales, ScaleMode::ue8m0);
  }
  {
    EnvGuard g("FP8PROJ_WEIGHT_SCALES", "ue8m0");
    ProjectionOptions f = opts(true);
    f.weight_scales = ScaleMode::fp32;
    EXPECT_EQ(ProjectionLayer(MemorySpace::host, w.data(), n, k, f).options().weight_scales, ScaleMode::ue8m0);
  }
  {
    EnvGuard g("FP8PROJ_WEIGHT_SCALES", "fp16");
    try {
      ProjectionLayer bad(MemorySpace::host, w.data(), n, k, opts(true));
      FAIL() << "FP8PROJ_WEIGHT_SCALES=fp16 was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("FP8PROJ_WEIGHT_SCALES='fp16' is not one of ue8m0, float"), std::string::npos)
          << e.what();
    }
  }
}

TEST(Projection, MemoryReport) {
  CleanEnv clean;
  const auto w = random_bf16(256 * 512, 13, 0.02f);
  ProjectionLayer layer(MemorySpace::host, w.data(), 256, 512, opts(true, 64));
  const ProjectionMemory mem = layer.memory();
  EXPECT_EQ(mem.bf16_weight, 256u * 512 * 2);
  EXPECT_EQ(mem.fp8_values, 256u * 512);
  EXPECT_EQ(mem.fp8_scales, 2u * 4 * 4);
  EXPECT_NEAR(mem.fp8_overhead(), 0.5, 0.01);
  EXPECT_GT(mem.workspace, 0u);
}

}  // namespace
}  // namespace fp8proj
