// The device half of include/fp8proj/floor.hpp: the empty kernel, the weight-streaming read
// kernel, this GPU's measured read bandwidth, and calls captured back to back in a CUDA graph.
// What `fp8proj floor` (tools/fp8proj/cmd_floor.cpp) sets a GEMM's time beside (docs/decode.md).
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

#include "core/cuda_check.hpp"
#include "core/device_fault.hpp"
#include "cuda/common/graph_capture.hpp"
#include "fp8proj/device.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/floor.hpp"

namespace fp8proj {

namespace {

// 256 threads x 8 CTAs = 2048 threads, an sm_90 SM's maximum: every SM keeps as many loads in
// flight as it can. Four independent 16-byte loads per thread and iteration (64 B in flight per
// thread, 128 KiB per SM) cover HBM latency x bandwidth per SM (~1 us x 4.8 TB/s / 132 SMs =
// 36 KB) several times over.
constexpr int kReadThreads = 256;
constexpr int kReadUnroll = 4;
constexpr int kMaxCtasPerSm = 8;

__global__ void floor_empty_kernel() {}

__device__ __forceinline__ uint32_t fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// This thread's share of one segment: 16-byte loads at i, i + stride, ... (grid-stride), four
// independent loads per iteration; the last < 16 bytes by thread 0 of CTA 0.
__device__ __forceinline__ uint32_t read_segment(const uint4* p, size_t bytes, size_t first, size_t stride) {
  const size_t vecs = bytes / 16;
  uint32_t acc = 0;
  size_t i = first;
  for (; i + (kReadUnroll - 1) * stride < vecs; i += kReadUnroll * stride) {
    uint4 v[kReadUnroll];
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u) v[u] = __ldg(p + i + u * stride);
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u) acc ^= fold(v[u]);
  }
  for (; i < vecs; i += stride) acc ^= fold(__ldg(p + i));
  if (first == 0) {
    const auto* tail = reinterpret_cast<const uint8_t*>(p) + vecs * 16;
    for (size_t b = 0; b < bytes % 16; ++b) acc ^= uint32_t{tail[b]} << (8 * (b % 4));
  }
  return acc;
}

