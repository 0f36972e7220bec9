// The C ABI (include/fp8proj/c_api.h) as a foreign caller sees it: this program links only
// libfp8proj_c.so and the CUDA runtime, and checks the result against its own fp64 product
// of the decoded e4m3 operands. Argument errors are checked everywhere; tests that need a GPU
// skip, with the reason, where there is none.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "fp8proj/c_api.h"

namespace {

std::string last_error() { return fp8proj_last_error(); }

bool have_gpu(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n == 0) {
    *why = err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device";
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

// e4m3 (OCP FP8, "fn": no infinities, 0x7f/0xff NaN) decoded independently of the library.
double decode_e4m3(uint8_t v) {
  const int sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
  double mag = exp == 0 ? std::ldexp(man / 8.0, -6) : std::ldexp(1.0 + man / 8.0, exp - 7);
  return sign ? -mag : mag;
}

double bf16_to_double(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

TEST(CApi, ArgumentErrorsNeverThrowAcrossTheAbi) {
  fp8proj_fp8_gemm* g = reinterpret_cast<fp8proj_fp8_gemm*>(0x1);
  EXPECT_EQ(fp8proj_fp8_gemm_create(nullptr, nullptr, 256, 256, 16, nullptr, nullptr), -1);
  EXPECT_NE(last_error().find("out"), std::string::npos) << last_error();
  EXPECT_EQ(fp8proj_fp8_gemm_create(nullptr, nullptr, 200, 256, 16, nullptr, &g), -1);
  EXPECT_EQ(g, nullptr) << "a failed create must leave no handle behind";
  EXPECT_NE(last_error().find("not a multiple of 16"), std::string::npos) << last_error();
  EXPECT_EQ(fp8proj_fp8_gemm_create(nullptr, nullptr, 256, 256, 0, nullptr, &g), -1);
  EXPECT_NE(last_error().find("max_m"), std::string::npos) << last_error();
  EXPECT_EQ(fp8proj_fp8_gemm_run(nullptr, nullptr, nullptr, 4, 1, nullptr, nullptr), -1);
  EXPECT_NE(last_error().find("handle is null"), std::string::npos) << last_error();
  char buf[8];
  EXPECT_EQ(fp8proj_fp8_gemm_describe(nullptr, 1, buf, sizeof buf), -1);
  fp8proj_fp8_gemm_destroy(nullptr);  // a no-op
}

TEST(CApi, CreateWithoutGpuOrWithHostPointersFailsClearly) {
  std::vector<uint8_t> w(256 * 256);
  std::vector<float> s(4, 1.0f);
  fp8proj_fp8_gemm* g = nullptr;
  EXPECT_EQ(fp8proj_fp8_gemm_create(w.data(), s.data(), 256, 256, 16, nullptr, &g), -1);
  EXPECT_EQ(g, nullptr);
  std::string why;
  const std::string expect = have_gpu(&why) ? "not device memory" : "no usable CUDA GPU";
  EXPECT_NE(last_error().find(expect), std::string::npos) << last_error();
}

class CApiGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!have_gpu(&why)) GTEST_SKIP() << "no GPU: " << why;
    cudaDeviceProp prop{};
    ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
    if (prop.major != 9) GTEST_SKIP() << "the FP8 kernels need sm_90 (Hopper); this GPU is sm_" << prop.major << prop.minor;
  }
  template <typename T>
  T* upload(const std::vector<T>& h) {
    void* d = nullptr;
    EXPECT_EQ(cudaMalloc(&d, h.size() * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    owned_.push_back(d);
    return static_cast<T*>(d);
  }
  void TearDown() override {
    for (void* p : owned_) cudaFree(p);
  }
  std::vector<void*> owned_;
};

// y = dequant(x) . dequant(w)^T through the ABI, against fp64 on the host; bitwise repeatable;
// M = 0 a no-op; m > max_m and a host output pointer refused without touching the GPU.
TEST_F(CApiGpu, MatchesFp64ProductOfDecodedOperands) {
  const int64_t n = 384, k = 512, max_m = 80;
  std::mt19937 rng(7);
  auto random_e4m3 = [&](size_t count) {
    std::vector<uint8_t> v(count);
    for (auto& b : v) {
      do b = static_cast<uint8_t>(rng()); while ((b & 0x7f) == 0x7f);  // no NaN encodings
    }
    return v;
  };
  std::uniform_int_distribution<int> ex(-12, 4);
  std::uniform_real_distribution<float> frac(1.0f, 2.0f);
  const std::vector<uint8_t> w = random_e4m3(n * k), x = random_e4m3(max_m * k);
  std::vector<float> ws((n / 128) * (k / 128)), xs((k / 128) * max_m);
  for (auto& s : ws) s = std::ldexp(1.0f, ex(rng));        // UE8M0-style powers of two ...
  for (auto& s : xs) s = frac(rng) * std::ldexp(1.0f, ex(rng));  // ... and arbitrary fp32 scales
  const uint8_t* dw = upload(w);
  const float* dws = upload(ws);
  const uint8_t* dx = upload(x);
  const float* dxs = upload(xs);
  void* dy = nullptr;
  ASSERT_EQ(cudaMalloc(&dy, max_m * n * 2), cudaSuccess);
  owned_.push_back(dy);

  fp8proj_fp8_gemm* g = nullptr;
  EXPECT_EQ(fp8proj_fp8_gemm_create(dw, dws, n, k, max_m, "no_such_backend", &g), -1);
  EXPECT_NE(last_error().find("unknown FP8 backend"), std::string::npos) << last_error();
  EXPECT_EQ(fp8proj_fp8_gemm_create(dw, dws, n, k, max_m, "cublaslt_bf16", &g), -1);
  EXPECT_NE(last_error().find("not a block-scaled FP8 backend"), std::string::npos) << last_error();
  EXPECT_EQ(fp8proj_fp8_gemm_create(dw, dws, n, k, max_m, "cpu_reference", &g), -1);
  EXPECT_NE(last_error().find("runs on the host"), std::string::npos) << last_error();
  EXPECT_EQ(g, nullptr);
  ASSERT_EQ(fp8proj_fp8_gemm_create(dw, dws, n, k, max_m, "sm90_fp8_block", &g), 0) << last_error();
  ASSERT_NE(g, nullptr);
  char desc[128];
  ASSERT_EQ(fp8proj_fp8_gemm_describe(g, 77, desc, sizeof desc), 0) << last_error();
  EXPECT_EQ(std::string(desc).rfind("sm90_fp8_block:", 0), 0u) << desc;

  for (int64_t m : {int64_t{1}, int64_t{77}}) {
    ASSERT_EQ(cudaMemset(dy, 0xff, max_m * n * 2), cudaSuccess);  // NaN poison
    ASSERT_EQ(fp8proj_fp8_gemm_run(g, dx, dxs, max_m, m, dy, nullptr), 0) << last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint16_t> y(m * n), again(m * n);
    ASSERT_EQ(cudaMemcpy(y.data(), dy, y.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(fp8proj_fp8_gemm_run(g, dx, dxs, max_m, m, dy, nullptr), 0) << last_error();
    ASSERT_EQ(cudaMemcpy(again.data(), dy, again.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(y, again) << "not bitwise repeatable at m=" << m;

    double err = 0, ref = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t kk = 0; kk < k; ++kk)
          acc += decode_e4m3(x[i * k + kk]) * xs[(kk / 128) * max_m + i] * decode_e4m3(w[j * k + kk]) *
                 ws[(j / 128) * (k / 128) + kk / 128];
        const double got = bf16_to_double(y[i * n + j]);
        ASSERT_TRUE(std::isfinite(got)) << "y[" << i << "," << j << "] not written or not finite, m=" << m;
        err += (got - acc) * (got - acc);
        ref += acc * acc;
      }
    EXPECT_LE(std::sqrt(err / ref), 2e-3) << "m=" << m;
  }

  EXPECT_EQ(fp8proj_fp8_gemm_run(g, dx, dxs, max_m, 0, dy, nullptr), 0) << last_error();
  EXPECT_EQ(fp8proj_fp8_gemm_run(g, dx, dxs, max_m, max_m + 1, dy, nullptr), -1);
  EXPECT_NE(last_error().find("max_m"), std::string::npos) << last_error();
  std::vector<uint16_t> host_y(n);
  EXPECT_EQ(fp8proj_fp8_gemm_run(g, dx, dxs, max_m, 1, host_y.data(), nullptr), -1);
  EXPECT_NE(last_error().find("not device memory"), std::string::npos) << last_error();
  EXPECT_EQ(fp8proj_fp8_gemm_run(g, dx, dxs, 2, 77, dy, nullptr), -1);  // scale stride < m
  EXPECT_NE(last_error().find("stride"), std::string::npos) << last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "a refused call must not leave a device error behind";
  fp8proj_fp8_gemm_destroy(g);
}

// The nearest e4m3 code to v after saturation at 448, ties to the even code, by search over the
// decoded codes (independent of the library's encoder).
uint8_t encode_e4m3_naive(float v) {
  if (std::isnan(v)) return 0x7f;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const double a = std::min(std::fabs(double(v)), 448.0);
  int best = 0;
  double best_d = INFINITY;
  for (int c = 0; c <= 0x7e; ++c) {
    const double d = std::fabs(decode_e4m3(static_cast<uint8_t>(c)) - a);
    if (d < best_d || (d == best_d && (c & 1) == 0)) best = c, best_d = d;
  }
  return static_cast<uint8_t>(sign | best);
}

// bf16 bits of f, rounded to nearest even (finite inputs).
uint16_t bf16_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// The fp32 ("float") scale format through the ABI: weights in 128x128 blocks and activations in
// 1x128 groups against this file's own rule (scale fl32(max(amax, eps) / 448), code
// e4m3(fl32(x / scale)), the quotients taken in fp64 and rounded once: the correctly rounded
// fp32 quotients); a projection made with it holds that format, and its FP8 path matches the GEMM
// of those operands.
TEST_F(CApiGpu, FloatScaleFormat) {
  const int64_t n = 272, k = 384, m = 40;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> w(n * k), x(m * k);
  for (auto& v : w) v = bf16_of(0.02f * nd(rng));
  for (auto& v : x) v = bf16_of(nd(rng));
  const uint16_t* dw = upload(w);
  const uint16_t* dx = upload(x);
  const int64_t rb = (n + 127) / 128, cb = k / 128, ld = 40;
  uint8_t* dwv = upload(std::vector<uint8_t>(n * k));
  float* dws = upload(std::vector<float>(rb * cb));
  uint8_t* dxv = upload(std::vector<uint8_t>(m * k));
  float* dxs = upload(std::vector<float>(cb * ld));
  ASSERT_EQ(fp8proj_quantize_weight_scaled(dw, n, k, FP8PROJ_SCALES_FLOAT, dwv, dws, nullptr), 0) << last_error();
  ASSERT_EQ(fp8proj_quantize_activation_scaled(dx, k, m, k, FP8PROJ_SCALES_FLOAT, dxv, dxs, ld, nullptr), 0)
      << last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> wv(n * k), xv(m * k);
  std::vector<float> ws(rb * cb), xs(cb * ld);
  ASSERT_EQ(cudaMemcpy(wv.data(), dwv, wv.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(ws.data(), dws, ws.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(xv.data(), dxv, xv.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(xs.data(), dxs, xs.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  int bad = 0;
  for (int64_t bi = 0; bi < rb; ++bi)
    for (int64_t bj = 0; bj < cb; ++bj) {
      double amax = 0;
      for (int64_t r = bi * 128; r < std::min(n, bi * 128 + 128); ++r)
        for (int64_t c = bj * 128; c < bj * 128 + 128; ++c) amax = std::max(amax, std::fabs(bf16_to_double(w[r * k + c])));
      const float s = static_cast<float>(std::max(amax, double(1e-4f)) / 448.0);
      EXPECT_EQ(ws[bi * cb + bj], s) << "weight block " << bi << "," << bj;
      for (int64_t r = bi * 128; r < std::min(n, bi * 128 + 128); ++r)
        for (int64_t c = bj * 128; c < bj * 128 + 128; ++c)
          bad += wv[r * k + c] != encode_e4m3_naive(static_cast<float>(bf16_to_double(w[r * k + c]) / s));
    }
  for (int64_t i = 0; i < m; ++i)
    for (int64_t g = 0; g < cb; ++g) {
      double amax = 0;
      for (int64_t c = g * 128; c < g * 128 + 128; ++c) amax = std::max(amax, std::fabs(bf16_to_double(x[i * k + c])));
      const float s = static_cast<float>(std::max(amax, double(1e-10f)) / 448.0);
      EXPECT_EQ(xs[g * ld + i], s) << "activation group " << i << "," << g;
      for (int64_t c = g * 128; c < g * 128 + 128; ++c)
        bad += xv[i * k + c] != encode_e4m3_naive(static_cast<float>(bf16_to_double(x[i * k + c]) / s));
    }
  EXPECT_EQ(bad, 0) << "e4m3 codes differing from the float rule";

  fp8proj_projection_options o;
  ASSERT_EQ(fp8proj_projection_options_init(&o), 0);
  o.enabled = 1;
  o.policy = "all";
  o.threshold = 0;
  o.apply_env = 0;
  fp8proj_projection* p = nullptr;
  ASSERT_EQ(fp8proj_projection_create_scaled(dw, n, k, &o, FP8PROJ_SCALES_FLOAT, &p), 0) << last_error();
  int fmt = -1;
  ASSERT_EQ(fp8proj_projection_weight_scales(p, &fmt), 0) << last_error();
  EXPECT_EQ(fmt, FP8PROJ_SCALES_FLOAT);
  void* dy = nullptr;
  ASSERT_EQ(cudaMalloc(&dy, m * n * 2), cudaSuccess);
  owned_.push_back(dy);
  ASSERT_EQ(cudaMemset(dy, 0xff, m * n * 2), cudaSuccess);
  ASSERT_EQ(fp8proj_projection_forward(p, dx, m, dy, nullptr), 0) << last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> y(m * n);
  ASSERT_EQ(cudaMemcpy(y.data(), dy, y.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  // The layer quantizes its activations with UE8M0 scales; its weight copy is the float one
  // checked above. Its output against the fp64 product of the bf16 operands: the quantization's
  // own error (~3-4% relative), every element finite.
  double err = 0, ref = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t c = 0; c < k; ++c) acc += bf16_to_double(x[i * k + c]) * bf16_to_double(w[j * k + c]);
      const double got = bf16_to_double(y[i * n + j]);
      ASSERT_TRUE(std::isfinite(got)) << "y[" << i << "," << j << "]";
      err += (got - acc) * (got - acc);
      ref += acc * acc;
    }
  EXPECT_LT(std::sqrt(err / ref), 0.08);
  fp8proj_projection_destroy(p);

  fp8proj_fp8_gemm* g = nullptr;
  ASSERT_EQ(fp8proj_fp8_gemm_create(dwv, dws, n, k, 64, nullptr, &g), 0) << last_error();
  size_t bytes = 1;
  EXPECT_EQ(fp8proj_fp8_gemm_workspace_bytes(g, &bytes), 0) << last_error();
  fp8proj_fp8_gemm_destroy(g);
}

// The fused RMSNorm + 1x128 quantization in both scale formats through the ABI: the UE8M0 call is
// the unscaled entry point's, bit for bit; each fp32 scale is amax/448 of the group's normalized
// values (computed here in fp64: within the bf16 rounding of the norm's output), each UE8M0 scale
// the power of two at or above it, and the fp32 codes decode to the normalized values within
// e4m3's precision.
TEST_F(CApiGpu, RmsnormQuantizeScaleFormats) {
  const int64_t m = 37, k = 512, ld = 40, cb = k / 128;
  const float eps = 1e-6f;
  std::mt19937 rng(23);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<uint16_t> x(m * k), w(k);
  for (auto& v : x) v = bf16_of(3.0f * nd(rng));
  for (auto& v : w) v = bf16_of(1.0f + 0.3f * nd(rng));
  const uint16_t* dx = upload(x);
  const uint16_t* dw = upload(w);
  uint8_t* dv[3];
  float* ds[3];
  for (int i = 0; i < 3; ++i) {
    dv[i] = upload(std::vector<uint8_t>(m * k));
    ds[i] = upload(std::vector<float>(cb * ld));
  }
  ASSERT_EQ(fp8proj_rmsnorm_quantize(dx, k, dw, eps, m, k, dv[0], ds[0], ld, nullptr), 0) << last_error();
  ASSERT_EQ(fp8proj_rmsnorm_quantize_scaled(dx, k, dw, eps, m, k, FP8PROJ_SCALES_UE8M0, dv[1], ds[1], ld, nullptr), 0)
      << last_error();
  ASSERT_EQ(fp8proj_rmsnorm_quantize_scaled(dx, k, dw, eps, m, k, FP8PROJ_SCALES_FLOAT, dv[2], ds[2], ld, nullptr), 0)
      << last_error();
  EXPECT_EQ(fp8proj_rmsnorm_quantize_scaled(nullptr, k, nullptr, eps, 0, k, FP8PROJ_SCALES_FLOAT, nullptr, nullptr, 0,
                                            nullptr),
            0)
      << "M = 0 is a no-op: " << last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> v[3];
  std::vector<float> sc[3];
  for (int i = 0; i < 3; ++i) {
    v[i].resize(m * k);
    sc[i].resize(cb * ld);
    ASSERT_EQ(cudaMemcpy(v[i].data(), dv[i], v[i].size(), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(sc[i].data(), ds[i], sc[i].size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  EXPECT_EQ(v[0], v[1]) << "FP8PROJ_SCALES_UE8M0 codes differ from fp8proj_rmsnorm_quantize's";
  EXPECT_EQ(sc[0], sc[1]) << "FP8PROJ_SCALES_UE8M0 scales differ from fp8proj_rmsnorm_quantize's";
  int bad = 0;
  for (int64_t i = 0; i < m; ++i) {
    double ss = 0;
    for (int64_t c = 0; c < k; ++c) ss += bf16_to_double(x[i * k + c]) * bf16_to_double(x[i * k + c]);
    const double r = 1.0 / std::sqrt(ss / double(k) + double(eps));
    for (int64_t g = 0; g < cb; ++g) {
      double y[128], amax = 0;
      for (int c = 0; c < 128; ++c) {
        y[c] = bf16_to_double(x[i * k + g * 128 + c]) * r * bf16_to_double(w[g * 128 + c]);
        amax = std::max(amax, std::fabs(y[c]));
      }
      const double sf = sc[2][g * ld + i], su = sc[1][g * ld + i];
      EXPECT_NEAR(sf, amax / 448.0, 0.01 * amax / 448.0) << "fp32 scale, row " << i << " group " << g;
      int e = 0;
      EXPECT_EQ(std::frexp(su, &e), 0.5) << "UE8M0 scale " << su << " is not a power of two";
      EXPECT_TRUE(su >= sf && su < 2.0 * sf) << "UE8M0 scale " << su << " against fp32 scale " << sf;
      for (int c = 0; c < 128; ++c)
        bad += std::fabs(decode_e4m3(v[2][i * k + g * 128 + c]) * sf - y[c]) > 0.07 * std::fabs(y[c]) + 0.004 * sf;
    }
  }
  EXPECT_EQ(bad, 0) << "fp32-scale codes that do not decode to the normalized values";
}

// The path and explain() of a call through forward (input 0) and through forward_rmsnorm (input
// 1): input 0 answers what fp8proj_projection_path / _explain answer; input 1 follows the tuned
// bucket's GEMM-alone verdict where the bucket has a GEMM-alone time (fp8_gemm_us) and says so;
// any other input is refused.
TEST_F(CApiGpu, PathAndExplainPerInput) {
  const int64_t n = 3072, k = 1536;  // DeepSeek-V3 q_b_proj at TP 8: a shipped tuned row
  const uint16_t* dw = upload(std::vector<uint16_t>(n * k, bf16_of(0.01f)));
  fp8proj_projection_options o;
  ASSERT_EQ(fp8proj_projection_options_init(&o), 0);
  o.enabled = 1;
  o.policy = "all";
  o.rmsnorm_input = 1;
  o.apply_env = 0;
  fp8proj_projection* p = nullptr;
  ASSERT_EQ(fp8proj_projection_create(dw, n, k, &o, &p), 0) << last_error();
  char a[1024], b[1024];
  for (int64_t m : {1, 16, 40, 64, 4096}) {
    int p0 = -1, p1 = -1, plain = -1;
    ASSERT_EQ(fp8proj_projection_path(p, m, &plain), 0) << last_error();
    ASSERT_EQ(fp8proj_projection_path_input(p, m, 0, &p0), 0) << last_error();
    ASSERT_EQ(fp8proj_projection_path_input(p, m, 1, &p1), 0) << last_error();
    EXPECT_EQ(p0, plain) << "M=" << m;
    EXPECT_TRUE(p1 == 1 || p1 == 2) << "M=" << m << ": path " << p1;
    ASSERT_EQ(fp8proj_projection_explain(p, m, a, sizeof a), 0) << last_error();
    ASSERT_EQ(fp8proj_projection_explain_input(p, m, 0, b, sizeof b), 0) << last_error();
    EXPECT_STREQ(a, b) << "M=" << m;
    ASSERT_EQ(fp8proj_projection_explain_input(p, m, 1, b, sizeof b), 0) << last_error();
    const std::string normed = b;
    EXPECT_EQ(normed.rfind("M=" + std::to_string(m) + ": " + (p1 == 2 ? "fp8" : "bf16"), 0), 0) << normed;
    if (normed.find("(GEMM alone ") != std::string::npos)  // the bucket has a GEMM-alone time: its verdict
      EXPECT_NE(normed.find("FP8 GEMM alone: the norm before it writes its FP8 input"), std::string::npos) << normed;
    printf("  [M=%lld] forward: %s\n           forward_rmsnorm: %s\n", static_cast<long long>(m), a, b);
  }
  int path = -1;
  EXPECT_EQ(fp8proj_projection_path_input(p, 16, 2, &path), -1);
  EXPECT_NE(last_error().find("input must be 0 (forward) or 1 (forward_rmsnorm), got 2"), std::string::npos)
      << last_error();
  EXPECT_EQ(fp8proj_projection_explain_input(p, 16, -1, a, sizeof a), -1);
  EXPECT_EQ(fp8proj_projection_path_input(p, -1, 1, &path), -1);
  EXPECT_EQ(fp8proj_projection_path_input(p, 16, 1, nullptr), -1);
  fp8proj_projection_destroy(p);
}

}  // namespace
