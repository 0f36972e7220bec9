// The device-fault latch (core/device_fault.hpp) and the watchdog's host side
// (gemm/sm90_watchdog.hpp) without a GPU: the latch is closed with a synthetic text through the
// test seam (core/device_testing.hpp), or by CUDA_CHECK fed a sticky error code, and every
// entry point that would use the GPU must then throw that text before doing anything -- the
// C ABI (compiled into this binary, so that it shares the latch) returns -1 with it. The real
// faults and the real hang run on the GPU: tests/gpu/test_faults.py.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/device_fault.hpp"
#include "core/device_testing.hpp"
#include "env_guard.hpp"
#include "fp8proj/c_api.h"
#include "fp8proj/device.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/memory.hpp"
#include "fp8proj/mla.hpp"
#include "fp8proj/ops.hpp"
#include "fp8proj/projection.hpp"
#include "gemm/sm90_watchdog.hpp"

#if FP8PROJ_WITH_CUDA
#include "core/cuda_check.hpp"
#endif

namespace fp8proj {
namespace {

constexpr const char* kLatched = "the CUDA context is unusable after an earlier error: ";

// Every test starts and ends with the latch open and no detail hook: other tests of this binary
// run device-free code in the same process.
class DeviceFault : public ::testing::Test {
 protected:
  void SetUp() override { reset(); }
  void TearDown() override { reset(); }
  static void reset() {
    reset_device_fault_for_testing();
    set_device_fault_detail(nullptr);
  }
};

// fn() must throw fp8proj::Error carrying the latched text.
template <class F>
void expect_latched(const std::string& text, F&& fn, const char* what) {
  try {
    fn();
    ADD_FAILURE() << what << " returned normally after the latch closed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::string(kLatched) + text), std::string::npos) << what << ": " << e.what();
  }
}

TEST_F(DeviceFault, OpenLatchCostsNothingAndSaysNothing) {
  EXPECT_NO_THROW(check_device_usable());
  EXPECT_EQ(device_fault(), nullptr);
  EXPECT_EQ(device_fault_text(), "");
  EXPECT_EQ(fp8proj_device_fault(), nullptr);
}

TEST_F(DeviceFault, FirstTextWinsAndEveryCheckThrowsIt) {
  EXPECT_EQ(latch_device_fault("CUDA error X in f() [src/a.cu:1]"), "CUDA error X in f() [src/a.cu:1]");
  EXPECT_EQ(latch_device_fault("CUDA error Y in g() [src/b.cu:2]"), "CUDA error X in f() [src/a.cu:1]");
  EXPECT_EQ(device_fault_text(), "CUDA error X in f() [src/a.cu:1]");
  try {
    check_device_usable();
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "fp8proj: the CUDA context is unusable after an earlier error: CUDA error X in f() [src/a.cu:1]; "
                 "restart the process");
  }
  ASSERT_NE(fp8proj_device_fault(), nullptr);
  EXPECT_STREQ(fp8proj_device_fault(), "CUDA error X in f() [src/a.cu:1]");
}

TEST_F(DeviceFault, DetailHookIsAppendedOnce) {
  set_device_fault_detail([] { return std::string("watchdog: sm90_fp8_gemm m128n128_ws2_st5 (...)"); });
  EXPECT_EQ(latch_device_fault("CUDA error Z"), "CUDA error Z; watchdog: sm90_fp8_gemm m128n128_ws2_st5 (...)");
  set_device_fault_detail([] { return std::string(); });  // nothing to add: no "; "
  reset_device_fault_for_testing();
  EXPECT_EQ(latch_device_fault("CUDA error W"), "CUDA error W");
}

TEST_F(DeviceFault, HostWorkIsUnaffected) {
  latch_device_fault("CUDA error H");
  // A CPU layer never touches the GPU: it keeps running.
  const int64_t n = 128, k = 128, m = 4;
  std::vector<bf16> w(n * k, float_to_bf16(0.01f)), x(m * k, float_to_bf16(1.0f)), y(m * n);
  ProjectionOptions o;
  o.apply_env = false;
  ProjectionLayer host(MemorySpace::host, w.data(), n, k, o);
  EXPECT_NO_THROW(host.forward(x.data(), m, y.data()));
  EXPECT_NEAR(bf16_to_float(y[0]), 1.28f, 0.01f);
  Buffer b(MemorySpace::host, 64);  // host allocations too
  EXPECT_EQ(b.bytes(), 64u);
}

TEST_F(DeviceFault, DeviceEntryPointsThrowBeforeAnyWork) {
  const std::string text = "CUDA error cudaErrorIllegalAddress (synthetic) in k() [src/x.cu:9]";
  latch_device_fault(text);
  std::vector<bf16> w(256 * 256), x(64 * 256);
  std::vector<uint8_t> values(64 * 256);
  std::vector<float> scales(2 * 64);
  // Host pointers on purpose: the latch is checked before the arguments are looked at.
  expect_latched(text, [&] { Buffer b(MemorySpace::device, 1024); }, "Buffer(device)");
  expect_latched(text, [&] { copy_bytes(values.data(), MemorySpace::device, x.data(), MemorySpace::host, 16); },
                 "copy_bytes to the device");
  expect_latched(text, [&] { ProjectionLayer l(MemorySpace::device, w.data(), 256, 256); }, "ProjectionLayer(device)");
  expect_latched(text, [&] { ActivationWorkspace ws(MemorySpace::device, 64, 256, true); }, "ActivationWorkspace");
  MlaConfig c = MlaConfig::preset("deepseek-v2-lite");
  expect_latched(text, [&] { MlaBlock b(MemorySpace::device, c, uint64_t{1}); }, "MlaBlock(device)");
#if FP8PROJ_WITH_CUDA
  const QuantOps& ops = quant_ops(MemorySpace::device);
  const Fp8ActivationOut out{values.data(), scales.data(), 64, 256, 64};
  expect_latched(text, [&] { ops.quantize_activation(x.data(), 64, 256, out, nullptr); }, "quantize_activation");
  expect_latched(text, [&] { ops.quantize_activation(x.data(), 0, 256, out, nullptr); }, "quantize_activation M=0");
  expect_latched(text, [&] { ops.rmsnorm(x.data(), 256, w.data(), 1e-6f, 64, 256, x.data(), nullptr); }, "rmsnorm");
  expect_latched(text, [&] { ops.synchronize(nullptr); }, "QuantOps::synchronize");
#endif
}

TEST_F(DeviceFault, CApiReturnsMinusOneWithTheText) {
  const std::string text = "CUDA error cudaErrorLaunchFailure (synthetic) in s() [src/y.cu:3]";
  latch_device_fault(text);
  std::vector<uint8_t> buf(1 << 16);
  float scales[128] = {};
  auto expect_minus_one = [&](int rc, const char* what) {
    EXPECT_EQ(rc, -1) << what;
    EXPECT_NE(std::string(fp8proj_last_error()).find(std::string(kLatched) + text), std::string::npos)
        << what << ": " << fp8proj_last_error();
  };
  expect_minus_one(fp8proj_quantize_activation(buf.data(), 256, 0, 256, buf.data(), scales, 4, nullptr),
                   "quantize_activation m=0");
  expect_minus_one(fp8proj_rmsnorm_quantize(buf.data(), 256, buf.data(), 1e-6f, 4, 256, buf.data(), scales, 4,
                                            nullptr),
                   "rmsnorm_quantize");
  expect_minus_one(fp8proj_quantize_weight(buf.data(), 128, 128, buf.data(), scales, nullptr), "quantize_weight");
  expect_minus_one(fp8proj_fp8_gemm_run(nullptr, buf.data(), scales, 4, 4, buf.data(), nullptr), "fp8_gemm_run");
  expect_minus_one(fp8proj_projection_forward(nullptr, buf.data(), 4, buf.data(), nullptr), "projection_forward");
  fp8proj_fp8_gemm* g = reinterpret_cast<fp8proj_fp8_gemm*>(&buf);  // must be cleared, not left dangling
  expect_minus_one(fp8proj_fp8_gemm_create(buf.data(), scales, 128, 128, 64, nullptr, &g), "fp8_gemm_create");
  EXPECT_EQ(g, nullptr);
  fp8proj_projection* p = reinterpret_cast<fp8proj_projection*>(&buf);
  expect_minus_one(fp8proj_projection_create(buf.data(), 128, 128, nullptr, &p), "projection_create");
  EXPECT_EQ(p, nullptr);
  fp8proj_workspace* ws = reinterpret_cast<fp8proj_workspace*>(&buf);
  expect_minus_one(fp8proj_workspace_create(64, 128, 0, &ws), "workspace_create");
  EXPECT_EQ(ws, nullptr);
  // Host-only calls keep answering.
  fp8proj_projection_options o;
  EXPECT_EQ(fp8proj_projection_options_init(&o), 0);
  int ok = -1;
  char name[128];
  EXPECT_EQ(fp8proj_device_status(&ok, name, sizeof name), 0);
}

#if FP8PROJ_WITH_CUDA
TEST_F(DeviceFault, StickyErrorCodes) {
  for (cudaError_t e : {cudaErrorIllegalAddress, cudaErrorLaunchTimeout, cudaErrorAssert, cudaErrorHardwareStackError,
                        cudaErrorIllegalInstruction, cudaErrorMisalignedAddress, cudaErrorInvalidAddressSpace,
                        cudaErrorInvalidPc, cudaErrorLaunchFailure, cudaErrorTensorMemoryLeak, cudaErrorContained,
                        cudaErrorMpsClientTerminated, cudaErrorExternalDevice, cudaErrorECCUncorrectable,
                        cudaErrorNvlinkUncorrectable})
    EXPECT_TRUE(cuda_error_is_sticky(e)) << cudaGetErrorName(e);
  for (cudaError_t e : {cudaSuccess, cudaErrorMemoryAllocation, cudaErrorInvalidValue, cudaErrorNotReady,
                        cudaErrorNoDevice, cudaErrorLaunchOutOfResources, cudaErrorStreamCaptureUnsupported})
    EXPECT_FALSE(cuda_error_is_sticky(e)) << cudaGetErrorName(e);
}

TEST_F(DeviceFault, CudaCheckLatchesStickyErrorsOnly) {
  // A non-sticky error is an ordinary error: the latch stays open.
  try {
    CUDA_CHECK(cudaErrorMemoryAllocation);
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA error cudaErrorMemoryAllocation"), std::string::npos) << e.what();
  }
  EXPECT_EQ(device_fault(), nullptr);
  // A sticky one closes it with the call, its location and the detail hook's report.
  set_device_fault_detail([] { return std::string("watchdog: test report"); });
  try {
    CUDA_CHECK(cudaErrorIllegalAddress);
    FAIL() << "no throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("fp8proj: CUDA error cudaErrorIllegalAddress ("), std::string::npos) << what;
    EXPECT_NE(what.find(") in cudaErrorIllegalAddress [tests/cpu/device_fault_test.cpp:"), std::string::npos) << what;
    EXPECT_NE(what.find("; watchdog: test report -- a sticky error: the CUDA context is unusable; restart the process"),
              std::string::npos)
        << what;
  }
  ASSERT_NE(device_fault(), nullptr);
  const std::string first = *device_fault();
  EXPECT_EQ(first.find("CUDA error cudaErrorIllegalAddress"), 0u) << first;
  // Seen again (a path that did not check the latch first): the first fault's text, not this one's.
  expect_latched(first, [] { CUDA_CHECK(cudaErrorLaunchFailure); }, "a second sticky CUDA_CHECK");
  expect_latched(first, [] { check_device_usable(); }, "check_device_usable()");
  EXPECT_EQ(*device_fault(), first);
}

TEST_F(DeviceFault, CublasErrorWithoutDeadContextIsOrdinary) {
  // No GPU here (or a healthy one): sticky_cuda_error_now() finds nothing, the latch stays open.
  EXPECT_THROW(CUBLAS_CHECK(CUBLAS_STATUS_EXECUTION_FAILED), Error);
  EXPECT_EQ(device_fault(), nullptr);
}
#endif

TEST(Watchdog, ConfigWordRoundTrips) {
  sm90::WatchdogConfig c;
  c.kernel = sm90::kWatchdogGemm1d2d;
  c.block_m = 256;
  c.block_n = 192;
  c.math_wgs = 2;
  c.stages = 15;
  c.cluster = 2;
  c.cluster_on_n = true;
  c.carry = true;
  c.fixed_kb = 128;
  const sm90::WatchdogConfig d = sm90::unpack_watchdog_config(sm90::pack_watchdog_config(c));
  EXPECT_EQ(d.kernel, c.kernel);
  EXPECT_EQ(d.block_m, c.block_m);
  EXPECT_EQ(d.block_n, c.block_n);
  EXPECT_EQ(d.math_wgs, c.math_wgs);
  EXPECT_EQ(d.stages, c.stages);
  EXPECT_EQ(d.cluster, c.cluster);
  EXPECT_EQ(d.cluster_on_n, c.cluster_on_n);
  EXPECT_EQ(d.carry, c.carry);
  EXPECT_EQ(d.fixed_kb, c.fixed_kb);
}

TEST(Watchdog, ReportNamesTheConfigurationAndTheStuckBarrier) {
  sm90::WatchdogConfig c;
  c.kernel = sm90::kWatchdogGemm1d2d;
  c.block_m = 128;
  c.block_n = 192;
  c.math_wgs = 2;
  c.stages = 4;
  sm90::WatchdogRecord r{};
  r.magic = sm90::kWatchdogMagic;
  r.config = sm90::pack_watchdog_config(c);
  r.m = 777;
  r.n = 24576;
  r.k = 1536;
  r.split_k = 1;
  r.block = 17;
  // full[0], full[1] have completed one phase more than full[2], full[3]: full[2] is next, and
  // its current phase has parity 0. Every empty barrier agrees: empty[0] is next.
  r.full_parity = 0b0011;
  r.empty_parity = 0b1111;
  r.waited_ns = 10'000'400'000ull;
  EXPECT_EQ(sm90::format_watchdog_record(r, 10'000'000'000ull),
            "watchdog: sm90_fp8_gemm m128n192_ws2_st4 (M=777 N=24576 K=1536) block 17: no pipeline barrier completed "
            "a phase for 10.0 s; next: full[2] parity 0, empty[0] parity 1 (phase parities full 1100, empty 1111; "
            "FP8PROJ_WATCHDOG_MS=10000)");
  c.cluster = 2;
  c.cluster_on_n = true;
  c.fixed_kb = 12;
  r.config = sm90::pack_watchdog_config(c);
  r.full_parity = 0;
  r.empty_parity = 0b1000;
  r.waited_ns = 201'000'000ull;
  EXPECT_EQ(sm90::format_watchdog_record(r, 200'000'000ull),
            "watchdog: sm90_fp8_gemm m128n192_ws2_st4_mcn2 compiled for K=1536 (M=777 N=24576 K=1536) block 17: no "
            "pipeline barrier completed a phase for 201 ms; next: full[0] parity 0, empty[3] parity 1 (phase parities "
            "full 0000, empty 0001; FP8PROJ_WATCHDOG_MS=200)");
  sm90::WatchdogConfig s;
  s.kernel = sm90::kWatchdogSwapAB;
  s.block_m = 16;
  s.block_n = 128;
  s.math_wgs = 2;
  s.stages = 11;
  sm90::WatchdogRecord q{};
  q.config = sm90::pack_watchdog_config(s);
  q.split_k = 4;
  q.m = 5;
  q.n = 4096;
  q.k = 2048;
  q.waited_ns = 3'000'000'000ull;
  EXPECT_NE(sm90::format_watchdog_record(q, 1'000'000'000ull).find("sm90_fp8_gemm swapab_m16n128_ws2_st11_sk4 (M=5 "),
            std::string::npos);
}

TEST(Watchdog, TimeoutKnob) {
  {
    testing::EnvGuard g("FP8PROJ_WATCHDOG_MS", nullptr);
    EXPECT_EQ(sm90::watchdog_timeout_ns_from_env(), 0u);  // default off (its kernels cost 2.6%)
  }
  {
    testing::EnvGuard g("FP8PROJ_WATCHDOG_MS", "0");
    EXPECT_EQ(sm90::watchdog_timeout_ns_from_env(), 0u);  // off
  }
  {
    testing::EnvGuard g("FP8PROJ_WATCHDOG_MS", "200");
    EXPECT_EQ(sm90::watchdog_timeout_ns_from_env(), 200'000'000ull);
  }
  for (const char* bad : {"-1", "1.5", "10s", "+5", "604800001", "0x10", " 5"}) {
    testing::EnvGuard g("FP8PROJ_WATCHDOG_MS", bad);
    try {
      sm90::watchdog_timeout_ns_from_env();
      ADD_FAILURE() << "accepted FP8PROJ_WATCHDOG_MS=" << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("FP8PROJ_WATCHDOG_MS"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace fp8proj
