// The MLA attention tensors of one layer, by their Hugging Face DeepSeek/GLM names, loaded
// from a Checkpoint with every shape checked against the model's dimensions.
//
//   model.layers.{i}.self_attn.<module>.weight, shapes [out, in]:
//     q_a_proj            [q_lora_rank, hidden]                       (q_lora_rank > 0)
//     q_a_layernorm       [q_lora_rank]                               (q_lora_rank > 0)
//     q_b_proj            [heads * (qk_nope + qk_rope), q_lora_rank]  (q_lora_rank > 0)
//     q_proj              [heads * (qk_nope + qk_rope), hidden]       (q_lora_rank = 0, e.g.
//                                                                      DeepSeek-V2-Lite)
//     kv_a_proj_with_mqa  [kv_lora_rank + qk_rope, hidden]
//     kv_a_layernorm      [kv_lora_rank]
//     kv_b_proj           [heads * (qk_nope + v_head), kv_lora_rank]
//     o_proj              [hidden, heads * v_head]
//   Example (GLM-5: hidden 6144, 64 heads, q_lora 2048, kv_lora 512, 192/64/256):
//   q_b_proj [16384, 2048], o_proj [6144, 16384].
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fp8proj/bf16.hpp"
#include "fp8proj/checkpoint.hpp"

namespace fp8proj {

// The dimensions the shapes follow from (a model's config.json, unsharded).
struct MlaDims {
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t q_lora_rank = 0;  // 0: no q LoRA, a plain q_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope = 0;
  int64_t qk_rope = 0;
  int64_t v_head = 0;
};

enum class MlaTensor : uint8_t {
  q_a_proj, q_a_layernorm, q_b_proj, q_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj,
};

std::string_view mla_module_name(MlaTensor tensor);         // "q_b_proj"
std::string mla_tensor_name(int layer, MlaTensor tensor);   // "model.layers.3.self_attn.q_b_proj.weight"
std::vector<int64_t> mla_tensor_shape(const MlaDims& dims, MlaTensor tensor);

// One layer's attention tensors on the host. Projections come as the checkpoint holds them
// (bf16, or FP8 with its scales); norm weights as bf16.
struct MlaLayerTensors {
  int layer = 0;
  std::optional<HostWeight> q_a_proj;  // with q LoRA
  std::vector<bf16> q_a_layernorm;     // with q LoRA; empty without
  std::optional<HostWeight> q_b_proj;  // with q LoRA
  std::optional<HostWeight> q_proj;    // without q LoRA
  HostWeight kv_a_proj_with_mqa;
  std::vector<bf16> kv_a_layernorm;
  HostWeight kv_b_proj;
  HostWeight o_proj;
};

// Throws (naming the file and tensor) for a missing tensor, a shape that does not follow from
// `dims`, an FP8 weight without valid scales, or a dtype that cannot be read; a checkpoint
// whose q layout (q_proj vs q_a/q_b) disagrees with dims.q_lora_rank says so.
MlaLayerTensors load_mla_layer(const Checkpoint& checkpoint, int layer, const MlaDims& dims);

}  // namespace fp8proj
