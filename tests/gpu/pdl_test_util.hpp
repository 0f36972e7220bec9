// Helpers of the programmatic-dependent-launch tests (pdl_gpu_test.cu, mla_gpu_test.cu).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "core/device_testing.hpp"

namespace fp8proj::testing {

// Forces PDL on or off for a scope, then hands back to FP8PROJ_PDL, however the scope ends.
struct PdlOverride {
  explicit PdlOverride(bool on) { set_pdl_for_testing(on); }
  ~PdlOverride() { set_pdl_for_testing(std::nullopt); }
  PdlOverride(const PdlOverride&) = delete;
  PdlOverride& operator=(const PdlOverride&) = delete;
};

// Edges of a captured graph of type cudaGraphDependencyTypeProgrammatic: what a launch with
// cudaLaunchAttributeProgrammaticStreamSerialization becomes under stream capture. -1 when the
// graph cannot be read.
inline int programmatic_edges(cudaGraph_t graph) {
  size_t n = 0;
#if CUDART_VERSION >= 13000
  if (cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n) != cudaSuccess) return -1;
#else
  if (cudaGraphGetEdges_v2(graph, nullptr, nullptr, nullptr, &n) != cudaSuccess) return -1;
#endif
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
#if CUDART_VERSION >= 13000
  if (cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n) != cudaSuccess) return -1;
#else
  if (cudaGraphGetEdges_v2(graph, from.data(), to.data(), data.data(), &n) != cudaSuccess) return -1;
#endif
  int count = 0;
  for (size_t i = 0; i < n; ++i) count += data[i].type == cudaGraphDependencyTypeProgrammatic ? 1 : 0;
  return count;
}

}  // namespace fp8proj::testing
