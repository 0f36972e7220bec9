// The C ABI's argument and environment errors (include/fp8proj/c_api.h), through the shared
// library as a foreign caller sees it: every bad call returns -1 with a message naming the
// problem, nothing crashes, m = 0 is a successful no-op. Runs on any machine; the cases that
// need a GPU (or its absence) skip with the reason.
#include "fp8proj/c_api.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace {

struct Status {
  bool fp8_ok = false;
  std::string text;
};

Status device_status() {
  int ok = -1;
  char buf[256];
  EXPECT_EQ(fp8proj_device_status(&ok, buf, sizeof buf), 0) << fp8proj_last_error();
  return {ok == 1, buf};
}

// A 16-byte aligned address that is not device memory: the checks must reject it before any
// kernel sees it.
alignas(16) unsigned char host_bytes[4096];

::testing::AssertionResult FailsWith(int rc, const std::string& needle) {
  if (rc != -1) return ::testing::AssertionFailure() << "returned " << rc << ", expected -1";
  const std::string msg = fp8proj_last_error();
  if (msg.find(needle) == std::string::npos)
    return ::testing::AssertionFailure() << "message \"" << msg << "\" does not contain \"" << needle << "\"";
  return ::testing::AssertionSuccess();
}

TEST(CApiErrors, DeviceStatusSaysWhy) {
  const Status s = device_status();
  EXPECT_FALSE(s.text.empty());
  EXPECT_TRUE(FailsWith(fp8proj_device_status(nullptr, nullptr, 0), "fp8_ok is null"));
  int ok = 0;
  EXPECT_TRUE(FailsWith(fp8proj_device_status(&ok, nullptr, 16), "buf is null"));
}

TEST(CApiErrors, ShapeChecksComeFirst) {
  float* s = reinterpret_cast<float*>(host_bytes);
  EXPECT_TRUE(FailsWith(fp8proj_quantize_activation(host_bytes, 100, 4, 100, host_bytes, s, 4, nullptr),
                        "multiple of 128"));
  EXPECT_TRUE(FailsWith(fp8proj_quantize_activation(host_bytes, 256, 4, 128, host_bytes, s, 4, nullptr),
                        "x_stride=256 must equal k=128"));
  EXPECT_TRUE(FailsWith(fp8proj_quantize_activation(host_bytes, 128, 5, 128, host_bytes, s, 5, nullptr),
                        "multiple of 4"));
  EXPECT_TRUE(FailsWith(fp8proj_quantize_activation(host_bytes, 128, -1, 128, host_bytes, s, 4, nullptr),
                        "m must be >= 0"));
  EXPECT_TRUE(FailsWith(fp8proj_rmsnorm_quantize(host_bytes, 132, host_bytes, 1e-6f, 4, 128, host_bytes, s, 4,
                                                 nullptr),
                        "multiple of 8"));
  EXPECT_TRUE(FailsWith(fp8proj_rmsnorm_quantize(host_bytes, 128, host_bytes, -1.0f, 4, 128, host_bytes, s, 4,
                                                 nullptr),
                        "eps must be >= 0"));
  EXPECT_TRUE(FailsWith(fp8proj_quantize_weight(host_bytes, 0, 128, host_bytes, s, nullptr), "must be positive"));
  EXPECT_TRUE(FailsWith(fp8proj_fp8_gemm_create(host_bytes, s, 100, 128, 16, nullptr, nullptr), "handle's address"));
  fp8proj_fp8_gemm* g = nullptr;
  EXPECT_TRUE(FailsWith(fp8proj_fp8_gemm_create(host_bytes, s, 100, 128, 16, nullptr, &g), "not a multiple of 16"));
  EXPECT_TRUE(FailsWith(fp8proj_fp8_gemm_create(host_bytes, s, 128, 100, 16, nullptr, &g), "not a multiple of 128"));
  EXPECT_EQ(g, nullptr);
}

