// Device side of profile_stages (include/fp8proj/mla.hpp): an event at the start of each run
// and one at every stage boundary the block's hook reports, on the legacy stream, with the L2
// flushed (a memset of twice its size) before each timed run as time_device does. Benchmark
// code: events are created here, outside any graph capture.
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "core/cuda_check.hpp"
#include "fp8proj/device.hpp"
#include "fp8proj/mla.hpp"

namespace fp8proj {

void profile_stages_device(const std::function<void(StreamHandle, const MlaStageHook&)>& run,
                           const TimingOptions& options, std::vector<MlaStage>& stages,
                           std::vector<std::vector<double>>& marks_us) {
  const cudaStream_t stream = nullptr;
  const size_t flush_bytes = static_cast<size_t>(std::max<int64_t>(current_device().l2_bytes, 50 << 20)) * 2;
  void* flush = nullptr;
  CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
  std::vector<std::vector<cudaEvent_t>> events(static_cast<size_t>(options.reps));
  auto release = [&] {
    for (auto& rep : events)
      for (cudaEvent_t e : rep) cudaEventDestroy(e);
    cudaFree(flush);
  };
  try {
    for (int i = 0; i < options.warmup; ++i) run(stream, {});
    CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int r = 0; r < options.reps; ++r) {
      std::vector<cudaEvent_t>& ev = events[static_cast<size_t>(r)];
      std::vector<MlaStage> seen;
      auto mark = [&] {
        cudaEvent_t e;
        CUDA_CHECK(cudaEventCreate(&e));
        ev.push_back(e);
        CUDA_CHECK(cudaEventRecord(e, stream));
      };
      if (options.flush_l2) CUDA_CHECK(cudaMemsetAsync(flush, 0x5a, flush_bytes, stream));
      mark();
      run(stream, [&](MlaStage s, StreamHandle) {
        seen.push_back(s);
        mark();
      });
      stages = seen;
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));
    marks_us.clear();
    for (const auto& ev : events) {
      std::vector<double> t;
      for (size_t i = 1; i < ev.size(); ++i) {
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[i]));
        t.push_back(1000.0 * ms);
      }
      marks_us.push_back(t);
    }
  } catch (...) {
    release();
    throw;
  }
  release();
}

}  // namespace fp8proj
