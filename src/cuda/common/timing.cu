// Device timing (include/fp8proj/timing.hpp): events around each call, L2 flushed before it.
#include <vector>

#include "core/cuda_check.hpp"
#include "fp8proj/device.hpp"
#include "fp8proj/timing.hpp"

namespace fp8proj {

namespace {
// A buffer twice the L2 size; writing it evicts whatever the timed call would find cached.
struct L2Flusher {
  void* buf = nullptr;
  size_t bytes = 0;
  L2Flusher() {
    bytes = static_cast<size_t>(std::max<int64_t>(current_device().l2_bytes, 50 << 20)) * 2;
    CUDA_CHECK(cudaMalloc(&buf, bytes));
  }
  ~L2Flusher() { cudaFree(buf); }
  void flush(cudaStream_t s) { CUDA_CHECK(cudaMemsetAsync(buf, 0x5a, bytes, s)); }
};

L2Flusher& flusher() {
  static L2Flusher f;
  return f;
}
}  // namespace

void flush_l2(StreamHandle stream) { flusher().flush(static_cast<cudaStream_t>(stream)); }

Timing time_device(const std::function<void(StreamHandle)>& fn, StreamHandle stream, const TimingOptions& o) {
  FP8PROJ_CHECK(o.reps > 0 && o.warmup >= 0, "timing needs reps > 0 and warmup >= 0");
  auto s = static_cast<cudaStream_t>(stream);
  for (int i = 0; i < o.warmup; ++i) fn(stream);
  CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<cudaEvent_t> ev(2 * o.reps);
  for (auto& e : ev) CUDA_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < o.reps; ++i) {
    if (o.flush_l2) flush_l2(stream);
    CUDA_CHECK(cudaEventRecord(ev[2 * i], s));
    fn(stream);
    CUDA_CHECK(cudaEventRecord(ev[2 * i + 1], s));
  }
  CUDA_CHECK(cudaStreamSynchronize(s));
  std::vector<double> us(o.reps);
  for (int i = 0; i < o.reps; ++i) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]));
    us[i] = 1000.0 * ms;
  }
  for (auto& e : ev) cudaEventDestroy(e);
  return summarize(std::move(us));
}

}  // namespace fp8proj
