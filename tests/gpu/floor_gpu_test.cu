// The measuring tools of include/fp8proj/floor.hpp on the GPU: the read kernel reads every byte
// (its sink words fold to the xor of the data, whatever the grid), the measured bandwidth is
// plausible and cached, and captured calls replay exactly the calls captured. Skipped, with the
// reason, without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "fp8proj/error.hpp"
#include "fp8proj/floor.hpp"
#include "fp8proj/memory.hpp"
#include "gpu_test_util.hpp"

namespace fp8proj::testing {
namespace {

class FloorGpu : public GpuTest {};

__global__ void add_to_slot(uint32_t* slots, int i) { slots[i] += static_cast<uint32_t>(i + 1); }

// The xor of the data as the read kernel folds it: 32-bit words, and tail bytes at byte b of
// their word.
uint32_t host_fold(const std::vector<uint8_t>& bytes) {
  uint32_t acc = 0;
  const size_t vec_bytes = bytes.size() / 16 * 16;
  for (size_t i = 0; i < vec_bytes; i += 4)
    acc ^= uint32_t{bytes[i]} | uint32_t{bytes[i + 1]} << 8 | uint32_t{bytes[i + 2]} << 16 |
           uint32_t{bytes[i + 3]} << 24;
  for (size_t b = vec_bytes; b < bytes.size(); ++b) acc ^= uint32_t{bytes[b]} << (8 * ((b - vec_bytes) % 4));
  return acc;
}

uint32_t device_fold(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const size_t words = read_kernel_sink_words();
  Buffer sink(MemorySpace::device, words * sizeof(uint32_t));
  fill_bytes(MemorySpace::device, sink.data(), sink.bytes(), 0);  // CTAs past the grid leave 0
  launch_read_kernel(a, a_bytes, b, b_bytes, sink.data<uint32_t>(), nullptr);
  const std::vector<uint32_t> got = to_host<uint32_t>(sink.data(), words);
  return std::accumulate(got.begin(), got.end(), 0u, [](uint32_t x, uint32_t y) { return x ^ y; });
}

TEST_F(FloorGpu, ReadKernelReadsEveryByte) {
  std::mt19937 rng(7);
  // A small weight, one with a scale tail that is not a multiple of 16 bytes, and one large
  // enough for the full grid and the unrolled loop (2112 x 7168 + its 17 x 56 scales).
  for (auto [a_bytes, b_bytes] : {std::pair<size_t, size_t>{4096, 0}, {128 * 384, 12}, {2112 * 7168, 17 * 56 * 4}}) {
    std::vector<uint8_t> a(a_bytes), b(b_bytes);
    for (auto& v : a) v = static_cast<uint8_t>(rng());
    for (auto& v : b) v = static_cast<uint8_t>(rng());
    const Buffer da = to_device(a);
    const Buffer db = b.empty() ? Buffer() : to_device(b);
    EXPECT_EQ(device_fold(da.data(), a_bytes, b_bytes ? db.data() : nullptr, b_bytes), host_fold(a) ^ host_fold(b))
        << a_bytes << " + " << b_bytes << " B";
    // Flipping one bit of the last byte changes the result as it changes the host's.
    const uint32_t before = host_fold(a) ^ host_fold(b);
    a.back() ^= 0x10;
    const Buffer da2 = to_device(a);
    const uint32_t after = device_fold(da2.data(), a_bytes, b_bytes ? db.data() : nullptr, b_bytes);
    EXPECT_EQ(after, host_fold(a) ^ host_fold(b)) << a_bytes;
    EXPECT_NE(after, before) << a_bytes;
  }
}

TEST_F(FloorGpu, ReadKernelRefusesUnalignedAndEmpty) {
  Buffer a(MemorySpace::device, 4096);
  Buffer sink(MemorySpace::device, read_kernel_sink_words() * sizeof(uint32_t));
  EXPECT_THROW(launch_read_kernel(a.data<uint8_t>() + 1, 1024, nullptr, 0, sink.data<uint32_t>(), nullptr), Error);
  EXPECT_THROW(launch_read_kernel(a.data(), 0, nullptr, 0, sink.data<uint32_t>(), nullptr), Error);
  EXPECT_THROW(launch_read_kernel(a.data(), 1024, nullptr, 16, sink.data<uint32_t>(), nullptr), Error);
}

TEST_F(FloorGpu, MeasuredBandwidthIsPlausibleAndCached) {
  const ReadBandwidth& bw = measured_read_bandwidth();
  EXPECT_GE(bw.bytes, size_t{1} << 30);
  EXPECT_EQ(bw.runs, 10);
  // Between 100 GB/s (any data-centre GPU streams faster) and 10 TB/s (above every HBM3e part).
  EXPECT_GT(bw.bytes_per_s, 1e11);
  EXPECT_LT(bw.bytes_per_s, 1e13);
  EXPECT_EQ(&measured_read_bandwidth(), &bw);  // once per process
}

TEST_F(FloorGpu, CapturedCallsReplayEveryCall) {
  // Call i adds i + 1 to slot i: the eager pass once, the capture not at all, each replay once.
  Buffer slots(MemorySpace::device, 8 * sizeof(uint32_t));
  fill_bytes(MemorySpace::device, slots.data(), slots.bytes(), 0);
  int host_calls = 0;
  CapturedCalls graph(
      [&](int i, StreamHandle s) {
        ++host_calls;
        add_to_slot<<<1, 1, 0, static_cast<cudaStream_t>(s)>>>(slots.data<uint32_t>(), i);
      },
      8);
  EXPECT_EQ(graph.calls(), 8);
  EXPECT_EQ(host_calls, 16);  // the eager pass and the capture
  graph.replay(nullptr);
  graph.replay(nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(host_calls, 16);  // a replay runs no host code
  const std::vector<uint32_t> got = to_host<uint32_t>(slots.data(), 8);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(got[i], 3u * uint32_t(i + 1)) << i;
  // The empty kernel, eager and in a graph, leaves the context usable.
  launch_empty_kernel(nullptr);
  CapturedCalls empty([](int, StreamHandle s) { launch_empty_kernel(s); }, 32);
  empty.replay(nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace fp8proj::testing
