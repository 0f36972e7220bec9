// The fault probe's "sticky" scenario for the C++ library, and its "hang" scenario (the layer
// probe only: both reach library internals). See tests/gpu/test_faults.py.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/cuda_check.hpp"
#include "fault_probe.hpp"
#include "fp8proj/device.hpp"
#include "fp8proj/memory.hpp"
#include "fp8proj/mla.hpp"
#include "fp8proj/ops.hpp"
#include "fp8proj/projection.hpp"
#include "fp8proj/random.hpp"
#include "fp8proj/tp.hpp"

namespace fp8proj::testing {
void launch_hanging_gemm(cudaStream_t stream);  // hang_launch.cu
}

namespace fault_probe {

using namespace fp8proj;

namespace {

// A small DeepSeek-V3-like block (tests/gpu/mla_gpu_test.cu's shapes): every stage runs on the
// device kernels, FP8 on the tagged projections at every M.
MlaConfig small_mla() {
  MlaConfig c;
  c.model = "fault-probe";
  c.hidden = 512;
  c.heads = 4;
  c.q_lora_rank = 256;
  c.kv_lora_rank = 512;
  c.qk_nope_dim = 128;
  c.qk_rope_dim = 64;
  c.v_head_dim = 128;
  return c;
}

MlaOptions mla_options() {
  MlaOptions o;
  o.tagged.fp8 = true;
  o.tagged.apply_env = false;
  o.tagged.threshold = 0;
  o.tagged.decode_ceiling = 0;
  o.max_tokens = 256;
  o.max_batch = 4;
  o.cache_capacity = 512;
  return o;
}

ProjectionOptions layer_options(const char* name, bool fp8, const char* backend = "auto") {
  ProjectionOptions o;
  o.name = name;
  o.fp8 = fp8;
  o.policy = Fp8Policy::all;
  o.threshold = 0;
  o.apply_env = false;
  o.rmsnorm_input = true;
  o.max_tokens = 256;
  o.fp8_backend = backend;
  return o;
}

}  // namespace

int sticky_scenario() {
  constexpr int64_t n = 256, k = 256, m = 64;
  // Everything the calls after the fault use is made while the context is healthy.
  Buffer w(MemorySpace::device, n * k * 2), x(MemorySpace::device, m * k * 2), y(MemorySpace::device, m * n * 2),
      norm(MemorySpace::device, k * 2), q_values(MemorySpace::device, m * k),
      q_scales(MemorySpace::device, (k / 128) * m * sizeof(float)), w_values(MemorySpace::device, n * k),
      w_scales(MemorySpace::device, (n / 128) * (k / 128) * sizeof(float));
  fill_normal(MemorySpace::device, w.data<bf16>(), n * k, 1, 0.02f);
  fill_normal(MemorySpace::device, x.data<bf16>(), m * k, 2, 1.0f);
  fill_normal(MemorySpace::device, norm.data<bf16>(), k, 3, 1.0f);
  ProjectionLayer fp8_layer(MemorySpace::device, w.data<bf16>(), n, k, layer_options("probe.sm90", true));
  ProjectionLayer lt_layer(MemorySpace::device, w.data<bf16>(), n, k,
                           layer_options("probe.cublaslt_fp8", true, "cublaslt_fp8_block"));
  ProjectionLayer bf16_layer(MemorySpace::device, w.data<bf16>(), n, k, layer_options("probe.bf16", false));
  const QuantOps& ops = quant_ops(MemorySpace::device);
  const Fp8ActivationOut q{q_values.data<uint8_t>(), q_scales.data<float>(), m, k, m};
  ShardedProjection shard(MemorySpace::device, column_shard(n, k, 0, 1), w.data<bf16>(), MemorySpace::device, nullptr,
                          layer_options("probe.shard", true));

  const MlaConfig c = small_mla();
  MlaBlock block(MemorySpace::device, c, uint64_t{7}, mla_options());
  const std::vector<int32_t> offsets{0, 40, 64}, starts{0, 256}, positions{40, 24};
  Buffer d_off(MemorySpace::device, 12), d_start(MemorySpace::device, 8), d_pos(MemorySpace::device, 8),
      bx(MemorySpace::device, m * c.hidden * 2), by(MemorySpace::device, m * c.hidden * 2);
  copy_bytes(d_off.data(), MemorySpace::device, offsets.data(), MemorySpace::host, 12);
  copy_bytes(d_start.data(), MemorySpace::device, starts.data(), MemorySpace::host, 8);
  copy_bytes(d_pos.data(), MemorySpace::device, positions.data(), MemorySpace::host, 8);
  fill_normal(MemorySpace::device, bx.data<bf16>(), m * c.hidden, 4, 1.0f);
  const MlaPrefillBatch prefill{2, d_off.data<int32_t>(), d_start.data<int32_t>(), offsets.data()};
  const MlaDecodeBatch decode{2, d_pos.data<int32_t>(), d_start.data<int32_t>(), 64};
  block.prefill(bx.data<bf16>(), prefill, by.data<bf16>());
  MlaDecodeGraph graph(block, bx.data<bf16>(), decode, by.data<bf16>());
  // A healthy context first: every surface works before the fault.
  fp8_layer.forward(x.data<bf16>(), m, y.data<bf16>());
  lt_layer.forward(x.data<bf16>(), m, y.data<bf16>());
  bf16_layer.forward(x.data<bf16>(), m, y.data<bf16>());
  graph.replay();
  if (cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("probe FAILED: the context is not healthy before the fault\n");
    return 1;
  }

  const std::string marker = inject_fault();
  if (marker.empty()) return 1;
  bf16* xp = x.data<bf16>();
  bf16* yp = y.data<bf16>();
  std::vector<Surface> surfaces = {
      {"ProjectionLayer.forward (sm90 FP8)", [&] { fp8_layer.forward(xp, m, yp); }},
      {"ProjectionLayer.forward (cuBLASLt FP8)", [&] { lt_layer.forward(xp, m, yp); }},
      {"ProjectionLayer.forward (bf16, cuBLASLt)", [&] { bf16_layer.forward(xp, m, yp); }},
      {"ProjectionLayer.forward M=0", [&] { fp8_layer.forward(xp, 0, yp); }},
      {"ProjectionLayer.forward_rmsnorm", [&] { fp8_layer.forward_rmsnorm(xp, k, norm.data<bf16>(), 1e-6f, m, yp); }},
      {"ProjectionLayer.forward_quantized", [&] { fp8_layer.forward_quantized(q.view(), yp); }},
      {"QuantOps.quantize_activation", [&] { ops.quantize_activation(xp, m, k, q, nullptr); }},
      {"QuantOps.rmsnorm_quantize", [&] { ops.rmsnorm_quantize(xp, k, norm.data<bf16>(), 1e-6f, m, k, q, nullptr); }},
      {"QuantOps.quantize_weight",
       [&] { ops.quantize_weight(w.data<bf16>(), n, k, {w_values.data<uint8_t>(), w_scales.data<float>(), n, k}, nullptr); }},
      {"ShardedProjection.forward", [&] { shard.forward(xp, m, yp); }},
      {"MlaBlock.prefill", [&] { block.prefill(bx.data<bf16>(), prefill, by.data<bf16>()); }},
      {"MlaBlock.decode", [&] { block.decode(bx.data<bf16>(), decode, by.data<bf16>()); }},
      {"MlaDecodeGraph.replay", [&] { graph.replay(); }},
      {"ProjectionLayer (construct)",
       [&] { ProjectionLayer l(MemorySpace::device, w.data<bf16>(), n, k, layer_options("probe.new", true)); }},
      {"MlaBlock (construct)", [&] { MlaBlock b(MemorySpace::device, c, uint64_t{8}, mla_options()); }},
      {"Buffer (allocate)", [&] { Buffer b(MemorySpace::device, 1 << 20); }},
  };
  const int rc = check_surfaces(std::move(surfaces), marker);
  if (device_fault_text().find(marker) == std::string::npos) {
    std::printf("probe FAILED: device_fault_text() does not name %s: '%s'\n", marker.c_str(), device_fault_text().c_str());
    return 1;
  }
  return rc;
}

int hang_scenario() {
  // A layer made first: after the watchdog's trap, a library call must fail with its report.
  constexpr int64_t n = 256, k = 256, m = 64;
  Buffer w(MemorySpace::device, n * k * 2), x(MemorySpace::device, m * k * 2), y(MemorySpace::device, m * n * 2);
  fill_normal(MemorySpace::device, w.data<bf16>(), n * k, 1, 0.02f);
  fill_normal(MemorySpace::device, x.data<bf16>(), m * k, 2, 1.0f);
  ProjectionLayer layer(MemorySpace::device, w.data<bf16>(), n, k, layer_options("probe.after_hang", true));
  if (cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("probe FAILED: the context is not healthy before the hang\n");
    return 1;
  }
  std::printf("launching the 1d2d GEMM with a half-size B box (FP8PROJ_WATCHDOG_MS=%s)\n",
              std::getenv("FP8PROJ_WATCHDOG_MS") ? std::getenv("FP8PROJ_WATCHDOG_MS") : "unset");
  std::fflush(stdout);
  const auto t0 = std::chrono::steady_clock::now();
  fp8proj::testing::launch_hanging_gemm(nullptr);
  try {
    CUDA_CHECK(cudaStreamSynchronize(nullptr));
    std::printf("probe FAILED: the hanging kernel completed\n");
    return 1;
  } catch (const Error& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    std::printf("hang ended after %lld ms: %s\n", static_cast<long long>(ms.count()), e.what());
  }
  try {
    layer.forward(x.data<bf16>(), m, y.data<bf16>());
    std::printf("probe FAILED: a forward after the hang returned\n");
    return 1;
  } catch (const Error& e) {
    std::printf("after the hang: %s\n", e.what());
  }
  std::fflush(stdout);
  // The process ends with an error, as an engine's would.
  return 3;
}

}  // namespace fault_probe
