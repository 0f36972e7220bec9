// Programmatic dependent launch (FP8PROJ_PDL, core/pdl.hpp) changes when kernels may start, never
// what they compute: the decode chain of a projection pair --
//   rmsnorm_quant(x) -> GEMM 1 -> activation_quant(y1) -> GEMM 2 -> y2
// -- run with PDL on and off, eagerly (on a stream of its own and on the legacy default stream)
// and as a captured CUDA graph, must give bitwise equal y1 and y2, repetition after repetition,
// for each kernel kind at M in {1, 16, 64, 777}: swap-AB (with and without split-K) and 1d2d
// (without and with a 2-CTA cluster). Before every repetition the intermediate buffers and
// outputs are poisoned (0xff: NaN), so a kernel that read its input before the kernel producing
// it had finished would read NaN, not last repetition's equal values. Under capture, PDL
// launches must become programmatic graph edges (counted: none with PDL off, one per kernel
// after the first with it on). Skips, with the reason, without an sm_90 GPU.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/gemm/sm90_fp8_gemm.hpp"
#include "fp8proj/ops.hpp"
#include "fp8proj/quantize.hpp"
#include "gpu_test_util.hpp"
#include "pdl_test_util.hpp"

namespace fp8proj {
namespace {

using testing::GpuTest;
using testing::PdlOverride;
using testing::to_device;
using testing::to_host;

int64_t non_finite(const std::vector<bf16>& v) {
  int64_t n = 0;
  for (const bf16 x : v) n += std::isfinite(bf16_to_float(x)) ? 0 : 1;
  return n;
}

// The kernel variants of the chain: which configuration each GEMM takes (the best-ranked of the
// variant for its own problem).
enum class Variant { swapab, swapab_split, gemm1d2d, gemm1d2d_cluster };
const char* name_of(Variant v) {
  switch (v) {
    case Variant::swapab: return "swapab";
    case Variant::swapab_split: return "swapab_splitk";
    case Variant::gemm1d2d: return "1d2d";
    case Variant::gemm1d2d_cluster: return "1d2d_cluster";
  }
  return "?";
}

void PrintTo(Variant v, std::ostream* os) { *os << name_of(v); }

bool matches(const sm90::Config& c, Variant v) {
  const bool swap = c.kind == sm90::KernelKind::kSwapAB;
  switch (v) {
    case Variant::swapab: return swap && c.split_k == 1;
    case Variant::swapab_split: return swap && c.split_k > 1;
    case Variant::gemm1d2d: return !swap && c.cluster == 1;
    case Variant::gemm1d2d_cluster: return !swap && c.cluster > 1;
  }
  return false;
}

// The best-ranked legal configuration of the variant, or false when there is none at this M.
bool pick(const sm90::Problem& p, Variant v, sm90::Config& out) {
  for (const sm90::Ranked& r : sm90::rank(p))
    if (matches(r.config, v)) {
      out = r.config;
      return true;
    }
  return false;
}

// Weight shapes of a DeepSeek-V3 TP8 shard pair: q_b_proj-like 3072 x 1536, then a 2048 x 3072
// projection of its output. Small enough to run the whole matrix in seconds.
constexpr int64_t kK1 = 1536, kN1 = 3072, kN2 = 2048;

struct DeviceWeight {
  Buffer values, scales;
  DeviceWeight(int64_t n, int64_t k, uint32_t seed) {
    const auto w = testing::normal_rows_bf16(n, k, seed, 0.05f);
    HostFp8Weight q = make_host_fp8_weight(n, k);
    cpu::quantize_weight(w.data(), n, k, q.out());
    values = to_device(q.values);
    scales = to_device(q.scales);
  }
};

class PdlChainGpu : public GpuTest, public ::testing::WithParamInterface<std::tuple<int64_t, Variant>> {};

TEST_P(PdlChainGpu, OnAndOffBitwiseEqualEagerAndReplayed) {
  const DeviceInfo& dev = current_device();
  if (dev.cc_major != 9 || dev.cc_minor != 0) GTEST_SKIP() << "the sm90 kernels need an sm_90 GPU, this is " << dev.arch();
  const auto [m, variant] = GetParam();
  // A GEMM with no legal configuration of the variant at this M takes the heuristic's choice.
  const sm90::Problem p1{m, kN1, kK1, dev.sm_count}, p2{m, kN2, kN1, dev.sm_count};
  sm90::Config cfg1 = sm90::choose(p1), cfg2 = sm90::choose(p2);
  const bool has1 = pick(p1, variant, cfg1), has2 = pick(p2, variant, cfg2);
  if (!has1 && !has2)
    GTEST_SKIP() << "no " << name_of(variant) << " configuration is legal at M = " << m << " (by design)";
  std::printf("M=%lld %s: GEMM 1 %s, GEMM 2 %s\n", static_cast<long long>(m), name_of(variant), cfg1.name().c_str(),
              cfg2.name().c_str());

  const DeviceWeight w1(kN1, kK1, 11), w2(kN2, kN1, 12);
  const Buffer x = to_device(testing::normal_rows_bf16(m, kK1, uint32_t(100 + m)));
  const Buffer norm = to_device(testing::normal_rows_bf16(1, kK1, 7, 0.5f));
  const int64_t ld = activation_scale_ld(m);
  Buffer q1v(MemorySpace::device, m * kK1), q1s(MemorySpace::device, (kK1 / 128) * ld * sizeof(float));
  Buffer q2v(MemorySpace::device, m * kN1), q2s(MemorySpace::device, (kN1 / 128) * ld * sizeof(float));
  Buffer y1(MemorySpace::device, m * kN1 * sizeof(bf16)), y2(MemorySpace::device, m * kN2 * sizeof(bf16));
  const size_t ws1_bytes = sm90::workspace_bytes(cfg1, m, kN1, kK1), ws2_bytes = sm90::workspace_bytes(cfg2, m, kN2, kN1);
  // One workspace for both GEMMs, as a plan shares one across calls: GEMM 2 must not touch the
  // split-K counters before GEMM 1 has left them at zero.
  const size_t ws_bytes = std::max<size_t>({ws1_bytes, ws2_bytes, 16});
  Buffer ws(MemorySpace::device, ws_bytes);
  fill_bytes(MemorySpace::device, ws.data(), ws.bytes(), 0);

  const Fp8ActivationOut q1{q1v.data<uint8_t>(), q1s.data<float>(), m, kK1, ld};
  const Fp8ActivationOut q2{q2v.data<uint8_t>(), q2s.data<float>(), m, kN1, ld};
  const QuantOps& ops = quant_ops(MemorySpace::device);
  auto chain = [&](cudaStream_t s) {
    ops.rmsnorm_quantize(x.data<bf16>(), kK1, norm.data<bf16>(), 1e-6f, m, kK1, q1, s);
    sm90::run({m, kN1, kK1, q1v.data<uint8_t>(), q1s.data<float>(), ld, w1.values.data<uint8_t>(),
               w1.scales.data<float>(), y1.data()},
              cfg1, ws1_bytes ? ws.data() : nullptr, ws1_bytes, dev.sm_count, s);
    ops.quantize_activation(y1.data<bf16>(), m, kN1, q2, s);
    sm90::run({m, kN2, kN1, q2v.data<uint8_t>(), q2s.data<float>(), ld, w2.values.data<uint8_t>(),
               w2.scales.data<float>(), y2.data()},
              cfg2, ws2_bytes ? ws.data() : nullptr, ws2_bytes, dev.sm_count, s);
  };
  auto poison = [&](cudaStream_t s) {
    for (Buffer* b : {&q1v, &q1s, &q2v, &q2s, &y1, &y2}) ASSERT_EQ(cudaMemsetAsync(b->data(), 0xff, b->bytes(), s), cudaSuccess);
  };
  struct Out {
    std::vector<bf16> y1, y2;
  };
  auto read = [&]() { return Out{to_host<bf16>(y1.data(), m * kN1), to_host<bf16>(y2.data(), m * kN2)}; };

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  // The reference: PDL off, eager.
  Out ref;
  {
    const PdlOverride off(false);
    poison(stream);
    chain(stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    ref = read();
    EXPECT_EQ(non_finite(ref.y2), 0) << "outputs left unwritten (NaN poison) or not finite";
  }
  auto same = [&](const Out& got, const std::string& what) {
    EXPECT_EQ(0, std::memcmp(got.y1.data(), ref.y1.data(), ref.y1.size() * sizeof(bf16))) << what << ": y1 differs";
    EXPECT_EQ(0, std::memcmp(got.y2.data(), ref.y2.data(), ref.y2.size() * sizeof(bf16))) << what << ": y2 differs";
  };
  constexpr int kReps = 4;
  for (bool pdl : {false, true}) {
    const PdlOverride mode(pdl);
    const std::string tag = std::string("PDL ") + (pdl ? "on" : "off");
    // Odd repetitions on the legacy default stream, where callers without a stream of their own launch.
    for (int rep = 0; rep < kReps; ++rep) {
      cudaStream_t s = rep % 2 == 0 ? stream : nullptr;
      poison(s);
      chain(s);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess) << tag;
      same(read(), tag + ", eager, repetition " + std::to_string(rep) + (s ? "" : " (default stream)"));
    }
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    try {
      chain(stream);
    } catch (const std::exception& e) {
      ADD_FAILURE() << tag << ", inside the capture: " << e.what();
    }
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << tag << ": the capture was invalidated";
    const int programmatic = testing::programmatic_edges(graph);
    if (pdl)
      EXPECT_GE(programmatic, 3) << "PDL on: the 4 kernels of the chain should be joined by programmatic edges";
    else
      EXPECT_EQ(programmatic, 0) << "PDL off: no programmatic edge expected";
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess) << tag;
    for (int rep = 0; rep < kReps; ++rep) {
      poison(stream);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess) << tag;
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << tag;
      same(read(), tag + ", graph replay " + std::to_string(rep));
    }
    // Back to back without a poison in between: replays overlapping each other's edges.
    for (int rep = 0; rep < kReps; ++rep) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess) << tag;
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << tag;
    same(read(), tag + ", back-to-back replays");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

// Under PDL a GEMM may start while the kernel before it still runs; everything it reads before
// griddepcontrol.wait must be settled (pdl.cuh, rule 1: nothing global, the weight included).
// Here the device weight quantizer rewrites the weight buffer -- alternately from two different
// bf16 weights -- right before each GEMM, PDL on, eagerly and in graph replay: every output must
// be the one of the weight just written (the reference of each weight: PDL off), never the
// previous weight's. A change that reads the weight earlier (a prefetch before the wait) must
// keep this test passing.
class PdlWeightRewriteGpu : public GpuTest, public ::testing::WithParamInterface<std::tuple<int64_t, Variant>> {};

TEST_P(PdlWeightRewriteGpu, GemmReadsTheWeightWrittenJustBefore) {
  const DeviceInfo& dev = current_device();
  if (dev.cc_major != 9 || dev.cc_minor != 0) GTEST_SKIP() << "the sm90 kernels need an sm_90 GPU, this is " << dev.arch();
  const auto [m, variant] = GetParam();
  const sm90::Problem p{m, kN1, kK1, dev.sm_count};
  sm90::Config cfg = sm90::choose(p);
  if (!pick(p, variant, cfg)) GTEST_SKIP() << "no " << name_of(variant) << " configuration is legal at M = " << m;
  std::printf("M=%lld %s: %s\n", static_cast<long long>(m), name_of(variant), cfg.name().c_str());

  const Buffer wa = to_device(testing::normal_rows_bf16(kN1, kK1, 21, 0.05f));
  const Buffer wb = to_device(testing::normal_rows_bf16(kN1, kK1, 22, 0.05f));
  Buffer wv(MemorySpace::device, kN1 * kK1), wsc(MemorySpace::device, ((kN1 + 127) / 128) * (kK1 / 128) * sizeof(float));
  const Buffer x = to_device(testing::normal_rows_bf16(m, kK1, uint32_t(300 + m)));
  const int64_t ld = activation_scale_ld(m);
  Buffer qv(MemorySpace::device, m * kK1), qs(MemorySpace::device, (kK1 / 128) * ld * sizeof(float));
  Buffer y(MemorySpace::device, m * kN1 * sizeof(bf16));
  const size_t ws_bytes = sm90::workspace_bytes(cfg, m, kN1, kK1);
  Buffer ws(MemorySpace::device, std::max<size_t>(ws_bytes, 16));
  fill_bytes(MemorySpace::device, ws.data(), ws.bytes(), 0);
  const Fp8ActivationOut q{qv.data<uint8_t>(), qs.data<float>(), m, kK1, ld};
  const Fp8WeightOut wout{wv.data<uint8_t>(), wsc.data<float>(), kN1, kK1};
  const QuantOps& ops = quant_ops(MemorySpace::device);
  // The weight's writer is the kernel right before the GEMM; the activation quantizer before it
  // triggers early, as in the decode chain.
  auto step = [&](const Buffer& w, cudaStream_t s) {
    ops.quantize_activation(x.data<bf16>(), m, kK1, q, s);
    ops.quantize_weight(w.data<bf16>(), kN1, kK1, wout, s);
    sm90::run({m, kN1, kK1, qv.data<uint8_t>(), qs.data<float>(), ld, wv.data<uint8_t>(), wsc.data<float>(), y.data()},
              cfg, ws_bytes ? ws.data() : nullptr, ws_bytes, dev.sm_count, s);
  };
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::vector<bf16> ref[2];
  {
    const PdlOverride off(false);
    for (int i = 0; i < 2; ++i) {
      step(i == 0 ? wa : wb, stream);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      ref[i] = to_host<bf16>(y.data(), m * kN1);
    }
  }
  ASSERT_NE(0, std::memcmp(ref[0].data(), ref[1].data(), ref[0].size() * sizeof(bf16))) << "the two weights must differ";
  const PdlOverride on(true);
  for (int rep = 0; rep < 8; ++rep) {
    step(rep % 2 == 0 ? wa : wb, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    const std::vector<bf16> got = to_host<bf16>(y.data(), m * kN1);
    EXPECT_EQ(0, std::memcmp(got.data(), ref[rep % 2].data(), got.size() * sizeof(bf16)))
        << "PDL on, eager, repetition " << rep << ": not the output of the weight written just before";
  }
  // Graph replay: both rewrites and both GEMMs in one graph, replayed back to back.
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  Buffer y_mid(MemorySpace::device, m * kN1 * sizeof(bf16));
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  step(wa, stream);
  const cudaError_t copy_rc = cudaMemcpyAsync(y_mid.data(), y.data(), y.bytes(), cudaMemcpyDeviceToDevice, stream);
  step(wb, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(copy_rc, cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int rep = 0; rep < 4; ++rep) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_EQ(0, std::memcmp(to_host<bf16>(y_mid.data(), m * kN1).data(), ref[0].data(), ref[0].size() * sizeof(bf16)))
      << "graph replay: the first GEMM did not read the weight written just before";
  EXPECT_EQ(0, std::memcmp(to_host<bf16>(y.data(), m * kN1).data(), ref[1].data(), ref[1].size() * sizeof(bf16)))
      << "graph replay: the second GEMM did not read the weight written just before";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<int64_t, Variant>>& info) {
  return "M" + std::to_string(std::get<0>(info.param)) + "_" + name_of(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(DecodeChain, PdlChainGpu,
                         ::testing::Combine(::testing::Values(int64_t{1}, int64_t{16}, int64_t{64}, int64_t{777}),
                                            ::testing::Values(Variant::swapab, Variant::swapab_split,
                                                              Variant::gemm1d2d, Variant::gemm1d2d_cluster)),
                         case_name);

INSTANTIATE_TEST_SUITE_P(WeightRewrite, PdlWeightRewriteGpu,
                         ::testing::Combine(::testing::Values(int64_t{1}, int64_t{64}, int64_t{777}),
                                            ::testing::Values(Variant::swapab, Variant::swapab_split,
                                                              Variant::gemm1d2d)),
                         case_name);

}  // namespace
}  // namespace fp8proj
