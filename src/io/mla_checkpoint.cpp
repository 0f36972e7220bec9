// The MLA attention tensors of one layer by their Hugging Face names (mla_checkpoint.hpp).
#include "fp8proj/mla_checkpoint.hpp"

#include "fp8proj/error.hpp"
#include "io/safetensors.hpp"

namespace fp8proj {

namespace {

struct ExpectedShape {
  std::vector<int64_t> shape;
  const char* rule;  // how it follows from the dims, for error messages
};

ExpectedShape expected_shape(const MlaDims& d, MlaTensor t) {
  const int64_t qk_head = d.qk_nope + d.qk_rope;
  switch (t) {
    case MlaTensor::q_a_proj: return {{d.q_lora_rank, d.hidden}, "[q_lora_rank, hidden]"};
    case MlaTensor::q_a_layernorm: return {{d.q_lora_rank}, "[q_lora_rank]"};
    case MlaTensor::q_b_proj: return {{d.heads * qk_head, d.q_lora_rank}, "[heads * (qk_nope + qk_rope), q_lora_rank]"};
    case MlaTensor::q_proj: return {{d.heads * qk_head, d.hidden}, "[heads * (qk_nope + qk_rope), hidden]"};
    case MlaTensor::kv_a_proj_with_mqa: return {{d.kv_lora_rank + d.qk_rope, d.hidden}, "[kv_lora_rank + qk_rope, hidden]"};
    case MlaTensor::kv_a_layernorm: return {{d.kv_lora_rank}, "[kv_lora_rank]"};
    case MlaTensor::kv_b_proj: return {{d.heads * (d.qk_nope + d.v_head), d.kv_lora_rank}, "[heads * (qk_nope + v_head), kv_lora_rank]"};
    case MlaTensor::o_proj: return {{d.hidden, d.heads * d.v_head}, "[hidden, heads * v_head]"};
  }
  FP8PROJ_FAIL("invalid MlaTensor value ", static_cast<int>(t));
}

void check_dims(const MlaDims& d) {
  FP8PROJ_CHECK(d.hidden > 0 && d.heads > 0 && d.q_lora_rank >= 0 && d.kv_lora_rank > 0 && d.qk_nope > 0 &&
                    d.qk_rope > 0 && d.v_head > 0,
                "MLA dims must be positive (q_lora_rank may be 0): hidden ", d.hidden, ", heads ", d.heads,
                ", q_lora_rank ", d.q_lora_rank, ", kv_lora_rank ", d.kv_lora_rank, ", qk_nope ", d.qk_nope,
                ", qk_rope ", d.qk_rope, ", v_head ", d.v_head);
}

// info() with the expected shape checked; the message says which dims the shape comes from,
// since a mismatch usually means the dims (the config) and the checkpoint are of two models.
const TensorInfo& expect_mla(const Checkpoint& ck, int layer, const MlaDims& d, MlaTensor t) {
  const std::string name = mla_tensor_name(layer, t);
  const ExpectedShape e = expected_shape(d, t);
  const TensorInfo& info = ck.info(name);
  FP8PROJ_CHECK(info.shape == e.shape, "tensor '", name, "' in '", info.file, "' has shape ", info.shape_string(),
                ", but the MLA dims give ", e.rule, " = ", io::format_shape(e.shape));
  return info;
}

HostWeight load_projection(const Checkpoint& ck, int layer, const MlaDims& d, MlaTensor t) {
  const TensorInfo& info = expect_mla(ck, layer, d, t);
  return load_projection_weight(ck, info.name, info.shape[0], info.shape[1]);
}

std::vector<bf16> load_norm(const Checkpoint& ck, int layer, const MlaDims& d, MlaTensor t) {
  return ck.read_bf16(expect_mla(ck, layer, d, t).name);
}

}  // namespace

std::string_view mla_module_name(MlaTensor tensor) {
  switch (tensor) {
    case MlaTensor::q_a_proj: return "q_a_proj";
    case MlaTensor::q_a_layernorm: return "q_a_layernorm";
    case MlaTensor::q_b_proj: return "q_b_proj";
    case MlaTensor::q_proj: return "q_proj";
    case MlaTensor::kv_a_proj_with_mqa: return "kv_a_proj_with_mqa";
    case MlaTensor::kv_a_layernorm: return "kv_a_layernorm";
    case MlaTensor::kv_b_proj: return "kv_b_proj";
    case MlaTensor::o_proj: return "o_proj";
  }
  FP8PROJ_FAIL("invalid MlaTensor value ", static_cast<int>(tensor));
}

std::string mla_tensor_name(int layer, MlaTensor tensor) {
  FP8PROJ_CHECK(layer >= 0, "layer index must be non-negative, got ", layer);
  return "model.layers." + std::to_string(layer) + ".self_attn." + std::string(mla_module_name(tensor)) + ".weight";
}

std::vector<int64_t> mla_tensor_shape(const MlaDims& dims, MlaTensor tensor) {
  check_dims(dims);
  return expected_shape(dims, tensor).shape;
}

MlaLayerTensors load_mla_layer(const Checkpoint& checkpoint, int layer, const MlaDims& dims) {
  check_dims(dims);
  const bool q_lora = dims.q_lora_rank > 0;
  // The two q layouts are told apart by which tensors exist; a mismatch with the dims would
  // otherwise surface as a bare "missing tensor", which does not say what to change.
  const std::string want = mla_tensor_name(layer, q_lora ? MlaTensor::q_a_proj : MlaTensor::q_proj);
  const std::string other = mla_tensor_name(layer, q_lora ? MlaTensor::q_proj : MlaTensor::q_a_proj);
  FP8PROJ_CHECK(checkpoint.find(want) || !checkpoint.find(other), "checkpoint '", checkpoint.path(), "' has '",
                other, "' and no '", want, "': ",
                q_lora ? "its layers have no q LoRA (as DeepSeek-V2-Lite), so q_lora_rank must be 0"
                       : "its layers have a q LoRA, so q_lora_rank must be its rank, not 0");

  MlaLayerTensors t;
  t.layer = layer;
  if (q_lora) {
    t.q_a_proj = load_projection(checkpoint, layer, dims, MlaTensor::q_a_proj);
    t.q_a_layernorm = load_norm(checkpoint, layer, dims, MlaTensor::q_a_layernorm);
    t.q_b_proj = load_projection(checkpoint, layer, dims, MlaTensor::q_b_proj);
  } else {
    t.q_proj = load_projection(checkpoint, layer, dims, MlaTensor::q_proj);
  }
  t.kv_a_proj_with_mqa = load_projection(checkpoint, layer, dims, MlaTensor::kv_a_proj_with_mqa);
  t.kv_a_layernorm = load_norm(checkpoint, layer, dims, MlaTensor::kv_a_layernorm);
  t.kv_b_proj = load_projection(checkpoint, layer, dims, MlaTensor::kv_b_proj);
  t.o_proj = load_projection(checkpoint, layer, dims, MlaTensor::o_proj);
  return t;
}

}  // namespace fp8proj