// The scale-format entry points: an unknown format is refused before anything else; a known one
// reaches the same checks as the functions without it.
TEST(CApiErrors, ScaleFormats) {
  float* s = reinterpret_cast<float*>(host_bytes);
  EXPECT_TRUE(FailsWith(fp8proj_quantize_weight_scaled(host_bytes, 128, 128, 7, host_bytes, s, nullptr),
                        "scale_format=7 is not FP8PROJ_SCALES_UE8M0 (0) or FP8PROJ_SCALES_FLOAT (1)"));
  EXPECT_TRUE(FailsWith(fp8proj_quantize_activation_scaled(host_bytes, 128, 4, 128, -1, host_bytes, s, 4, nullptr),
                        "scale_format=-1"));
  EXPECT_TRUE(FailsWith(fp8proj_quantize_weight_scaled(host_bytes, 0, 128, FP8PROJ_SCALES_FLOAT, host_bytes, s,
                                                       nullptr),
                        "must be positive"));
  EXPECT_TRUE(FailsWith(fp8proj_quantize_activation_scaled(host_bytes, 100, 4, 100, FP8PROJ_SCALES_FLOAT, host_bytes,
                                                           s, 4, nullptr),
                        "multiple of 128"));
  EXPECT_EQ(fp8proj_quantize_activation_scaled(nullptr, 128, 0, 128, FP8PROJ_SCALES_FLOAT, nullptr, nullptr, 0,
                                               nullptr),
            0)
      << fp8proj_last_error();
  EXPECT_TRUE(FailsWith(fp8proj_rmsnorm_quantize_scaled(host_bytes, 128, host_bytes, 1e-6f, 4, 128, 5, host_bytes, s,
                                                        4, nullptr),
                        "scale_format=5"));
  EXPECT_TRUE(FailsWith(fp8proj_rmsnorm_quantize_scaled(host_bytes, 100, host_bytes, 1e-6f, 4, 100,
                                                        FP8PROJ_SCALES_FLOAT, host_bytes, s, 4, nullptr),
                        "multiple of 128"));
  EXPECT_TRUE(FailsWith(fp8proj_rmsnorm_quantize_scaled(host_bytes, 128, host_bytes, -1.0f, 4, 128,
                                                        FP8PROJ_SCALES_FLOAT, host_bytes, s, 4, nullptr),
                        "eps must be >= 0"));
  EXPECT_EQ(fp8proj_rmsnorm_quantize_scaled(nullptr, 128, nullptr, 1e-6f, 0, 128, FP8PROJ_SCALES_FLOAT, nullptr,
                                            nullptr, 0, nullptr),
            0)
      << fp8proj_last_error();
  EXPECT_TRUE(FailsWith(fp8proj_silu_mul_quantize(host_bytes, host_bytes, 256, 4, 128, 7, host_bytes, s, 4, nullptr),
                        "scale_format=7"));
  EXPECT_TRUE(FailsWith(fp8proj_silu_mul_quantize(host_bytes, host_bytes, 256, 4, 100, FP8PROJ_SCALES_FLOAT,
                                                  host_bytes, s, 4, nullptr),
                        "multiple of 128"));
  EXPECT_TRUE(FailsWith(fp8proj_silu_mul_quantize(host_bytes, host_bytes, 100, 4, 128, FP8PROJ_SCALES_FLOAT,
                                                  host_bytes, s, 4, nullptr),
                        "stride=100"));
  EXPECT_EQ(fp8proj_silu_mul_quantize(nullptr, nullptr, 128, 0, 128, FP8PROJ_SCALES_FLOAT, nullptr, nullptr, 0,
                                      nullptr),
            0)
      << fp8proj_last_error();
  fp8proj_projection* p = reinterpret_cast<fp8proj_projection*>(0x1);
  EXPECT_TRUE(FailsWith(fp8proj_projection_create_scaled(host_bytes, 128, 128, nullptr, 2, &p), "weight_scales=2"));
  EXPECT_EQ(p, nullptr) << "a failed create must leave no handle behind";
  int fmt = -1;
  EXPECT_TRUE(FailsWith(fp8proj_projection_weight_scales(nullptr, &fmt), "handle is null"));
  size_t bytes = 0;
  EXPECT_TRUE(FailsWith(fp8proj_fp8_gemm_workspace_bytes(nullptr, &bytes), "handle is null"));
  // A valid call with host pointers: refused for want of a GPU, or for the host memory.
  EXPECT_EQ(fp8proj_quantize_weight_scaled(host_bytes, 128, 128, FP8PROJ_SCALES_FLOAT, host_bytes, s, nullptr), -1);
  const std::string msg = fp8proj_last_error();
  EXPECT_TRUE(msg.find("no usable CUDA GPU") != std::string::npos || msg.find("not device memory") != std::string::npos)
      << msg;
}

TEST(CApiErrors, EmptyBatchIsANoOp) {
  // m = 0 touches no pointer, so null ones are fine.
  EXPECT_EQ(fp8proj_quantize_activation(nullptr, 128, 0, 128, nullptr, nullptr, 0, nullptr), 0)
      << fp8proj_last_error();
  EXPECT_EQ(fp8proj_rmsnorm_quantize(nullptr, 128, nullptr, 1e-6f, 0, 128, nullptr, nullptr, 0, nullptr), 0)
      << fp8proj_last_error();
  EXPECT_STREQ(fp8proj_last_error(), "");
}

