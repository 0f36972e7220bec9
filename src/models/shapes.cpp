#include <string>

#include "fp8proj/error.hpp"
#include "fp8proj/models.hpp"

namespace fp8proj {

namespace {
struct ModelDims {
  const char* name;
  int64_t q_b_n;  // num_heads * (qk_nope + qk_rope): split by TP along N
  int64_t q_b_k;  // q_lora_rank
  int64_t o_n;    // hidden size
  int64_t o_k;    // num_heads * v_head_dim: split by TP along K
  int64_t heads;
  int64_t qkv_a_n;  // q_lora + kv_lora + qk_rope: fused_qkv_a's N, replicated on every rank
  int64_t kv_b_n;   // num_heads * (qk_nope + v_head): kv_b_proj's N, split by TP along N
  int64_t kv_lora;  // kv_b_proj's K
};

// GLM-5: 64 heads x (192 + 64) = 16384, q_lora 2048, hidden 6144, 64 x 256 = 16384.
// DeepSeek-V3: 128 x (128 + 64) = 24576, q_lora 1536, hidden 7168, 128 x 128 = 16384.
// DeepSeek-V2-Lite has no q_lora: its q_proj 3072x2048 stands in for q_b_proj.
constexpr ModelDims kModels[] = {
// fused_qkv_a: GLM-5 2048 + 512 + 64 = 2624, DeepSeek-V3 1536 + 512 + 64 = 2112, V2-Lite (no
// q LoRA) 512 + 64 = 576; kv_b_proj: 64 x (192 + 256) = 28672, 128 x (128 + 128) = 32768,
// 16 x (128 + 128) = 4096, K = kv_lora 512.
    {"glm5", 16384, 2048, 6144, 16384, 64, 2624, 28672, 512},
    {"deepseek-v3", 24576, 1536, 7168, 16384, 128, 2112, 32768, 512},
    {"deepseek-v2-lite", 3072, 2048, 2048, 2048, 16, 576, 4096, 512},
};
}  // namespace

std::string ProjectionShape::label() const {
  return model + " " + gemm + " TP" + std::to_string(tp) + " " + std::to_string(n) + "x" + std::to_string(k);
}

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const auto& m : kModels) names.emplace_back(m.name);
  return names;
}

std::vector<ProjectionShape> projection_shapes(std::string_view model, int tp) {
  for (const auto& m : kModels) {
    if (model != m.name) continue;
    FP8PROJ_CHECK(tp >= 1 && m.heads % tp == 0, "TP size ", tp, " does not divide the ", m.heads, " heads of ",
                  m.name);
    return {
        {m.name, "q_b_proj", tp, m.q_b_n / tp, m.q_b_k},
        {m.name, "o_proj", tp, m.o_n, m.o_k / tp},
    };
  }
  std::string known;
  for (const auto& n : model_names()) known += (known.empty() ? "" : ", ") + n;
  FP8PROJ_FAIL("unknown model '", model, "' (known: ", known, ")");
}

std::vector<ProjectionShape> dense_gemm_shapes(std::string_view model, int tp) {
  std::vector<ProjectionShape> out = projection_shapes(model, tp);
  for (const auto& m : kModels) {
    if (model != m.name) continue;
    out.push_back({m.name, "fused_qkv_a", tp, m.qkv_a_n, m.o_n});
    out.push_back({m.name, "kv_b_proj", tp, m.kv_b_n / tp, m.kv_lora});
  }
  return out;
}

}  // namespace fp8proj
