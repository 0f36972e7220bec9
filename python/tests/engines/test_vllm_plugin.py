"""fp8proj's vLLM plugin against the released vLLM (CPU platform).

Opt-in: skipped unless vllm is importable; scripts/test_engines.sh installs
vllm from PyPI into /tmp/venv-vllm with this package and runs this file.
Every scenario builds the engine's own DeepseekV3ForCausalLM /
GlmMoeDsaForCausalLM through vLLM's loader (see vllm_driver.py).
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import entry_point, fake_quantize_weight_shapes, require_engine, run_driver  # noqa: E402

require_engine("vllm")

import models  # noqa: E402

MODEL_NAMES = ("glm5", "deepseek_v3")


def _run(model, quantization):
    extra = ("--quantization", quantization) if quantization else ()
    return run_driver("vllm_driver", model, quantization or "bf16", {}, extra)


def test_entry_point_is_declared_in_package_metadata():
    ep = entry_point("vllm.general_plugins")
    assert ep is not None, "no vllm.general_plugins entry point named fp8proj"
    assert ep.value == "fp8proj.integrations.vllm:register"


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_load_general_plugins_registers_the_quantization(model):
    run = _run(model, "fp8proj")
    assert run["fp8proj_registered"], "load_general_plugins() did not register fp8proj"
    assert run["quant_config"] == "Fp8ProjConfig"


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_tags_exactly_the_mla_projections(model):
    run = _run(model, "fp8proj")
    layers = {e["name"]: e for e in run["linear_layers"]}
    tagged = {n: (e["n"], e["k"]) for n, e in layers.items()
              if e["method"] == "Fp8ProjLinearMethod"}
    assert tagged == models.expected_tagged_names(model)
    others = {n: e["method"] for n, e in layers.items() if n not in tagged}
    assert others, "the model has no other linear layers?"
    assert set(others.values()) == {"UnquantizedLinearMethod"}, others


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_everything_else_is_untouched(model):
    base, ours = _run(model, None), _run(model, "fp8proj")
    assert base["quant_config"] is None
    assert {e["method"] for e in base["linear_layers"]} == {"UnquantizedLinearMethod"}
    strip = lambda run: [(e["name"], e["class"], e["n"], e["k"]) for e in run["linear_layers"]]  # noqa: E731
    assert strip(base) == strip(ours)
    assert base["parameters"] == ours["parameters"]
    assert base["model_class"] == ours["model_class"]


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_fp8_copy_shapes(model):
    run = _run(model, "fp8proj")
    for e in run["linear_layers"]:
        if e["method"] != "Fp8ProjLinearMethod":
            continue
        n, k = e["n"], e["k"]
        plan = e["fp8_copy"]
        values, vdtype, scales, sdtype = fake_quantize_weight_shapes(n, k)
        assert tuple(plan["values_shape"]) == values == (n, k)
        assert tuple(plan["scales_shape"]) == scales == (-(-n // 128), k // 128)
        assert vdtype == "torch.float8_e4m3fn" and sdtype == "torch.float32"
        # Off sm_90 no copy is made: the layer stays vLLM's bf16.
        assert e["has_projection"] is False


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_one_log_line_per_tagged_layer(model):
    run = _run(model, "fp8proj")
    for name in models.expected_tagged_names(model):
        lines = [ln for ln in run["fp8proj_log"] if f" {name} [" in ln]
        assert len(lines) == 1, (name, lines)
        assert "stays bf16" in lines[0] or "FP8 copy made" in lines[0]


def test_tagged_layer_forward_runs(model="glm5"):
    run = _run(model, "fp8proj")
    assert run["forward_checked"], "no tagged o_proj was run"


def test_optional_targets(model="glm5"):
    run = run_driver("vllm_driver", model, "fp8proj-targets-all",
                     {"FP8PROJ_ENGINE_TARGETS": "q_b_proj,o_proj,kv_b_proj,fused_qkv_a"},
                     ("--quantization", "fp8proj"))
    tagged = {e["name"] for e in run["linear_layers"] if e["method"] == "Fp8ProjLinearMethod"}
    layers = models.MODELS[model]["num_hidden_layers"]
    want = {f"model.layers.{i}.self_attn.{p}" for i in range(layers)
            for p in ("q_b_proj", "o_proj", "kv_b_proj", "fused_qkv_a_proj")}
    assert tagged == want
