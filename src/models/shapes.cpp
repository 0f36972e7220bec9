// The projection shapes per model and tensor-parallel size, read off the MLA presets
// (MlaConfig::preset, src/mla/config.cpp): the model dimensions are defined there only.
#include <string>

#include "fp8proj/error.hpp"
#include "fp8proj/mla.hpp"
#include "fp8proj/models.hpp"

namespace fp8proj {

std::string ProjectionShape::label() const {
  return model + " " + gemm + " TP" + std::to_string(tp) + " " + std::to_string(n) + "x" + std::to_string(k);
}

std::vector<std::string> model_names() { return MlaConfig::preset_names(); }

std::vector<ProjectionShape> projection_shapes(std::string_view model, int tp) {
  bool known = false;
  for (const auto& name : model_names()) known = known || name == model;
  if (!known) {
    std::string names;
    for (const auto& n : model_names()) names += (names.empty() ? "" : ", ") + n;
    FP8PROJ_FAIL("unknown model '", model, "' (known: ", names, ")");
  }
  const int heads = MlaConfig::preset(model).heads;
  FP8PROJ_CHECK(tp >= 1 && heads % tp == 0, "TP size ", tp, " does not divide the ", heads, " heads of ", model);
  // One rank's shard: q_b_proj (q_proj without a q LoRA) is split along N by heads, o_proj along K.
  const MlaConfig c = MlaConfig::preset(model, tp, 0);
  return {
      {c.model, "q_b_proj", tp, c.q_dim(), c.q_in_dim()},
      {c.model, "o_proj", tp, c.hidden, c.o_in_dim()},
  };
}

std::vector<ProjectionShape> dense_gemm_shapes(std::string_view model, int tp) {
  std::vector<ProjectionShape> out = projection_shapes(model, tp);
  // fused_qkv_a is replicated on every rank (q_lora + kv_lora + rope rows: 2624 GLM-5, 2112
  // DeepSeek-V3, 576 without a q LoRA); kv_b_proj is split along N by heads, K = kv_lora.
  const MlaConfig c = MlaConfig::preset(model, tp, 0);
  out.push_back({c.model, "fused_qkv_a", tp, c.qkv_a_dim(), c.hidden});
  out.push_back({c.model, "kv_b_proj", tp, c.kv_b_dim(), c.kv_lora_rank});
  return out;
}
}  // namespace fp8proj