TEST(CApiErrors, NullHandles) {
  char buf[64];
  int path = 0;
  size_t bytes = 0;
  EXPECT_TRUE(FailsWith(fp8proj_projection_forward(nullptr, host_bytes, 1, host_bytes, nullptr), "handle is null"));
  EXPECT_TRUE(FailsWith(fp8proj_projection_forward_rmsnorm(nullptr, host_bytes, 128, host_bytes, 1e-6f, 1,
                                                           host_bytes, nullptr),
                        "handle is null"));
  EXPECT_TRUE(FailsWith(fp8proj_projection_path(nullptr, 1, &path), "handle is null"));
  EXPECT_TRUE(FailsWith(fp8proj_projection_explain(nullptr, 1, buf, sizeof buf), "handle is null"));
  EXPECT_TRUE(FailsWith(fp8proj_projection_path_input(nullptr, 1, 1, &path), "handle is null"));
  EXPECT_TRUE(FailsWith(fp8proj_projection_explain_input(nullptr, 1, 1, buf, sizeof buf), "handle is null"));
  EXPECT_TRUE(FailsWith(fp8proj_projection_memory(nullptr, &bytes, nullptr, nullptr, nullptr), "handle is null"));
  EXPECT_TRUE(FailsWith(fp8proj_fp8_gemm_run(nullptr, host_bytes, nullptr, 4, 1, host_bytes, nullptr),
                        "handle is null"));
  EXPECT_TRUE(FailsWith(fp8proj_projection_options_init(nullptr), "options is null"));
  EXPECT_TRUE(FailsWith(fp8proj_workspace_bytes(nullptr, &bytes), "handle is null"));
  fp8proj_workspace* ws = nullptr;
  EXPECT_TRUE(FailsWith(fp8proj_workspace_create(6, 128, 0, &ws), "multiple of 4"));
  EXPECT_TRUE(FailsWith(fp8proj_workspace_create(8, 100, 0, &ws), "multiple of 128"));
  EXPECT_EQ(ws, nullptr);
  fp8proj_workspace_destroy(nullptr);
  fp8proj_projection_destroy(nullptr);  // ignored
  fp8proj_fp8_gemm_destroy(nullptr);
}

TEST(CApiErrors, ProjectionOptions) {
  fp8proj_projection_options o;
  ASSERT_EQ(fp8proj_projection_options_init(&o), 0);
  EXPECT_EQ(o.enabled, 0);
  EXPECT_EQ(o.apply_env, 1);
  EXPECT_LT(o.threshold, 0);
  EXPECT_TRUE(FailsWith(fp8proj_projection_create(host_bytes, 128, 128, &o, nullptr), "handle's address"));
  fp8proj_projection* p = reinterpret_cast<fp8proj_projection*>(host_bytes);
  EXPECT_TRUE(FailsWith(fp8proj_projection_create(host_bytes, 0, 128, &o, &p), "must be positive"));
  EXPECT_EQ(p, nullptr);  // cleared on failure
  o.policy = "sometimes";
  EXPECT_TRUE(FailsWith(fp8proj_projection_create(host_bytes, 128, 128, &o, &p), "policy must be"));
}

TEST(CApiErrors, NoGpuIsAnErrorNotACrash) {
  const Status s = device_status();
  float* sc = reinterpret_cast<float*>(host_bytes);
  fp8proj_projection* p = nullptr;
  // With a GPU (any), host memory is rejected; without one every device entry point says there
  // is none. Both are -1 with a message, before any kernel runs.
  const bool gpu_present = s.fp8_ok || s.text.rfind("GPU ", 0) == 0;
  if (gpu_present) {
    EXPECT_TRUE(FailsWith(fp8proj_quantize_weight(host_bytes, 128, 128, host_bytes, sc, nullptr), "not device memory"));
    EXPECT_TRUE(FailsWith(fp8proj_projection_create(host_bytes, 128, 128, nullptr, &p), "not device memory"));
    GTEST_SKIP() << "a GPU is present (" << s.text << "): checked that host pointers are rejected instead";
  }
  const std::string want = "no usable CUDA GPU";
  EXPECT_TRUE(FailsWith(fp8proj_quantize_weight(host_bytes, 128, 128, host_bytes, sc, nullptr), want));
  EXPECT_TRUE(FailsWith(fp8proj_quantize_activation(host_bytes, 128, 4, 128, host_bytes, sc, 4, nullptr), want));
  EXPECT_TRUE(FailsWith(fp8proj_rmsnorm_quantize(host_bytes, 128, host_bytes, 1e-6f, 4, 128, host_bytes, sc, 4,
                                                 nullptr),
                        want));
  EXPECT_TRUE(FailsWith(fp8proj_projection_create(host_bytes, 128, 128, nullptr, &p), want));
  EXPECT_EQ(p, nullptr);
  fp8proj_fp8_gemm* g = nullptr;
  EXPECT_TRUE(FailsWith(fp8proj_fp8_gemm_create(host_bytes, sc, 128, 128, 16, nullptr, &g), "no usable CUDA GPU"));
}

}  // namespace
