// How every number in this project is measured: warm-up, then the median of many timed
// repetitions; on the GPU with device events, the L2 cache flushed (a write of twice its
// size) before each timed call, as a model's other layers would flush it.
#pragma once

#include <functional>

#include "fp8proj/tensor.hpp"

namespace fp8proj {

struct TimingOptions {
  int warmup = 5;
  int reps = 30;
  bool flush_l2 = true;
};

struct Timing {
  double median_us = 0, min_us = 0, max_us = 0;
  int reps = 0;
};

// Median, minimum and maximum of the samples (microseconds); throws on an empty list.
Timing summarize(std::vector<double> us);

// Times fn() on the host clock.
Timing time_host(const std::function<void()>& fn, const TimingOptions& options = {});
// Times fn(stream) with CUDA events on `stream` (nullptr: the legacy default stream).
Timing time_device(const std::function<void(StreamHandle)>& fn, StreamHandle stream,
                   const TimingOptions& options = {});

// The flush time_device does before each timed call: a write of twice the L2 size on
// `stream`, which leaves the cache full of dirty lines as a model's other layers do. Device
// only. The first call allocates the buffer (make it outside CUDA-graph capture); later calls
// are one cudaMemsetAsync and can be captured.
void flush_l2(StreamHandle stream);

}  // namespace fp8proj
