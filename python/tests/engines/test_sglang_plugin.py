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
    "sglang.srt.layers.quantization.fp8.Fp8LinearMethod.apply",
    "sglang.srt.layers.quantization.fp8.Fp8LinearMethod.process_weights_after_loading",
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


# ---- FP8 checkpoints: SGLang's Fp8LinearMethod ------------------------------------------------
# The model built from a config.json carrying an FP8 checkpoint's quantization_config
# (models.fp8_quant_configs: what fp8proj.bench_fp8ckpt writes), dummy weights. The load-time
# half (tagging, SGLang's own weight processing, the per-layer decision) runs on the CPU; the
# apply half needs a CUDA GPU with fp8proj's CUDA build (test_fp8_checkpoint_apply_on_gpu).


def _fp8(model, quant="fp8", env=None, tag=None):
    env = {"SGLANG_DSA_FP8_PROJ_GEMM": "1", **(env or {})}
    return run_driver("sglang_driver", model, tag or f"{quant}-on", env, extra=("--quant", quant))


def _ceil(v):
    return -(-v // 128)


def _cuda_reason():
    import torch

    import fp8proj

    if not torch.cuda.is_available():
        return "no CUDA device"
    ok, why = fp8proj.cuda_status()
    return "" if ok else why


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_fp8_checkpoint_layers_tagged_and_decided_after_sglang_processing(model):
    run = _fp8(model)
    assert set(HOOKS) <= set(run["hooks_applied"]), run["hooks_applied"]
    tagged = {e["name"]: e for e in run["linear_layers"] if e["tagged"]}
    assert {n: (e["n"], e["k"]) for n, e in tagged.items()} == models.expected_tagged_names(model)
    cpu = _cuda_reason()
    for name, e in tagged.items():
        n, k = e["n"], e["k"]
        # What SGLang 0.5.23's Fp8LinearMethod left on the layer, read by the plugin's names.
        assert e["method"] == "Fp8LinearMethod"
        assert e["tensors"]["weight"] == {"dtype": "torch.float8_e4m3fn", "shape": [n, k],
                                          "contiguous": True}
        assert e["tensors"]["weight_scale_inv"] == {"dtype": "torch.float32",
                                                    "shape": [_ceil(n), _ceil(k)], "contiguous": True}
        st = e["fp8_method_state"]
        assert st["block_size"] == [128, 128] and st["scale_fmt"] is None
        assert not any(st[f] for f in ("mxfp8", "marlin", "served_as_mxfp8", "preshuffled",
                                       "cpu_packed", "static_input_scale", "scales_requantized"))
        assert st["act_dtype"] == "torch.bfloat16"
        d = e["fp8_checkpoint"]
        assert (d["n"], d["k"], d["eligible"], d["act_scale_fmt"]) == (n, k, True, "float")
        if cpu:  # eligible, but SGLang's method stays: the GEMM needs the GPU
            assert d["taken"] is False and e["taken"] is False and d["reason"] == cpu
        lines = [ln for ln in run["fp8proj_log"] if f" {name} [" in ln]
        assert len(lines) == 1, (name, lines)
        assert "FP8 checkpoint layer" in lines[0]
    # Every other linear layer of the checkpoint keeps SGLang's method and gets no decision.
    fp8_untagged = [e for e in run["linear_layers"] if not e["tagged"]
                    and e["method"] == "Fp8LinearMethod"]
    assert any(e["name"].endswith("kv_b_proj") for e in fp8_untagged)
    assert any(e["name"].endswith("fused_qkv_a_proj_with_mqa") for e in fp8_untagged)
    assert set(run["report_fp8_checkpoint"]) == set(tagged)


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_fp8_checkpoint_flag_unset_changes_nothing(model):
    off = run_driver("sglang_driver", model, "fp8-flag-unset", {}, extra=("--quant", "fp8"))
    on = _fp8(model)
    assert not any(h in off["hooks_applied"] for h in HOOKS), off["hooks_applied"]
    assert not any(e["tagged"] for e in off["linear_layers"]) and off["report_fp8_checkpoint"] == {}
    strip = lambda run: [(e["name"], e["class"], e["method"], e["n"], e["k"], e.get("tensors"),  # noqa: E731
                          e.get("fp8_method_state")) for e in run["linear_layers"]]
    assert strip(off) == strip(on)
    assert off["parameters"] == on["parameters"]  # fp8proj adds no parameter, no copy


def test_fp8_checkpoint_ue8m0_scale_fmt_gives_power_of_two_activations(model="deepseek_v3"):
    run = _fp8(model, "fp8-ue8m0")
    decided = run["report_fp8_checkpoint"]
    assert set(decided) == set(models.expected_tagged_names(model))
    for d in decided.values():
        assert d["eligible"] and d["act_scale_fmt"] == "ue8m0"
    for e in run["linear_layers"]:
        if e["tagged"]:
            assert e["fp8_method_state"]["scale_fmt"] == "ue8m0"


def test_fp8_checkpoint_other_block_size_stays_on_sglang_with_the_reason(model="deepseek_v3"):
    run = _fp8(model, "fp8-block64")
    decided = run["report_fp8_checkpoint"]
    assert set(decided) == set(models.expected_tagged_names(model))
    for name, d in decided.items():
        assert not d["eligible"] and not d["taken"]
        assert d["reason"] == "weight_block_size [64, 64], not [128, 128]"
        assert any(f" {name} [" in ln and "[64, 64]" in ln for ln in run["fp8proj_log"])
    assert run["fp8_checkpoint_taken"] == []


def test_fp8_checkpoint_optional_targets(model="glm5"):
    run = _fp8(model, env={"FP8PROJ_ENGINE_TARGETS": "q_b_proj,o_proj,kv_b_proj,fused_qkv_a"},
               tag="fp8-targets-all")
    layers = models.MODELS[model]["num_hidden_layers"]
    want = {f"model.layers.{i}.self_attn.{p}" for i in range(layers)
            for p in ("q_b_proj", "o_proj", "kv_b_proj", "fused_qkv_a_proj_with_mqa")}
    assert set(run["report_fp8_checkpoint"]) == want
    for name, d in run["report_fp8_checkpoint"].items():
        # fused_qkv_a: N = 2624, a partial last block of scales; still taken where the GPU is.
        assert d["eligible"], (name, d)


@pytest.mark.parametrize("model,quant", [("deepseek_v3", "fp8"), ("deepseek_v3", "fp8-ue8m0"),
                                         ("glm5", "fp8")])
def test_fp8_checkpoint_apply_on_gpu(model, quant):
    why = _cuda_reason()
    if why:
        pytest.skip(f"the apply half runs fp8proj's GEMM on a Hopper GPU ({why}); SGLang's own "
                    "CPU FP8 path needs AMX and the CPU build of sgl-kernel")
    run = run_driver("sglang_driver", model, f"{quant}-apply", {"SGLANG_DSA_FP8_PROJ_GEMM": "1"},
                     extra=("--quant", quant, "--apply"))
    assert set(run["fp8_checkpoint_taken"]) == set(models.expected_tagged_names(model))
    act = "ue8m0" if quant == "fp8-ue8m0" else "float"
    assert set(run["apply"]) == set(run["fp8_checkpoint_taken"])
    for name, a in run["apply"].items():
        assert a["act_scale_fmt"] == act
        assert a["big_equal_block_fp8_linear"], (name, a)  # above the ceiling: fp8proj's GEMM
        assert a["big_rel_err_vs_dequantized"] < 2e-3, (name, a)
        assert a["small_equal_sglang"], (name, a)  # decode batches: SGLang's own apply
