// The projection shapes that matter (docs/design.md, "Parts"), per model and tensor-parallel size.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fp8proj {

struct ProjectionShape {
  std::string model;  // "glm5", "deepseek-v3", "deepseek-v2-lite"
  std::string gemm;   // "q_b_proj", "o_proj", "fused_qkv_a" or "kv_b_proj"
  int tp = 1;
  int64_t n = 0, k = 0;  // of one tensor-parallel shard
  std::string label() const;  // "glm5 q_b_proj TP1 16384x2048"
};

// Throws fp8proj::Error for an unknown model or a TP size the model cannot be split by.
std::vector<ProjectionShape> projection_shapes(std::string_view model, int tp);
// Every dense GEMM of the model's MLA block at a TP size: projection_shapes (q_b_proj, o_proj,
// the reference design's tagged pair) then fused_qkv_a (replicated: the same N x K on every
// rank; hidden as K) and kv_b_proj (prefill only; N = heads / tp * (nope + v), K = kv_lora).
std::vector<ProjectionShape> dense_gemm_shapes(std::string_view model, int tp);
std::vector<std::string> model_names();

}  // namespace fp8proj
