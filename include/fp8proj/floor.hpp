// The byte floor of a memory-bound GEMM, and the kernels that measure it (docs/decode.md).
//
// At decode (M <= 64 tokens) a projection must read its whole weight once; nothing it does can
// take less time than those bytes at the GPU's streaming bandwidth. `fp8proj floor` sets each
// GEMM's time beside that floor and beside the fixed costs every kernel pays (an empty kernel,
// a pure read of the same bytes); `fp8proj bench` and `fp8proj layer` print the floor beside
// their small-M times.
//
// The pure functions are host code (unit-tested without a GPU); the kernels and the measured
// bandwidth need a CUDA build and a GPU (without one they throw fp8proj::Error saying so).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "fp8proj/tensor.hpp"

namespace fp8proj {

// ---- the floor arithmetic (host) ----

// Bytes a block-scaled FP8 weight [n, k] occupies and a GEMM must read: the e4m3 values
// (n * k) plus the fp32 scales of its 128 x 128 blocks (ceil(n/128) * ceil(k/128) * 4).
// 7168 x 8192: 58,720,256 + 56 * 64 * 4 = 58,734,592 B. Throws on n or k below 1.
size_t fp8_weight_bytes(int64_t n, int64_t k);

// The time `bytes` take at `bytes_per_s`, in microseconds. Throws unless bytes_per_s > 0.
double byte_floor_us(double bytes, double bytes_per_s);

// time / floor (how many floors a call takes); 0 when either is not positive.
double floor_ratio(double us, double floor_us);

// Achieved bandwidth of a call that read `bytes` in `us`, in GB/s (1e9 B/s); 0 when us <= 0.
double achieved_gbps(double bytes, double us);

// How many distinct copies of a `bytes_per_copy` weight a rotation needs so that the L2 cannot
// hold them: the smallest W with W * bytes_per_copy >= factor * l2_bytes (at least 1), capped
// at max_copies. factor 3: a copy comes back after at least two L2-sizes of other copies passed
// through, so with LRU-like replacement none of its lines survive. Throws on bytes_per_copy 0,
// factor <= 0 or max_copies < 1.
int rotation_copies(size_t bytes_per_copy, size_t l2_bytes, double factor = 3.0, int max_copies = 256);

// Calls captured in one graph replay over `copies` copies: the smallest multiple of `copies`
// that is >= min_calls (every copy read equally often). Throws on copies < 1 or min_calls < 1.
int graph_calls(int copies, int min_calls);

// ---- measured on the GPU ----

// A kernel of one CTA of 32 threads that does nothing: what the launch and the scheduling of
// any kernel cost, eagerly and back to back in a graph.
void launch_empty_kernel(StreamHandle stream);

// Reads every byte of [a, a + a_bytes) and [b, b + b_bytes) once (16-byte loads where aligned,
// spread over up to 8 CTAs per SM), and writes one 32-bit word per CTA to `sink` (an xor of
// what it read, so the loads cannot be optimised away). The pure weight-streaming floor of a
// GEMM is this kernel over its weight values and scales. a and b must be 16-byte aligned
// (cudaMalloc'd buffers are); b may be null with b_bytes 0. sink holds read_kernel_sink_words().
void launch_read_kernel(const void* a, size_t a_bytes, const void* b, size_t b_bytes, uint32_t* sink,
                        StreamHandle stream);
size_t read_kernel_sink_words();

// This GPU's streaming read bandwidth: the read kernel over `bytes` (at least 1 GiB, far past
// any L2), best of `runs` event-timed runs after two warm-up runs. Measured once per process and
// device (the first call allocates and frees the buffer); later calls return the cached value.
struct ReadBandwidth {
  double bytes_per_s = 0;
  size_t bytes = 0;
  int runs = 0;
  double best_us = 0;
};
const ReadBandwidth& measured_read_bandwidth();

// `calls` calls captured back to back in one CUDA graph on a private stream: call(i, stream)
// issues call i (a rotation picks its copy by i). One eager pass runs first, so that whatever a
// backend sets up lazily happens outside the capture. replay() launches the graph on any
// stream; the time of a replay divided by calls() is the per-call time in graph replay.
class CapturedCalls {
 public:
  CapturedCalls(const std::function<void(int call, StreamHandle stream)>& call, int calls);
  ~CapturedCalls();
  CapturedCalls(const CapturedCalls&) = delete;
  CapturedCalls& operator=(const CapturedCalls&) = delete;
  void replay(StreamHandle stream) const;
  int calls() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fp8proj
