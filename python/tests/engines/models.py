"""Hugging Face configs of GLM-5 and DeepSeek-V3 for the engine plugin tests.

The attention dimensions are the real ones (so the tagged projections have
the real TP1 shapes: GLM-5 q_b_proj 16384x2048, o_proj 6144x16384; DeepSeek-V3
24576x1536 and 7168x16384); depth, experts, MLP widths and vocabulary are cut
so that a model definition with dummy weights fits a CPU in a few GB.
Two decoder layers: layer 0 dense, layer 1 MoE (first_k_dense_replace = 1).
Also the log capture both engine drivers attach to the plugin's logger.
"""

import json
import logging
import os

_SMALL = dict(
    num_hidden_layers=2,
    first_k_dense_replace=1,
    moe_layer_freq=1,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
    moe_intermediate_size=256,
    intermediate_size=512,
    vocab_size=512,
    max_position_embeddings=4096,
    n_group=1,
    topk_group=1,
    tie_word_embeddings=False,
    torch_dtype="bfloat16",
    rms_norm_eps=1e-6,
    # Both models' MoE routing and activations.
    hidden_act="silu",
    topk_method="noaux_tc",
    scoring_func="sigmoid",
    norm_topk_prob=True,
    routed_scaling_factor=2.5,
    attention_bias=False,
    rope_theta=10000.0,
    # DeepSeek-V3's own YaRN scaling; SGLang's CPU rotary embedding requires
    # one (GLM-5 has none; it changes no linear layer).
    rope_scaling={"type": "yarn", "rope_type": "yarn", "factor": 40.0,
                  "original_max_position_embeddings": 4096, "beta_fast": 32,
                  "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    bos_token_id=0,
    eos_token_id=1,
    num_nextn_predict_layers=0,
)

GLM5 = dict(
    _SMALL,
    architectures=["GlmMoeDsaForCausalLM"],
    model_type="glm_moe_dsa",
    hidden_size=6144,
    num_attention_heads=64,
    num_key_value_heads=64,
    q_lora_rank=2048,
    kv_lora_rank=512,
    qk_nope_head_dim=192,
    qk_rope_head_dim=64,
    qk_head_dim=256,
    v_head_dim=256,
    head_dim=64,
    index_n_heads=32,
    index_head_dim=128,
    index_topk=2048,
    mlp_layer_types=["dense", "sparse"],
)

DEEPSEEK_V3 = dict(
    _SMALL,
    architectures=["DeepseekV3ForCausalLM"],
    model_type="deepseek_v3",
    hidden_size=7168,
    num_attention_heads=128,
    num_key_value_heads=128,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
)

MODELS = {"glm5": GLM5, "deepseek_v3": DEEPSEEK_V3}

# The layers the plugins must tag (TP1 [N, K]) per decoder layer, and the
# bf16 layers they must leave alone.
EXPECTED_TAGGED = {
    "glm5": {"q_b_proj": (16384, 2048), "o_proj": (6144, 16384)},
    "deepseek_v3": {"q_b_proj": (24576, 1536), "o_proj": (7168, 16384)},
}


# FP8 checkpoints' quantization_config, per scenario of the engine tests: what
# fp8proj.bench_fp8ckpt writes (DeepSeek-V3's own layout: e4m3 weights, fp32
# weight_scale_inv per 128x128 block, dynamic activations), the same with
# scale_fmt "ue8m0" (the newer checkpoints' power-of-two scales), and one with
# 64x64 blocks (a layout fp8proj does not take).
def fp8_quant_configs() -> dict:
    from fp8proj.bench_fp8ckpt import QUANT_CONFIG

    return {
        "fp8": dict(QUANT_CONFIG),
        "fp8-ue8m0": dict(QUANT_CONFIG, scale_fmt="ue8m0"),
        "fp8-block64": dict(QUANT_CONFIG, weight_block_size=[64, 64]),
    }


def write_model_dir(name: str, root: str, quant: str = "none") -> str:
    """A model directory holding only config.json (weights are dummy); with
    ``quant`` one of fp8_quant_configs(), config.json carries that FP8
    checkpoint's quantization_config, as a checkpoint on disk does."""
    path = os.path.join(root, f"{name}-{quant}")
    os.makedirs(path, exist_ok=True)
    cfg = dict(MODELS[name])
    if quant != "none":
        cfg["quantization_config"] = fp8_quant_configs()[quant]
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return path


def expected_tagged_names(name: str) -> dict:
    cfg = MODELS[name]
    return {
        f"model.layers.{i}.self_attn.{proj}": shape
        for i in range(cfg["num_hidden_layers"])
        for proj, shape in EXPECTED_TAGGED[name].items()
    }


class LogCapture(logging.Handler):
    """Keeps the messages of the records it is given (INFO and above)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())
