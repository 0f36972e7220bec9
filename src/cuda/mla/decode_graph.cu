// MlaDecodeGraph (include/fp8proj/mla.hpp): one decode step of an MLA block captured in a CUDA
// graph on a private stream and replayed on any stream. The step reads positions and cache
// starts from device arrays, so a replay after the caller updates them decodes the next token
// without re-capturing.
#include <cuda_runtime.h>

#include "core/cuda_check.hpp"
#include "core/device_fault.hpp"
#include "cuda/common/graph_capture.hpp"
#include "fp8proj/error.hpp"
#include "fp8proj/mla.hpp"

namespace fp8proj {

struct MlaDecodeGraph::Impl {
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Impl() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (stream) cudaStreamDestroy(stream);
  }
};

MlaDecodeGraph::MlaDecodeGraph(MlaBlock& block, const bf16* x, const MlaDecodeBatch& batch, bf16* y)
    : impl_(std::make_unique<Impl>()) {
  capture(block, batch, [&](StreamHandle s) { block.decode(x, batch, y, s); });
}

MlaDecodeGraph::MlaDecodeGraph(MlaBlock& block, const bf16* residual, const bf16* norm_weight, float eps,
                               const MlaDecodeBatch& batch, bf16* y)
    : impl_(std::make_unique<Impl>()) {
  capture(block, batch, [&](StreamHandle s) { block.decode_residual(residual, norm_weight, eps, batch, y, s); });
}

void MlaDecodeGraph::capture(MlaBlock& block, const MlaDecodeBatch& batch,
                             const std::function<void(StreamHandle)>& step) {
  check_device_usable();
  FP8PROJ_CHECK(block.space() == MemorySpace::device, block.options().name,
                ": MlaDecodeGraph captures device work; this block lives on the host");
  FP8PROJ_CHECK(batch.batch > 0, block.options().name, ": MlaDecodeGraph needs a batch of at least one sequence");
  Impl& s = *impl_;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  // One eager step first: anything a backend sets up lazily on its first call for this M
  // happens outside the capture (and argument errors surface here, not inside a capture). It
  // writes the same cache rows the graph will.
  step(s.stream);
  CUDA_CHECK(cudaStreamSynchronize(s.stream));
  gpu::capture_graph(s.stream, [&] { step(s.stream); }, &s.graph, &s.exec);
}

MlaDecodeGraph::~MlaDecodeGraph() = default;

void MlaDecodeGraph::replay(StreamHandle stream) {
  check_device_usable();  // a replay on a dead context would only return its error
  CUDA_CHECK(cudaGraphLaunch(impl_->exec, static_cast<cudaStream_t>(stream)));
}

}  // namespace fp8proj
