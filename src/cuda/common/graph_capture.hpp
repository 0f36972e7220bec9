// Capturing a stream's work into an instantiated CUDA graph, shared by the MLA decode graph and
// fp8proj floor's captured calls.
#pragma once

#include <cuda_runtime.h>

#include "core/cuda_check.hpp"

namespace fp8proj::gpu {

// Records what `record()` enqueues on `stream` into `*graph` and instantiates `*exec`. The caller
// runs the work once eagerly first, so that lazy set-up (plans, kernel attributes) happens outside
// the capture. Thread-local mode: an allocation or synchronisation on this thread during the
// capture is an error (it would not be replayed); other threads are not affected. If `record`
// throws, the capture is ended and its partial graph destroyed, so the stream is usable again.
template <class Record>
void capture_graph(cudaStream_t stream, Record&& record, cudaGraph_t* graph, cudaGraphExec_t* exec) {
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    record();
  } catch (...) {
    cudaGraph_t broken = nullptr;
    cudaStreamEndCapture(stream, &broken);
    if (broken) cudaGraphDestroy(broken);
    throw;
  }
  CUDA_CHECK(cudaStreamEndCapture(stream, graph));
  CUDA_CHECK(cudaGraphInstantiate(exec, *graph, 0));
}

}  // namespace fp8proj::gpu
