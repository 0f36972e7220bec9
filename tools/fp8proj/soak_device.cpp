// The soak's device plumbing (soak.hpp): created streams, CUDA graph capture and replay, async
// memsets, and whether the context survived an error. Without CUDA in the build the soak runs
// on the CPU reference only, and these are never reached (stubs that say so).
#include <fmt/format.h>

#include "fp8proj/error.hpp"
#include "soak.hpp"

#if FP8PROJ_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace fp8proj::cli::soak {

std::string Streams::name(int index) {
  if (index == 0) return "0 (legacy default)";
  return fmt::format("{} ({})", index, index % 2 ? "non-blocking" : "blocking");
}

#if FP8PROJ_WITH_CUDA

namespace {
void check(cudaError_t e, const char* what) {
  FP8PROJ_CHECK(e == cudaSuccess, "CUDA error ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ") in ", what);
}
cudaStream_t cuda(StreamHandle s) { return static_cast<cudaStream_t>(s); }
}  // namespace

Streams::Streams(int count) {
  for (int i = 1; i <= count; ++i) {
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, i % 2 ? cudaStreamNonBlocking : cudaStreamDefault), "cudaStreamCreate");
    streams_.push_back(s);
  }
}

Streams::~Streams() {
  for (void* s : streams_) cudaStreamDestroy(cuda(s));  // a dead context's error is reported elsewhere
}

StreamHandle Streams::get(int index) const {
  FP8PROJ_CHECK(index >= 0 && index <= static_cast<int>(streams_.size()), "soak: no stream ", index);
  return index == 0 ? nullptr : streams_[index - 1];
}

Graph::~Graph() {
  if (capturing_) {  // a call threw inside the capture: end it, so the stream is usable again
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(cuda(capturing_), &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();  // that error belongs to the call that threw, which is reported
  }
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
}

void Graph::begin(StreamHandle s) {
  FP8PROJ_CHECK(s != nullptr, "soak: no graph capture on the legacy default stream");
  check(cudaStreamBeginCapture(cuda(s), cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  capturing_ = s;
}

void Graph::end(StreamHandle s) {
  cudaGraph_t g = nullptr;
  capturing_ = nullptr;
  check(cudaStreamEndCapture(cuda(s), &g), "cudaStreamEndCapture");
  graph_ = g;
  cudaGraphExec_t e = nullptr;
  check(cudaGraphInstantiate(&e, g, 0), "cudaGraphInstantiate");
  exec_ = e;
}

void Graph::launch(StreamHandle s) const {
  check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), cuda(s)), "cudaGraphLaunch");
}

void memset_async(void* p, uint8_t value, size_t bytes, StreamHandle s) {
  check(cudaMemsetAsync(p, value, bytes, cuda(s)), "cudaMemsetAsync");
}

void synchronize(StreamHandle s) { check(cudaStreamSynchronize(cuda(s)), "cudaStreamSynchronize"); }

void device_synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

std::string context_state() {
  const cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) return "alive";
  return fmt::format("dead: {} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
}

#else  // no CUDA in this build: the CPU reference only

Streams::Streams(int count) { FP8PROJ_CHECK(count == 0, "soak: streams need CUDA, which this build has not"); }
Streams::~Streams() = default;
StreamHandle Streams::get(int index) const {
  FP8PROJ_CHECK(index == 0, "soak: no stream ", index, " without CUDA");
  return nullptr;
}
Graph::~Graph() { (void)capturing_, (void)graph_, (void)exec_; }  // never set without CUDA
void Graph::begin(StreamHandle) { FP8PROJ_FAIL("soak: CUDA graphs need CUDA, which this build has not"); }
void Graph::end(StreamHandle) { FP8PROJ_FAIL("soak: CUDA graphs need CUDA, which this build has not"); }
void Graph::launch(StreamHandle) const { FP8PROJ_FAIL("soak: CUDA graphs need CUDA, which this build has not"); }
void memset_async(void*, uint8_t, size_t, StreamHandle) { FP8PROJ_FAIL("soak: no device memory without CUDA"); }
void synchronize(StreamHandle) {}
void device_synchronize() {}
std::string context_state() { return "alive"; }

#endif

}  // namespace fp8proj::cli::soak
