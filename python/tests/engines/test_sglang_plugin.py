"""fp8proj's SGLang plugin against the released SGLang (CPU).

Opt-in: skipped unless sglang is importable; scripts/test_engines.sh installs
sglang from PyPI into /tmp/venv-sglang with this package and runs this file.
Every scenario builds the engine's own DeepseekV3ForCausalLM /
GlmMoeDsaForCausalLM through SGLang's plugin loader and model loader (see
sglang_driver.py).
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import entry_point, fake_quantize_weight_shapes, require_engine, run_driver  # noqa: E402

require_engine("sglang")

import models  # noqa: E402

MODEL_NAMES = ("glm5", "deepseek_v3")
HOOKS = (
    "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply",
    "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply_into",
    "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.process_weights_after_loading",
    "sglang.srt.models.deepseek_v2.DeepseekV2AttentionMLA.__init__",
)


def _run(model, tag, env):
    return run_driver("sglang_driver", model, tag, env)


def _on(model):
    return _run(model, "reference-flag", {"SGLANG_DSA_FP8_PROJ_GEMM": "1"})


def _off(model):
    return _run(model, "flag-unset", {})


def test_entry_point_is_declared_in_package_metadata():
    ep = entry_point("sglang.srt.plugins")
    assert ep is not None, "no sglang.srt.plugins entry point named fp8proj"
    assert ep.value == "fp8proj.integrations.sglang:register"


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_load_plugins_applies_the_hooks_with_the_flag(model):
    run = _on(model)
    assert set(HOOKS) <= set(run["hooks_applied"]), run["hooks_applied"]


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_tags_exactly_the_mla_projections(model):
    run = _on(model)
    tagged = {e["name"]: (e["n"], e["k"]) for e in run["linear_layers"] if e["tagged"]}
    assert tagged == models.expected_tagged_names(model)
    for e in run["linear_layers"]:
        if e["tagged"]:
            assert e["tag"] == e["name"]  # the name the attention prefix gave it
    untagged = [e for e in run["linear_layers"] if not e["tagged"]]
    assert any(e["name"].endswith("kv_b_proj") for e in untagged)
    assert any(e["name"].endswith("fused_qkv_a_proj_with_mqa") for e in untagged)


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_flag_unset_registers_nothing_and_changes_nothing(model):
    off, on = _off(model), _on(model)
    assert not any(h in off["hooks_applied"] for h in HOOKS), off["hooks_applied"]
    assert not any(e["tagged"] for e in off["linear_layers"])
    assert off["fp8proj_log"] == [] or not any("[fp8proj]" in ln for ln in off["fp8proj_log"])
    strip = lambda run: [(e["name"], e["class"], e["method"], e["n"], e["k"])  # noqa: E731
                         for e in run["linear_layers"]]
    assert strip(off) == strip(on)
    assert off["parameters"] == on["parameters"]
    assert off["model_class"] == on["model_class"]


def test_fp8proj_flag_enables_it_too(model="glm5"):
    run = _run(model, "fp8proj-flag", {"FP8PROJ_PREFILL_FP8": "1"})
    tagged = {e["name"] for e in run["linear_layers"] if e["tagged"]}
    assert tagged == set(models.expected_tagged_names(model))


def test_optional_targets(model="glm5"):
    run = _run(model, "targets-all", {
        "SGLANG_DSA_FP8_PROJ_GEMM": "1",
        "FP8PROJ_ENGINE_TARGETS": "q_b_proj,o_proj,kv_b_proj,fused_qkv_a"})
    tagged = {e["name"] for e in run["linear_layers"] if e["tagged"]}
    layers = models.MODELS[model]["num_hidden_layers"]
    want = {f"model.layers.{i}.self_attn.{p}" for i in range(layers)
            for p in ("q_b_proj", "o_proj", "kv_b_proj", "fused_qkv_a_proj_with_mqa")}
    assert tagged == want


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_fp8_copy_shapes(model):
    run = _on(model)
    for e in run["linear_layers"]:
        if not e["tagged"]:
            continue
        n, k = e["n"], e["k"]
        values, vdtype, scales, sdtype = fake_quantize_weight_shapes(n, k)
        assert tuple(e["fp8_copy"]["values_shape"]) == values == (n, k)
        assert tuple(e["fp8_copy"]["scales_shape"]) == scales == (-(-n // 128), k // 128)
        assert vdtype == "torch.float8_e4m3fn" and sdtype == "torch.float32"
        assert e["has_projection"] is False  # no sm_90 GPU here: no copy, bf16 kept


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_one_log_line_per_tagged_layer_and_bf16_output(model):
    run = _on(model)
    for name in models.expected_tagged_names(model):
        lines = [ln for ln in run["fp8proj_log"] if f" {name} [" in ln]
        assert len(lines) == 1, (name, lines)
        assert "stays bf16" in lines[0] or "FP8 copy made" in lines[0]
    assert run["forward_equal_bf16"] and all(run["forward_equal_bf16"].values())
