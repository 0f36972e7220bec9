// The gated projection layer on the device: ProjectionLayer::forward captured in a CUDA graph
// (global capture mode: any allocation or synchronisation inside forward would fail the capture)
// and replayed, for decode-sized M on the bf16 path and a prefill M on the FP8 path. The capture
// is the first call at each M (cuBLASLt's per-M algorithm lookup happens inside it), the graph is
// replayed twice and again after the input changed, and each result must equal an eager call
// bit for bit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "fp8proj/projection.hpp"
#include "fp8proj/quantize.hpp"
#include "fp8proj/random.hpp"
#include "fp8proj/reference.hpp"
#include "gpu_test_util.hpp"

namespace fp8proj {
namespace {

using testing::GpuTest;
using testing::poisoned;
using testing::to_host;

class ProjectionGraphGpu : public GpuTest {};

std::vector<uint8_t> bytes_of(const Buffer& b) {
  std::vector<uint8_t> h(b.bytes());
  copy_bytes(h.data(), MemorySpace::host, b.data(), MemorySpace::device, b.bytes());
  return h;
}

TEST_F(ProjectionGraphGpu, ForwardCapturedAndReplayedEqualsEager) {
  if (!current_device().is_sm90()) GTEST_SKIP() << "FP8 path needs sm_90; this GPU is " << current_device().arch();
  // A shape no tuned table lists, and options that ignore the table and the environment: the
  // default gate (FP8 when M > 512) decides, so the paths below are known.
  const int64_t n = 1024, k = 1536, max_m = 4096;
  Buffer w(MemorySpace::device, n * k * sizeof(bf16));
  fill_normal(MemorySpace::device, w.data<bf16>(), n * k, 31, 0.02f);
  ProjectionOptions o;
  o.name = "graph_test";
  o.fp8 = true;
  o.apply_env = false;
  o.use_tune_table = false;
  o.max_tokens = max_m;
  ProjectionLayer layer(MemorySpace::device, w.data<bf16>(), n, k, o);
  ASSERT_TRUE(layer.has_fp8_copy());

  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (const int64_t m : {int64_t{1}, int64_t{8}, int64_t{64}, int64_t{512}, int64_t{4096}}) {
    const Path expected = m <= 512 ? Path::bf16 : Path::fp8;
    EXPECT_EQ(layer.path_for(m), expected) << layer.explain(m).to_string();
    Buffer x(MemorySpace::device, m * k * sizeof(bf16));
    Buffer y_graph(MemorySpace::device, m * n * sizeof(bf16)), y_eager(MemorySpace::device, m * n * sizeof(bf16));
    fill_normal(MemorySpace::device, x.data<bf16>(), m * k, 100 + m, 1.0f);
    fill_bytes(MemorySpace::device, y_graph.data(), y_graph.bytes(), 0xff);

    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    layer.forward(x.data<bf16>(), m, y_graph.data<bf16>(), stream);
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess) << "forward is not capturable at M=" << m;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    // Capturing ran nothing: the output is still the poison.
    const std::vector<uint8_t> poisoned = bytes_of(y_graph);
    EXPECT_TRUE(std::all_of(poisoned.begin(), poisoned.end(), [](uint8_t b) { return b == 0xff; }));

    for (int round = 0; round < 2; ++round) {  // round 1: new input, same graph (it reads x by pointer)
      if (round == 1) fill_normal(MemorySpace::device, x.data<bf16>(), m * k, 200 + m, 2.0f);
      for (int replay = 0; replay < 2; ++replay) ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      layer.forward(x.data<bf16>(), m, y_eager.data<bf16>(), stream);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      const auto g = bytes_of(y_graph), e = bytes_of(y_eager);
      EXPECT_EQ(0, std::memcmp(g.data(), e.data(), g.size())) << "M=" << m << " round " << round << " ("
                                                               << to_string(expected) << " path)";
      int64_t non_finite = 0;
      for (size_t i = 0; i < g.size(); i += 2) {
        uint16_t bits;
        std::memcpy(&bits, g.data() + i, 2);
        non_finite += (bits & 0x7f80u) == 0x7f80u;
      }
      EXPECT_EQ(non_finite, 0) << "M=" << m << ": outputs left unwritten or not finite";
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

// The selection's typed configuration reaches the sm90 plan: a tuned row naming one kernel per
// bucket runs exactly those kernels (select() and explain() name them), each within the FP8
// GEMM tolerance of the same layer left to the heuristic.
TEST_F(ProjectionGraphGpu, TunedConfigurationsRunAsSelected) {
  if (!current_device().is_sm90()) GTEST_SKIP() << "FP8 path needs sm_90; this GPU is " << current_device().arch();
  const int64_t n = 2048, k = 2048, max_m = 4096;
  Buffer w(MemorySpace::device, n * k * sizeof(bf16));
  fill_normal(MemorySpace::device, w.data<bf16>(), n * k, 41, 0.02f);
  ProjectionOptions o;
  o.name = "tuned_device";
  o.fp8 = true;
  o.policy = Fp8Policy::all;
  o.decode_ceiling = 0;
  o.apply_env = false;
  o.use_tune_table = false;
  o.max_tokens = max_m;
  ProjectionOptions plain = o;
  plain.threshold = 0;
  TunedShape row;
  row.n = n;
  row.k = k;
  row.threshold = 0;
  row.buckets = {{1, 64, "sm90_fp8_block", "swapab_m16n128_ws2_st11", 2, 1, {}},
                 {65, max_m, "sm90_fp8_block", "m128n192_ws2_st4", 2, 1, {}}};
  o.tuned = row;
  ProjectionLayer tuned(MemorySpace::device, w.data<bf16>(), n, k, o);
  ProjectionLayer heuristic(MemorySpace::device, w.data<bf16>(), n, k, plain);
  for (const auto& [m, name] : {std::pair<int64_t, const char*>{32, "swapab_m16n128_ws2_st11"},
                                std::pair<int64_t, const char*>{1000, "m128n192_ws2_st4"}}) {
    const Selection sel = tuned.select({m, n, k});
    EXPECT_EQ(sel.path, Path::fp8);
    EXPECT_EQ(config_name(sel.config), name);
    EXPECT_EQ(tuned.explain(m).config, name) << tuned.explain(m).to_string();
    Buffer x(MemorySpace::device, m * k * sizeof(bf16));
    fill_normal(MemorySpace::device, x.data<bf16>(), m * k, 300 + m, 1.0f);
    Buffer y = poisoned(m * n * sizeof(bf16)), ref = poisoned(m * n * sizeof(bf16));
    tuned.forward(x.data<bf16>(), m, y.data<bf16>());
    heuristic.forward(x.data<bf16>(), m, ref.data<bf16>());
    const auto yh = to_host<bf16>(y.data(), m * n), rh = to_host<bf16>(ref.data(), m * n);
    const ErrorStats e = compare(yh.data(), rh.data(), m * n);
    EXPECT_EQ(e.non_finite, 0) << "M=" << m << " " << name;
    EXPECT_LE(e.rel_frobenius, 2 * kFp8GemmRelTol) << "M=" << m << " " << name << " vs "
                                                   << heuristic.explain(m).config;
  }
}

// ProjectionOptions::weight_scales on the device: the layer's FP8 copy is the float rule's,
// bit-exact with the CPU reference quantizer, and its FP8 path equals the host layer's reference
// GEMM on that copy within the numerics contract (same activations, UE8M0).
TEST_F(ProjectionGraphGpu, FloatWeightScalesCopyBitExactWithCpu) {
  if (!current_device().is_sm90()) GTEST_SKIP() << "FP8 path needs sm_90; this GPU is " << current_device().arch();
  const int64_t n = 2624, k = 2048, m = 1000;  // fused_qkv_a-like: a partial last weight block
  std::vector<bf16> hw(static_cast<size_t>(n * k)), hx(static_cast<size_t>(m * k));
  fill_normal(MemorySpace::host, hw.data(), n * k, 41, 0.02f);
  fill_normal(MemorySpace::host, hx.data(), m * k, 42, 1.0f);
  Buffer w(MemorySpace::device, n * k * sizeof(bf16)), x(MemorySpace::device, m * k * sizeof(bf16));
  copy_bytes(w.data(), MemorySpace::device, hw.data(), MemorySpace::host, w.bytes());
  copy_bytes(x.data(), MemorySpace::device, hx.data(), MemorySpace::host, x.bytes());
  ProjectionOptions o;
  o.name = "float_scales";
  o.fp8 = true;
  o.apply_env = false;
  o.use_tune_table = false;
  o.threshold = 0;
  o.policy = Fp8Policy::all;
  o.max_tokens = 1024;
  o.weight_scales = ScaleMode::fp32;
  ProjectionLayer dev(MemorySpace::device, w.data<bf16>(), n, k, o);
  ProjectionLayer host(MemorySpace::host, hw.data(), n, k, o);
  ASSERT_TRUE(dev.has_fp8_copy() && host.has_fp8_copy());
  HostFp8Weight ref = make_host_fp8_weight(n, k);
  cpu::quantize_weight(hw.data(), n, k, ref.out(), ScaleMode::fp32);
  const Fp8WeightView dv = *dev.fp8_weight();
  EXPECT_EQ(to_host<uint8_t>(dv.values, ref.values.size()), ref.values);
  const auto scales = to_host<float>(dv.scales, ref.scales.size());
  EXPECT_EQ(0, std::memcmp(scales.data(), ref.scales.data(), ref.scales.size() * sizeof(float)));
  Buffer y = poisoned(m * n * sizeof(bf16));
  dev.forward(x.data<bf16>(), m, y.data<bf16>());
  std::vector<bf16> yh_ref(static_cast<size_t>(m * n));
  host.forward(hx.data(), m, yh_ref.data());
  const auto yh = to_host<bf16>(y.data(), m * n);
  const ErrorStats e = compare(yh.data(), yh_ref.data(), m * n);
  EXPECT_EQ(e.non_finite, 0);
  EXPECT_LE(e.rel_frobenius, 2 * kFp8GemmRelTol);  // two kernels' bf16 roundings of the same product
}

}  // namespace
}  // namespace fp8proj
