// Every device GEMM backend against the fp64 oracle (include/fp8proj/reference.hpp):
//   FP8 block-scaled backends: relative Frobenius error <= kFp8GemmRelTol against the fp64
//     product of the *dequantized* operands (so only the GEMM's own error is measured: fp32
//     accumulation plus the bf16 rounding of the output);
//   cublaslt_bf16: <= kBf16GemmRelTol against the fp64 product of its bf16 operands.
// The output is poisoned with 0xff bytes (bf16 NaN) before each run and every element must come
// back finite, so an element the backend never writes cannot pass. Also: M = 0 is a no-op, and
// null or misaligned pointers throw. Backends that are not registered or cannot run here skip
// with the registry's reason (the sm90_fp8_block backend is picked up as soon as it registers).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/gemm/sm90_fp8_gemm.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/gemm.hpp"
#include "fp8proj/ops.hpp"
#include "fp8proj/quantize.hpp"
#include "fp8proj/reference.hpp"
#include "fp8proj/timing.hpp"
#include "gpu_test_util.hpp"

namespace fp8proj {
namespace {

using testing::GpuTest;
using testing::poisoned;
using testing::to_device;
using testing::to_host;

struct Mnk {
  int64_t m, n, k;
};
void PrintTo(const Mnk& s, std::ostream* os) { *os << s.m << "x" << s.n << "x" << s.k; }  // test names

// The backend, or a skip naming why it is not usable here.
const GemmBackend* backend_or_skip_reason(const std::string& name, std::string& reason) {
  if (const GemmBackend* b = find_backend(name)) return b;
  reason = name + " is not registered in this build";
  for (const auto& [n, why] : backend_status())
    if (n == name) reason = name + " is unavailable: " + why;
  return nullptr;
}

int64_t count_non_finite(const std::vector<bf16>& y) {
  int64_t n = 0;
  for (const bf16 v : y) n += std::isfinite(bf16_to_float(v)) ? 0 : 1;
  return n;
}

// ---- FP8 block-scaled backends --------------------------------------------------------------

const std::vector<std::string> kFp8Backends = {"cublaslt_fp8_block", "sm90_fp8_block"};
// M: decode sizes (1, 5 and 8 straddle cuBLASLt's 8-row multiple), odd and prefill sizes.
// K/128 = 3 and 5 exercise cuBLASLt's padded weight-scale stride. Every case has >= 2048
// outputs: the Frobenius norm of the bf16 rounding alone comes within 3% of the 2e-3 bound on
// a few hundred outputs dominated by a handful of large ones (seen on an H200: 2.15e-3 for
// 1x256x512, all of it rounding and the fp32-promoted accumulation).
// N not a multiple of 128 (the last 128-row weight block partial): fused_qkv_a of GLM-5
// (2624 x 6144) and DeepSeek-V3 (2112 x 7168), kv_a's 576, and N = 16, 32, 64, 96 (mod 128).
// cuBLASLt skips them with its unsupported_reason.
const std::vector<Mnk> kFp8Shapes = {{1, 2048, 512},    {5, 2048, 384},  {8, 2048, 1536},  {64, 4096, 1024},
                                     {100, 2048, 640},  {257, 384, 2048}, {1024, 256, 512}, {33, 256, 384},
                                     {1, 2624, 6144},   {37, 2624, 6144}, {300, 2624, 6144}, {16, 2112, 7168},
                                     {200, 2112, 7168}, {9, 576, 512},    {700, 576, 512},  {64, 1040, 1024},
                                     {130, 800, 768},   {513, 1088, 512}, {3, 1376, 1024}};

class Fp8GemmGpu : public GpuTest, public ::testing::WithParamInterface<std::tuple<std::string, Mnk>> {};

TEST_P(Fp8GemmGpu, MatchesFp64OfDequantizedOperands) {
  const auto& [name, shape] = GetParam();
  const auto [m, n, k] = shape;
  std::string reason;
  const GemmBackend* backend = backend_or_skip_reason(name, reason);
  if (!backend) GTEST_SKIP() << reason;
  if (const std::string why = backend->unsupported_reason(n, k); !why.empty()) GTEST_SKIP() << why;

  // Four extra leading rows: the plan also runs on a sub-view (rows 4..4+m, scales + 4, the parent's
  // scale stride), the way ProjectionLayer::forward_quantized chunks a caller's activations.
  const int64_t lead = 4;
  const auto w = testing::normal_rows_bf16(n, k, uint32_t(n + k), 0.05f);
  const auto x = testing::normal_rows_bf16(m + lead, k, uint32_t(m * 3 + k));
  HostFp8Weight qw = make_host_fp8_weight(n, k);
  cpu::quantize_weight(w.data(), n, k, qw.out());
  HostFp8Activation qx = make_host_fp8_activation(m, k), qbig = make_host_fp8_activation(m + lead, k);
  cpu::quantize_activation(x.data() + lead * k, m, k, qx.out());
  cpu::quantize_activation(x.data(), m + lead, k, qbig.out());
  const std::vector<double> ref = cpu::gemm_f64(cpu::dequantize(qx.view()).data(), cpu::dequantize(qw.view()).data(), m, n, k);

  Buffer dw_values = to_device(qw.values), dw_scales = to_device(qw.scales);
  Buffer dx_values = to_device(qx.values), dx_scales = to_device(qx.scales);
  Buffer dbig_values = to_device(qbig.values), dbig_scales = to_device(qbig.scales);
  GemmPlanOptions options;
  options.max_m = m + lead;
  const auto plan = backend->plan_fp8({dw_values.data<uint8_t>(), dw_scales.data<float>(), n, k}, options);
  std::printf("[%s] M=%ld N=%ld K=%ld: %s\n", name.c_str(), long(m), long(n), long(k), plan->describe(m).c_str());

  const Fp8ActivationView views[] = {
      {dx_values.data<uint8_t>(), dx_scales.data<float>(), m, k, qx.scale_ld},
      {dbig_values.data<uint8_t>() + lead * k, dbig_scales.data<float>() + lead, m, k, qbig.scale_ld},
  };
  for (const Fp8ActivationView& view : views) {
    const std::string what = view.scale_ld == qx.scale_ld ? "whole tensor" : "sub-view";
    Buffer y = poisoned(static_cast<size_t>(m * n) * sizeof(bf16));
    plan->run(view, y.data<bf16>(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = to_host<bf16>(y.data(), static_cast<size_t>(m * n));
    EXPECT_EQ(count_non_finite(got), 0) << what << ": outputs left unwritten (NaN poison) or not finite";
    const ErrorStats e = compare(got.data(), ref.data(), m * n);
    EXPECT_LE(e.rel_frobenius, kFp8GemmRelTol) << what << ": max abs error " << e.max_abs;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, Fp8GemmGpu, ::testing::Combine(::testing::ValuesIn(kFp8Backends), ::testing::ValuesIn(kFp8Shapes)),
                         [](const auto& info) {
                           const Mnk s = std::get<1>(info.param);
                           return std::get<0>(info.param) + "_" + std::to_string(s.m) + "x" + std::to_string(s.n) +
                                  "x" + std::to_string(s.k);
                         });

class Fp8GemmGpuArgs : public GpuTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(Fp8GemmGpuArgs, EmptyBatchIsNoOpAndBadPointersThrow) {
  std::string reason;
  const GemmBackend* backend = backend_or_skip_reason(GetParam(), reason);
  if (!backend) GTEST_SKIP() << reason;
  const int64_t m = 16, n = 256, k = 256;
  Buffer wv = poisoned(n * k, 0), ws(MemorySpace::device, 16 * sizeof(float));
  fill_bytes(MemorySpace::device, ws.data(), ws.bytes(), 0);  // zero scales: a finite product
  Buffer xv = poisoned(m * k + 64, 0), xs(MemorySpace::device, (k / 128) * m * sizeof(float) + 64);
  fill_bytes(MemorySpace::device, xs.data(), xs.bytes(), 0);
  EXPECT_THROW(backend->plan_fp8({nullptr, ws.data<float>(), n, k}, {}), Error);
  const auto plan = backend->plan_fp8({wv.data<uint8_t>(), ws.data<float>(), n, k}, {});

  Buffer y = poisoned(m * n * sizeof(bf16) + 64);
  EXPECT_NO_THROW(plan->run({nullptr, nullptr, 0, k, 0}, nullptr, nullptr));
  EXPECT_NO_THROW(plan->run({xv.data<uint8_t>(), xs.data<float>(), 0, k, 0}, y.data<bf16>(), nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(count_non_finite(to_host<bf16>(y.data(), m * n)), m * n) << "M = 0 wrote to the output";

  const Fp8ActivationView x{xv.data<uint8_t>(), xs.data<float>(), m, k, m};
  EXPECT_THROW(plan->run({nullptr, xs.data<float>(), m, k, m}, y.data<bf16>(), nullptr), Error);
  EXPECT_THROW(plan->run({xv.data<uint8_t>(), nullptr, m, k, m}, y.data<bf16>(), nullptr), Error);
  EXPECT_THROW(plan->run(x, nullptr, nullptr), Error);
  EXPECT_THROW(plan->run(x, y.data<bf16>() + 1, nullptr), Error);                                 // 2-byte offset
  EXPECT_THROW(plan->run({xv.data<uint8_t>() + 8, xs.data<float>(), m, k, m}, y.data<bf16>(), nullptr), Error);
  EXPECT_THROW(plan->run({xv.data<uint8_t>(), xs.data<float>(), m, k, m - 1}, y.data<bf16>(), nullptr), Error);
  EXPECT_THROW(plan->run({xv.data<uint8_t>(), xs.data<float>(), m, k + 128, m}, y.data<bf16>(), nullptr), Error);
}

INSTANTIATE_TEST_SUITE_P(Backends, Fp8GemmGpuArgs, ::testing::ValuesIn(kFp8Backends));

// ---- one sm90 configuration, forced ---------------------------------------------------------

// One sm90 configuration, forced, against the fp64 oracle (poisoned output: every element
// written and finite) and bitwise equal over two runs.
void expect_sm90_config_exact(const std::string& config, int64_t m, int64_t n, int64_t k) {
  const DeviceInfo& dev = current_device();
  const sm90::Problem p{m, n, k, dev.sm_count};
  const sm90::Config cfg = sm90::forced(config, p);

  const auto w = testing::normal_rows_bf16(n, k, uint32_t(5 * n + k), 0.05f);
  const auto x = testing::normal_rows_bf16(m, k, uint32_t(11 * m + k));
  HostFp8Weight qw = make_host_fp8_weight(n, k);
  cpu::quantize_weight(w.data(), n, k, qw.out());
  HostFp8Activation qx = make_host_fp8_activation(m, k);
  cpu::quantize_activation(x.data(), m, k, qx.out());
  const std::vector<double> ref =
      cpu::gemm_f64(cpu::dequantize(qx.view()).data(), cpu::dequantize(qw.view()).data(), m, n, k);

  Buffer dw_values = to_device(qw.values), dw_scales = to_device(qw.scales);
  Buffer dx_values = to_device(qx.values), dx_scales = to_device(qx.scales);
  std::vector<bf16> first;
  for (int run = 0; run < 2; ++run) {
    Buffer y = poisoned(static_cast<size_t>(m * n) * sizeof(bf16));
    const sm90::Fp8GemmArgs args{m, n, k, dx_values.data<uint8_t>(), dx_scales.data<float>(), qx.scale_ld,
                                 dw_values.data<uint8_t>(), dw_scales.data<float>(), y.data()};
    sm90::run(args, cfg, nullptr, 0, dev.sm_count, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = to_host<bf16>(y.data(), static_cast<size_t>(m * n));
    if (run == 0) {
      first = got;
      EXPECT_EQ(count_non_finite(got), 0) << "outputs left unwritten (NaN poison) or not finite";
      const ErrorStats e = compare(got.data(), ref.data(), m * n);
      EXPECT_LE(e.rel_frobenius, kFp8GemmRelTol) << "max abs error " << e.max_abs;
    } else {
      EXPECT_EQ(std::memcmp(got.data(), first.data(), got.size() * sizeof(bf16)), 0) << "run " << run << " differs";
    }
  }
}

// ---- the sm90 kernels compiled for one K ----------------------------------------------------

// m256n128_ws2_st3, m128n192_ws2_st4 and m128n192_ws2_st4_c also exist compiled for K = 1536,
// 2048 and 4096 (kernels::FixedK), which sm90::run picks by k: each against the fp64 oracle
// (poisoned output: every element written, M a tail of every tile height, 128 x 192 tiles
// straddling B-scale blocks) and bitwise equal over two runs.
class Sm90CompiledKGpu : public GpuTest, public ::testing::WithParamInterface<std::tuple<std::string, int64_t>> {};

TEST_P(Sm90CompiledKGpu, MatchesFp64AndRepeatsBitwise) {
  const DeviceInfo& dev = current_device();
  if (dev.cc_major != 9 || dev.cc_minor != 0) GTEST_SKIP() << "the sm90 kernels need an sm_90 GPU, this is " << dev.arch();
  const auto& [config, k] = GetParam();
  expect_sm90_config_exact(config, 333, 768, k);
}

INSTANTIATE_TEST_SUITE_P(Configs, Sm90CompiledKGpu,
                         ::testing::Combine(::testing::Values("m256n128_ws2_st3", "m128n192_ws2_st4", "m128n192_ws2_st4_c"),
                                            ::testing::Values(int64_t{1536}, int64_t{2048}, int64_t{4096})),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_k" + std::to_string(std::get<1>(info.param));
                         });

// ---- a last N block mostly past N -----------------------------------------------------------

// A wide tile's last N block with at most 64 of its columns inside N: TMA zero-fills the rows
// past N, the MMAs run on them, the store clips them. 192-wide tiles at N = 640 (3 x 192 + 64;
// K = 2048 also runs the kernel compiled for that K), 160 at N = 512 (+ 32), 96 / 112 at N =
// 2048 (+ 32) and 4096 (112: + 64), 2-CTA clusters along M (the pair shares the partial B
// tile) and along N (N = 640 with 96: the pair's second tile lies wholly past N).
class Sm90PartialLastNBlockGpu : public GpuTest,
                                 public ::testing::WithParamInterface<std::tuple<std::string, int64_t, int64_t>> {};

TEST_P(Sm90PartialLastNBlockGpu, MatchesFp64AndRepeatsBitwise) {
  const DeviceInfo& dev = current_device();
  if (dev.cc_major != 9 || dev.cc_minor != 0) GTEST_SKIP() << "the sm90 kernels need an sm_90 GPU, this is " << dev.arch();
  const auto& [config, n, k] = GetParam();
  expect_sm90_config_exact(config, 333, n, k);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, Sm90PartialLastNBlockGpu,
    ::testing::Values(std::tuple<std::string, int64_t, int64_t>{"m128n192_ws2_st4", 640, 1024},
                      std::tuple<std::string, int64_t, int64_t>{"m128n192_ws2_st4", 640, 2048},
                      std::tuple<std::string, int64_t, int64_t>{"m128n160_ws2_st5", 512, 1024},
                      std::tuple<std::string, int64_t, int64_t>{"m128n96_ws2_st7", 2048, 512},
                      std::tuple<std::string, int64_t, int64_t>{"m128n112_ws2_st6", 2048, 512},
                      std::tuple<std::string, int64_t, int64_t>{"m128n112_ws2_st6", 4096, 256},
                      std::tuple<std::string, int64_t, int64_t>{"m128n192_ws2_st4_mc2", 640, 1024},
                      std::tuple<std::string, int64_t, int64_t>{"m128n160_ws2_st5_mc2", 512, 1024},
                      std::tuple<std::string, int64_t, int64_t>{"m128n96_ws2_st7_mcn2", 640, 1024},
                      std::tuple<std::string, int64_t, int64_t>{"m128n192_ws2_st4_mcn2", 640, 1024},
                      // N % 128 != 0 through the kernels compiled for one K (kernels::FixedK)
                      std::tuple<std::string, int64_t, int64_t>{"m256n128_ws2_st3", 2112, 1536},
                      std::tuple<std::string, int64_t, int64_t>{"m128n192_ws2_st4", 2624, 2048},
                      std::tuple<std::string, int64_t, int64_t>{"m128n192_ws2_st4_c", 576, 4096}),
    [](const auto& info) {
      return std::get<0>(info.param) + "_n" + std::to_string(std::get<1>(info.param)) + "_k" +
             std::to_string(std::get<2>(info.param));
    });

// ---- N not a multiple of 128, every configuration --------------------------------------------

// Every configuration of the family (and split-K for the swap-AB tiles), forced, at N
// with a partial last 128-row weight block: N = 2624 (GLM-5 fused_qkv_a), 576 (kv_a), 272, 800,
// 1088, 1376 (16, 32, 64, 96 mod 128), K = 512. The output buffer is y [M, N] (ld N: the API has
// no output stride) followed by a guard region, all poisoned: every element must be written,
// finite and within the oracle bound (Frobenius and per element: a stray write of a column >= N
// lands on the next row's first columns, or, from row M - 1, in the guard), the guard must keep
// its poison bytes, and a second run must be bitwise equal.
struct NTailCase {
  std::string config;
  int64_t n;
};
void PrintTo(const NTailCase& c, std::ostream* os) { *os << c.config << "_n" << c.n; }

std::vector<NTailCase> n_tail_cases() {
  std::vector<NTailCase> out;
  std::vector<sm90::Config> configs = sm90::kernel_family();
  for (const sm90::Config& c : sm90::kernel_family())
    if (c.kind == sm90::KernelKind::kSwapAB) {
      sm90::Config split = c;
      split.split_k = 4;
      configs.push_back(split);
      // 64-row tiles: at K = 512, 4 splits leave warpgroup 1 without a K block; 2 give each
      // warpgroup one per split.
      if (sm90::swap_ab_k_split(c.kind, c.block_n)) {
        split.split_k = 2;
        configs.push_back(split);
      }
    }
  for (const sm90::Config& c : configs)
    for (int64_t n : {2624, 576, 272, 800, 1088, 1376}) out.push_back({c.name(), n});
  return out;
}

class Sm90NTailGpu : public GpuTest, public ::testing::WithParamInterface<NTailCase> {};

TEST_P(Sm90NTailGpu, WritesNothingPastNAndMatchesFp64) {
  const DeviceInfo& dev = current_device();
  if (dev.cc_major != 9 || dev.cc_minor != 0) GTEST_SKIP() << "the sm90 kernels need an sm_90 GPU, this is " << dev.arch();
  const std::string config = GetParam().config;
  const int64_t n = GetParam().n, k = 512;
  const sm90::Config parsed = sm90::Config::parse(config);
  // M: a tail of every tile height; the swap-AB tiles at decode sizes (two token tiles of 16).
  const int64_t m = parsed.kind == sm90::KernelKind::kGemm1d2d ? 333
                    : sm90::swap_ab_k_split(parsed.kind, parsed.block_n) ? 13 : 27;
  const sm90::Problem p{m, n, k, dev.sm_count};
  const sm90::Config cfg = sm90::forced(config, p);

  const auto w = testing::normal_rows_bf16(n, k, uint32_t(7 * n + k), 0.05f);
  const auto x = testing::normal_rows_bf16(m, k, uint32_t(13 * m + k));
  HostFp8Weight qw = make_host_fp8_weight(n, k);
  cpu::quantize_weight(w.data(), n, k, qw.out());
  ASSERT_EQ(qw.scales.size(), static_cast<size_t>(ceil_div(n, 128) * (k / 128))) << "one scale row per partial block";
  HostFp8Activation qx = make_host_fp8_activation(m, k);
  cpu::quantize_activation(x.data(), m, k, qx.out());
  const std::vector<double> ref =
      cpu::gemm_f64(cpu::dequantize(qx.view()).data(), cpu::dequantize(qw.view()).data(), m, n, k);
  double rms = 0;
  for (double v : ref) rms += v * v;
  rms = std::sqrt(rms / static_cast<double>(ref.size()));

  Buffer dw_values = to_device(qw.values), dw_scales = to_device(qw.scales);
  Buffer dx_values = to_device(qx.values), dx_scales = to_device(qx.scales);
  const size_t ws_bytes = sm90::workspace_bytes(cfg, m, n, k);
  Buffer ws(MemorySpace::device, std::max<size_t>(ws_bytes, 16));
  fill_bytes(MemorySpace::device, ws.data(), ws.bytes(), 0);
  const int64_t guard = 256 * 128;  // bf16 elements after y: two 128-row tiles of 128 columns
  const int64_t total = m * n + guard;
  std::vector<bf16> first;
  for (int run = 0; run < 2; ++run) {
    Buffer y = poisoned(static_cast<size_t>(total) * sizeof(bf16));
    const sm90::Fp8GemmArgs args{m, n, k, dx_values.data<uint8_t>(), dx_scales.data<float>(), qx.scale_ld,
                                 dw_values.data<uint8_t>(), dw_scales.data<float>(), y.data()};
    sm90::run(args, cfg, ws_bytes ? ws.data() : nullptr, ws_bytes, dev.sm_count, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto all = to_host<bf16>(y.data(), static_cast<size_t>(total));
    const std::vector<bf16> got(all.begin(), all.begin() + m * n);
    int64_t guard_hit = 0;
    for (int64_t i = m * n; i < total; ++i) guard_hit += all[i].bits != 0xffff ? 1 : 0;
    EXPECT_EQ(guard_hit, 0) << "wrote past row M - 1 / column N into the guard region";
    if (run == 0) {
      first = got;
      EXPECT_EQ(count_non_finite(got), 0) << "outputs left unwritten (NaN poison) or not finite";
      const ErrorStats e = compare(got.data(), ref.data(), m * n);
      EXPECT_LE(e.rel_frobenius, kFp8GemmRelTol) << "max abs error " << e.max_abs;
      // Per element: the bf16 rounding (2^-9 relative) and fp32 accumulation, with room to spare;
      // a column of zeros (weight rows past N) written over a real one is off by the whole value.
      int64_t bad = 0, first_bad = -1;
      for (int64_t i = 0; i < m * n; ++i) {
        const double d = std::fabs(double(bf16_to_float(got[i])) - ref[i]);
        if (!(d <= 1e-2 * std::fabs(ref[i]) + 1e-2 * rms)) {
          if (first_bad < 0) first_bad = i;
          ++bad;
        }
      }
      EXPECT_EQ(bad, 0) << "elements off their reference; first at row " << first_bad / n << " column "
                        << first_bad % n;
    } else {
      EXPECT_EQ(std::memcmp(got.data(), first.data(), got.size() * sizeof(bf16)), 0) << "run " << run << " differs";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, Sm90NTailGpu, ::testing::ValuesIn(n_tail_cases()), [](const auto& info) {
  return info.param.config + "_n" + std::to_string(info.param.n);
});

// The heuristic's own choice at the model shapes, M from 1 to 4096 (the fp64 oracle bounds M
// here; the forced sweep above covers every tile), through the sm90 backend's plan.
class Sm90NTailHeuristicGpu : public GpuTest, public ::testing::WithParamInterface<Mnk> {};

TEST_P(Sm90NTailHeuristicGpu, ChosenConfigWritesNothingPastN) {
  const DeviceInfo& dev = current_device();
  if (dev.cc_major != 9 || dev.cc_minor != 0) GTEST_SKIP() << "the sm90 kernels need an sm_90 GPU, this is " << dev.arch();
  const auto [m, n, k] = GetParam();
  const sm90::Config cfg = sm90::choose({m, n, k, dev.sm_count});
  std::printf("[sm90 N tail] M=%ld N=%ld K=%ld: %s\n", long(m), long(n), long(k), cfg.name().c_str());
  const auto w = testing::normal_rows_bf16(n, k, uint32_t(3 * n + k), 0.05f);
  const auto x = testing::normal_rows_bf16(m, k, uint32_t(5 * m + k));
  HostFp8Weight qw = make_host_fp8_weight(n, k);
  cpu::quantize_weight(w.data(), n, k, qw.out());
  HostFp8Activation qx = make_host_fp8_activation(m, k);
  cpu::quantize_activation(x.data(), m, k, qx.out());
  // Rows of the reference for a sample of output rows only (the first and last 8 and every
  // 97th): the fp64 product of a 4096 x 2624 x 6144 problem would take minutes on the host.
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < m; ++r)
    if (r < 8 || r >= m - 8 || r % 97 == 0) rows.push_back(r);
  const std::vector<float> xa = cpu::dequantize(qx.view()), wb = cpu::dequantize(qw.view());
  std::vector<float> xs;
  for (int64_t r : rows) xs.insert(xs.end(), xa.begin() + r * k, xa.begin() + (r + 1) * k);
  const int64_t mr = static_cast<int64_t>(rows.size());
  const std::vector<double> ref = cpu::gemm_f64(xs.data(), wb.data(), mr, n, k);

  Buffer dw_values = to_device(qw.values), dw_scales = to_device(qw.scales);
  Buffer dx_values = to_device(qx.values), dx_scales = to_device(qx.scales);
  GemmPlanOptions options;
  options.max_m = m;
  const GemmBackend* backend = find_backend("sm90_fp8_block");
  ASSERT_NE(backend, nullptr) << "sm90_fp8_block is not registered on an sm_90 GPU";
  ASSERT_EQ(backend->unsupported_reason(n, k), "");
  const auto plan = backend->plan_fp8({dw_values.data<uint8_t>(), dw_scales.data<float>(), n, k}, options);
  const int64_t guard = 256 * 128;
  Buffer y = poisoned(static_cast<size_t>(m * n + guard) * sizeof(bf16));
  plan->run({dx_values.data<uint8_t>(), dx_scales.data<float>(), m, k, qx.scale_ld}, y.data<bf16>(), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto all = to_host<bf16>(y.data(), static_cast<size_t>(m * n + guard));
  int64_t guard_hit = 0;
  for (int64_t i = m * n; i < m * n + guard; ++i) guard_hit += all[i].bits != 0xffff ? 1 : 0;
  EXPECT_EQ(guard_hit, 0) << "wrote past the output into the guard region";
  EXPECT_EQ(count_non_finite(std::vector<bf16>(all.begin(), all.begin() + m * n)), 0) << "outputs left unwritten";
  std::vector<bf16> got;
  for (int64_t r : rows) got.insert(got.end(), all.begin() + r * n, all.begin() + (r + 1) * n);
  const ErrorStats e = compare(got.data(), ref.data(), mr * n);
  EXPECT_LE(e.rel_frobenius, kFp8GemmRelTol) << cfg.name() << ": max abs error " << e.max_abs;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Sm90NTailHeuristicGpu,
                         ::testing::Values(Mnk{1, 2624, 6144}, Mnk{16, 2624, 6144}, Mnk{64, 2624, 6144},
                                           Mnk{512, 2624, 6144}, Mnk{4096, 2624, 6144}, Mnk{1, 2112, 7168},
                                           Mnk{32, 2112, 7168}, Mnk{1000, 2112, 7168}, Mnk{4096, 2112, 7168},
                                           Mnk{8, 576, 7168}, Mnk{2048, 576, 6144}),
                         [](const auto& info) {
                           const Mnk s = info.param;
                           return std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
                         });

// ---- bf16 -----------------------------------------------------------------------------------

// Any N, K: fused_qkv_a's N = 2624 (not 128-aligned) runs on this backend; K = 72 and N = 200
// give rows that are 16-byte but not 256-byte aligned.
const std::vector<Mnk> kBf16Shapes = {{1, 256, 512}, {7, 200, 72}, {33, 2624, 512}, {64, 512, 1536}, {300, 384, 2048}};

class Bf16GemmGpu : public GpuTest, public ::testing::WithParamInterface<Mnk> {};

TEST_P(Bf16GemmGpu, MatchesFp64OfBf16Operands) {
  const auto [m, n, k] = GetParam();
  std::string reason;
  const GemmBackend* backend = backend_or_skip_reason("cublaslt_bf16", reason);
  if (!backend) GTEST_SKIP() << reason;
  const auto w = testing::normal_rows_bf16(n, k, uint32_t(2 * n + k), 0.05f);
  const auto x = testing::normal_rows_bf16(m, k, uint32_t(m + 5 * k));
  const std::vector<double> ref = cpu::gemm_f64(cpu::to_float(x.data(), m * k).data(), cpu::to_float(w.data(), n * k).data(), m, n, k);

  Buffer dw = to_device(w), dx = to_device(x);
  GemmPlanOptions options;
  options.max_m = m;
  const auto plan = backend->plan_bf16(dw.data<bf16>(), n, k, options);
  std::printf("[cublaslt_bf16] M=%ld N=%ld K=%ld: %s\n", long(m), long(n), long(k), plan->describe(m).c_str());
  Buffer y = poisoned(static_cast<size_t>(m * n) * sizeof(bf16));
  plan->run(dx.data<bf16>(), m, y.data<bf16>(), nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto got = to_host<bf16>(y.data(), static_cast<size_t>(m * n));
  EXPECT_EQ(count_non_finite(got), 0) << "outputs left unwritten (NaN poison) or not finite";
  const ErrorStats e = compare(got.data(), ref.data(), m * n);
  EXPECT_LE(e.rel_frobenius, kBf16GemmRelTol) << "max abs error " << e.max_abs;
}

INSTANTIATE_TEST_SUITE_P(Shapes, Bf16GemmGpu, ::testing::ValuesIn(kBf16Shapes), [](const auto& info) {
  return std::to_string(info.param.m) + "x" + std::to_string(info.param.n) + "x" + std::to_string(info.param.k);
});

class Bf16GemmGpuArgs : public GpuTest {};

TEST_F(Bf16GemmGpuArgs, EmptyBatchIsNoOpAndBadPointersThrow) {
  std::string reason;
  const GemmBackend* backend = backend_or_skip_reason("cublaslt_bf16", reason);
  if (!backend) GTEST_SKIP() << reason;
  const int64_t m = 16, n = 256, k = 256;
  Buffer w = poisoned(n * k * sizeof(bf16), 0), x = poisoned(m * k * sizeof(bf16) + 64, 0);
  EXPECT_THROW(backend->plan_bf16(nullptr, n, k, {}), Error);
  EXPECT_THROW(backend->plan_bf16(w.data<bf16>() + 1, n, k, {}), Error);
  const auto plan = backend->plan_bf16(w.data<bf16>(), n, k, {});
  Buffer y = poisoned(m * n * sizeof(bf16) + 64);
  EXPECT_NO_THROW(plan->run(nullptr, 0, nullptr, nullptr));
  EXPECT_NO_THROW(plan->run(x.data<bf16>(), 0, y.data<bf16>(), nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(count_non_finite(to_host<bf16>(y.data(), m * n)), m * n) << "M = 0 wrote to the output";
  EXPECT_THROW(plan->run(nullptr, m, y.data<bf16>(), nullptr), Error);
  EXPECT_THROW(plan->run(x.data<bf16>(), m, nullptr, nullptr), Error);
  EXPECT_THROW(plan->run(x.data<bf16>() + 1, m, y.data<bf16>(), nullptr), Error);
  EXPECT_THROW(plan->run(x.data<bf16>(), m, y.data<bf16>() + 1, nullptr), Error);
}

// ---- CUDA graphs ----------------------------------------------------------------------------

// Quantize + GEMM captured into a CUDA graph in global mode, where any synchronising or
// allocating call (cudaMalloc, cudaMemcpy, a stream sync) fails the capture. The plan sees this M
// for the first time inside the capture, so its algorithm lookup runs there too (host-only), and
// M = 13 takes the cuBLASLt backend's 8-row tail path (async copies). The weight is quantized on
// the device at plan time, as ProjectionLayer does at load.
class GraphCaptureGpu : public GpuTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(GraphCaptureGpu, QuantizeThenGemmReplays) {
  std::string reason;
  const GemmBackend* backend = backend_or_skip_reason(GetParam(), reason);
  if (!backend) GTEST_SKIP() << reason;
  const int64_t m = 13, n = 256, k = 512;
  const auto w = testing::normal_rows_bf16(n, k, 7, 0.05f);
  const auto x = testing::normal_rows_bf16(m, k, 8);
  HostFp8Weight qw = make_host_fp8_weight(n, k);
  HostFp8Activation qx = make_host_fp8_activation(m, k);
  cpu::quantize_weight(w.data(), n, k, qw.out());
  cpu::quantize_activation(x.data(), m, k, qx.out());
  const std::vector<double> ref = cpu::gemm_f64(cpu::dequantize(qx.view()).data(), cpu::dequantize(qw.view()).data(), m, n, k);

  const QuantOps& ops = quant_ops(MemorySpace::device);
  Buffer dw = to_device(w), dx = to_device(x);
  Buffer wv(MemorySpace::device, n * k), ws(MemorySpace::device, qw.scales.size() * sizeof(float));
  ops.quantize_weight(dw.data<bf16>(), n, k, {wv.data<uint8_t>(), ws.data<float>(), n, k}, nullptr);
  ops.synchronize(nullptr);
  GemmPlanOptions options;
  options.max_m = 64;
  const auto plan = backend->plan_fp8({wv.data<uint8_t>(), ws.data<float>(), n, k}, options);

  Buffer xv(MemorySpace::device, m * k), xs(MemorySpace::device, (k / 128) * activation_scale_ld(m) * sizeof(float));
  const Fp8ActivationOut q{xv.data<uint8_t>(), xs.data<float>(), m, k, activation_scale_ld(m)};
  Buffer y = poisoned(m * n * sizeof(bf16));
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  try {
    ops.quantize_activation(dx.data<bf16>(), m, k, q, stream);
    plan->run(q.view(), y.data<bf16>(), stream);
  } catch (const Error& e) {
    ADD_FAILURE() << "inside the capture: " << e.what();
  }
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << "the capture was invalidated";
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const auto got = to_host<bf16>(y.data(), m * n);
  EXPECT_EQ(count_non_finite(got), 0);
  EXPECT_LE(compare(got.data(), ref.data(), m * n).rel_frobenius, kFp8GemmRelTol);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Backends, GraphCaptureGpu, ::testing::ValuesIn(kFp8Backends));

// A plan reads the weight's scales as they are at each call, eager and replayed from a captured
// graph: doubling every scale in place doubles every output exactly (powers of two). K/128 = 3
// is the cuBLASLt backend's padded scale stride (restaged before each call); 4 reads in place.
class WeightScalesInPlaceGpu : public GpuTest, public ::testing::WithParamInterface<std::tuple<std::string, int64_t>> {};

TEST_P(WeightScalesInPlaceGpu, ChangedScalesAreRead) {
  const auto& [name, k] = GetParam();
  std::string reason;
  const GemmBackend* backend = backend_or_skip_reason(name, reason);
  if (!backend) GTEST_SKIP() << reason;
  const int64_t m = 13, n = 256;
  if (const std::string why = backend->unsupported_reason(n, k); !why.empty()) GTEST_SKIP() << why;
  const auto w = testing::normal_rows_bf16(n, k, 17, 0.05f);
  const auto x = testing::normal_rows_bf16(m, k, 18);
  HostFp8Weight qw = make_host_fp8_weight(n, k);
  HostFp8Activation qx = make_host_fp8_activation(m, k);
  cpu::quantize_weight(w.data(), n, k, qw.out());
  cpu::quantize_activation(x.data(), m, k, qx.out());
  Buffer wv = to_device(qw.values), ws = to_device(qw.scales), xv = to_device(qx.values), xs = to_device(qx.scales);
  GemmPlanOptions options;
  options.max_m = 64;
  const auto plan = backend->plan_fp8({wv.data<uint8_t>(), ws.data<float>(), n, k}, options);
  const Fp8ActivationView view{xv.data<uint8_t>(), xs.data<float>(), m, k, qx.scale_ld};
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  Buffer y1 = poisoned(m * n * sizeof(bf16)), y2 = poisoned(m * n * sizeof(bf16)), y3 = poisoned(m * n * sizeof(bf16));
  plan->run(view, y1.data<bf16>(), stream);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  plan->run(view, y3.data<bf16>(), stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<float> doubled = qw.scales;
  for (float& v : doubled) v *= 2.0f;
  ASSERT_EQ(cudaMemcpy(ws.data(), doubled.data(), doubled.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  plan->run(view, y2.data<bf16>(), stream);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const auto a = to_host<bf16>(y1.data(), m * n), b = to_host<bf16>(y2.data(), m * n), c = to_host<bf16>(y3.data(), m * n);
  EXPECT_EQ(count_non_finite(a), 0);
  int64_t eager_off = 0, graph_off = 0;
  for (int64_t i = 0; i < m * n; ++i) {
    const float want = 2.0f * bf16_to_float(a[i]);
    eager_off += bf16_to_float(b[i]) != want;
    graph_off += bf16_to_float(c[i]) != want;
  }
  EXPECT_EQ(eager_off, 0) << name << " K=" << k << ": eager outputs not doubled after the scales were";
  EXPECT_EQ(graph_off, 0) << name << " K=" << k << ": graph-replay outputs not doubled after the scales were";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Backends, WeightScalesInPlaceGpu,
                         ::testing::Combine(::testing::ValuesIn(kFp8Backends), ::testing::Values(int64_t{384}, int64_t{512})),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_k" + std::to_string(std::get<1>(info.param));
                         });


// ---- the 64-row swap-AB tile over a long K, launched back to back -----------------------------

// Counts the elements of y that differ bitwise from ref.
__global__ void count_differences(const uint16_t* y, const uint16_t* ref, int64_t n, unsigned long long* diffs) {
  unsigned long long mine = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    mine += y[i] != ref[i];
  if (mine) atomicAdd(diffs, mine);
}

// The tile whose two consumer warpgroups take alternate K blocks (BLOCK_W = 64) once ran its
// stage ring with an odd stage count: a stage's consecutive fills then belong to different
// warpgroups, and a warpgroup that ran ahead while the other warpgroup's fill of the same stage
// was still landing saw that fill's mbarrier phase as its own (the parity cannot tell phase j
// from j - 2), read the stage early and released it; the producer then re-armed a barrier whose
// phase had not completed, and the arrive faulted ("unspecified launch failure", Xid 43; GPU
// core dump: Warp Illegal Instruction at the producer's mbarrier.arrive.expect_tx). It took a
// TMA fill landing behind the next ~13: about one launch in 20,000 at 16 x 7168 x 16384
// (o_proj TP 1) with the L2 flushed between launches (docs/robustness.md). Here: 60,000 such
// launches, each output compared bitwise on the device with the first (the kernel is
// deterministic), no CUDA error.
TEST(Sm90SwapAB64Gpu, LongKBackToBackNoFaultNoDrift) {
  const DeviceInfo& dev = current_device();
  if (!dev.present) GTEST_SKIP() << "no GPU: " << dev.why_absent;
  if (dev.cc_major != 9 || dev.cc_minor != 0) GTEST_SKIP() << "the sm90 kernels need an sm_90 GPU, this is " << dev.arch();
  const int64_t m = 16, n = 7168, k = 16384;
  constexpr int kLaunches = 60000, kBatch = 500;
  const sm90::Problem p{m, n, k, dev.sm_count};
  sm90::Config cfg;
  bool found = false;
  for (const sm90::Config& c : sm90::kernel_family())
    if (c.kind == sm90::KernelKind::kSwapAB && sm90::swap_ab_k_split(c.kind, c.block_n)) cfg = c, found = true;
  ASSERT_TRUE(found) << "no 64-row swap-AB tile in the kernel family";
  ASSERT_TRUE(sm90::can_run(cfg, p)) << sm90::why_illegal(cfg, p);

  // Random FP8 codes and scales: the GEMM's numerics are tested elsewhere, this is about the
  // pipeline; uniform bytes in [0, 0x7e] avoid NaN codes.
  std::vector<uint8_t> wv(static_cast<size_t>(n * k)), xv(static_cast<size_t>(m * k));
  uint32_t st = 12345u;
  for (auto* v : {&wv, &xv})
    for (auto& b : *v) b = static_cast<uint8_t>(((st = st * 1664525u + 1013904223u) >> 24) % 0x7f);
  HostFp8Activation qx = make_host_fp8_activation(m, k);
  for (auto& sc : qx.scales) sc = 0.01f;
  std::vector<float> ws(static_cast<size_t>((n + 127) / 128 * (k / 128)), 0.02f);
  Buffer dw = to_device(wv), dws = to_device(ws), dx = to_device(xv), dxs = to_device(qx.scales);
  Buffer y0 = poisoned(static_cast<size_t>(m * n) * sizeof(bf16)), y = poisoned(static_cast<size_t>(m * n) * sizeof(bf16));
  Buffer diffs(MemorySpace::device, sizeof(unsigned long long));
  ASSERT_EQ(cudaMemset(diffs.data(), 0, sizeof(unsigned long long)), cudaSuccess);
  auto args = [&](Buffer& out) {
    return sm90::Fp8GemmArgs{m, n, k, dx.data<uint8_t>(), dxs.data<float>(), qx.scale_ld,
                             dw.data<uint8_t>(), dws.data<float>(), out.data()};
  };
  sm90::run(args(y0), cfg, nullptr, 0, dev.sm_count, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  int done = 0;
  for (int b = 0; b < kLaunches / kBatch; ++b) {
    for (int i = 0; i < kBatch; ++i, ++done) {
      flush_l2(nullptr);
      sm90::run(args(y), cfg, nullptr, 0, dev.sm_count, nullptr);
      count_differences<<<64, 256>>>(y.data<uint16_t>(), y0.data<uint16_t>(), m * n,
                                     diffs.data<unsigned long long>());
    }
    const cudaError_t e = cudaDeviceSynchronize();
    ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e) << " within launches " << done - kBatch << "-" << done
                              << " of " << kLaunches << " (" << cfg.name() << ", " << m << "x" << n << "x" << k << ")";
  }
  unsigned long long differing = 0;
  ASSERT_EQ(cudaMemcpy(&differing, diffs.data(), sizeof differing, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(differing, 0u) << "output elements that differed from the first launch's, over " << kLaunches << " launches";
  std::printf("[%s %lldx%lldx%lld] %d launches, L2 flushed before each: no CUDA error, %llu differing elements\n",
              cfg.name().c_str(), static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
              kLaunches, differing);
}

}  // namespace
}  // namespace fp8proj