__global__ void __launch_bounds__(kReadThreads) floor_read_kernel(const uint4* a, size_t a_bytes, const uint4* b,
                                                            size_t b_bytes, uint32_t* sink) {
  const size_t first = size_t{blockIdx.x} * kReadThreads + threadIdx.x;
  const size_t stride = size_t{gridDim.x} * kReadThreads;
  uint32_t acc = read_segment(a, a_bytes, first, stride);
  if (b_bytes > 0) acc ^= read_segment(b, b_bytes, first, stride);
  // One word per CTA: the xor of every thread's.
  for (int off = 16; off > 0; off /= 2) acc ^= __shfl_xor_sync(0xffffffffu, acc, off);
  __shared__ uint32_t warp_acc[kReadThreads / 32];
  if (threadIdx.x % 32 == 0) warp_acc[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t all = 0;
    for (int w = 0; w < kReadThreads / 32; ++w) all ^= warp_acc[w];
    sink[blockIdx.x] = all;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

void launch_empty_kernel(StreamHandle stream) {
  floor_empty_kernel<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>();
  CUDA_CHECK_LAUNCH();
}

size_t read_kernel_sink_words() { return static_cast<size_t>(std::max(current_device().sm_count, 1)) * kMaxCtasPerSm; }

void launch_read_kernel(const void* a, size_t a_bytes, const void* b, size_t b_bytes, uint32_t* sink,
                        StreamHandle stream) {
  FP8PROJ_CHECK(a != nullptr && a_bytes > 0 && sink != nullptr, "read kernel: nothing to read or no sink");
  FP8PROJ_CHECK(aligned16(a) && aligned16(b), "read kernel: buffers must be 16-byte aligned, got ", a, " and ", b);
  FP8PROJ_CHECK(b != nullptr || b_bytes == 0, "read kernel: b is null but b_bytes is ", b_bytes);
  const auto vecs = static_cast<int64_t>((a_bytes + b_bytes) / 16 + 1);
  const int64_t ctas = std::clamp<int64_t>(ceil_div(vecs, int64_t{kReadThreads} * kReadUnroll), 1,
                                           static_cast<int64_t>(read_kernel_sink_words()));
  floor_read_kernel<<<static_cast<unsigned>(ctas), kReadThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const uint4*>(a), a_bytes, static_cast<const uint4*>(b), b_bytes, sink);
  CUDA_CHECK_LAUNCH();
}

const ReadBandwidth& measured_read_bandwidth() {
  static std::mutex mu;
  static std::vector<std::pair<int, ReadBandwidth>> cache;  // (device, result)
  check_device_usable();
  FP8PROJ_CHECK(current_device().present, "measuring the read bandwidth needs a GPU (", current_device().why_absent,
                ")");
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  for (const auto& [d, bw] : cache)
    if (d == dev) return bw;
  // 1 GiB or 16 L2 sizes, whichever is more: the L2 serves a negligible share of the reads.
  const size_t bytes = std::max<size_t>(size_t{1} << 30, 16 * static_cast<size_t>(current_device().l2_bytes));
  constexpr int kWarmup = 2, kRuns = 10;
  void* buf = nullptr;
  uint32_t* sink = nullptr;
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  ReadBandwidth r;
  r.bytes = bytes;
  r.runs = kRuns;
  try {
    CUDA_CHECK(cudaMalloc(&buf, bytes));
    CUDA_CHECK(cudaMalloc(&sink, read_kernel_sink_words() * sizeof(uint32_t)));
    CUDA_CHECK(cudaMemset(buf, 0x5a, bytes));
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    for (int i = 0; i < kWarmup; ++i) launch_read_kernel(buf, bytes, nullptr, 0, sink, nullptr);
    double best_us = 0;
    for (int i = 0; i < kRuns; ++i) {
      CUDA_CHECK(cudaEventRecord(e0, nullptr));
      launch_read_kernel(buf, bytes, nullptr, 0, sink, nullptr);
      CUDA_CHECK(cudaEventRecord(e1, nullptr));
      CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      const double us = 1000.0 * ms;
      if (i == 0 || us < best_us) best_us = us;
    }
    r.best_us = best_us;
    r.bytes_per_s = static_cast<double>(bytes) / (best_us * 1e-6);
  } catch (...) {
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(sink);
    cudaFree(buf);
    throw;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(sink);
  cudaFree(buf);
  FP8PROJ_CHECK(r.bytes_per_s > 0, "measured read bandwidth is not positive (", r.best_us, " us for ", bytes, " B)");
  cache.emplace_back(dev, r);
  return cache.back().second;
}

struct CapturedCalls::Impl {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  int calls = 0;
  ~Impl() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (stream) cudaStreamDestroy(stream);
  }
};

CapturedCalls::CapturedCalls(const std::function<void(int, StreamHandle)>& call, int calls)
    : impl_(std::make_unique<Impl>()) {
  check_device_usable();
  FP8PROJ_CHECK(calls >= 1, "CapturedCalls: at least one call, got ", calls);
  Impl& s = *impl_;
  s.calls = calls;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  // One eager pass: lazy set-up (plans, kernel attributes, the watchdog) happens outside the capture.
  for (int i = 0; i < calls; ++i) call(i, s.stream);
  CUDA_CHECK(cudaStreamSynchronize(s.stream));
  gpu::capture_graph(s.stream, [&] { for (int i = 0; i < calls; ++i) call(i, s.stream); }, &s.graph, &s.exec);
}

CapturedCalls::~CapturedCalls() = default;

void CapturedCalls::replay(StreamHandle stream) const {
  check_device_usable();
  CUDA_CHECK(cudaGraphLaunch(impl_->exec, static_cast<cudaStream_t>(stream)));
}

int CapturedCalls::calls() const { return impl_->calls; }

}  // namespace fp8proj
