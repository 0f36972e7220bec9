"""The engine plugins' rules that need no engine: flags, targets, layer names,
FP8 copy shapes. (The plugins against the real engines: tests/engines/.)"""

import pytest
import torch

from fp8proj.integrations import _engines as e


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in (e.REFERENCE_FLAG, e.FP8PROJ_FLAG, e.TARGETS_ENV):
        monkeypatch.delenv(name, raising=False)


def test_flags(monkeypatch):
    assert e.sglang_enabled() == (False, "")
    monkeypatch.setenv(e.REFERENCE_FLAG, "1")
    assert e.sglang_enabled() == (True, e.REFERENCE_FLAG)
    monkeypatch.setenv(e.REFERENCE_FLAG, "0")
    assert e.sglang_enabled() == (False, "")
    monkeypatch.setenv(e.FP8PROJ_FLAG, "all")
    assert e.sglang_enabled() == (True, e.FP8PROJ_FLAG)
    assert e.policy_from_env() == "all"
    monkeypatch.setenv(e.FP8PROJ_FLAG, "prefill")
    assert e.policy_from_env() == "prefill"
    monkeypatch.setenv(e.REFERENCE_FLAG, "maybe")
    with pytest.raises(ValueError, match=e.REFERENCE_FLAG):
        e.sglang_enabled()


def test_targets(monkeypatch):
    assert e.targets_from_env() == ("q_b_proj", "o_proj")
    monkeypatch.setenv(e.TARGETS_ENV, "o_proj, kv_b_proj,o_proj")
    assert e.targets_from_env() == ("o_proj", "kv_b_proj")
    monkeypatch.setenv(e.TARGETS_ENV, "q_b_proj,down_proj")
    with pytest.raises(ValueError, match="down_proj"):
        e.targets_from_env()


@pytest.mark.parametrize("prefix,want", [
    ("model.layers.0.self_attn.q_b_proj", "q_b_proj"),
    ("model.layers.61.self_attn.o_proj", "o_proj"),
    ("model.decoder.self_attn.o_proj", "o_proj"),           # SGLang's MTP layer
    ("model.layers.0.self_attn.kv_b_proj", None),           # kept bf16 by default
    ("model.layers.0.self_attn.fused_qkv_a_proj", None),
    ("model.layers.0.self_attn.indexer.wq_b", None),
    ("model.layers.0.mlp.down_proj", None),
    ("vision.blocks.0.attn.o_proj", None),                  # not under self_attn
    ("o_proj", None),
])
def test_target_of_prefix_default(prefix, want):
    assert e.target_of_prefix(prefix, e.DEFAULT_TARGETS) == want


def test_target_of_prefix_optional():
    targets = e.DEFAULT_TARGETS + e.OPTIONAL_TARGETS
    assert e.target_of_prefix("model.layers.0.self_attn.fused_qkv_a_proj", targets) == "fused_qkv_a"
    assert e.target_of_prefix("model.layers.0.self_attn.fused_qkv_a_proj_with_mqa",
                              targets) == "fused_qkv_a"
    assert e.target_of_prefix("model.layers.0.self_attn.kv_b_proj", targets) == "kv_b_proj"


def test_planned_copy_matches_the_op_schema():
    import fp8proj  # noqa: F401

    for n, k in [(16384, 2048), (6144, 16384), (24576, 1536), (7168, 16384), (2624, 6144)]:
        plan = e.planned_fp8_copy(n, k)
        v, s = torch.ops.fp8proj.quantize_weight(torch.empty(n, k, dtype=torch.bfloat16, device="meta"))
        assert tuple(v.shape) == plan["values_shape"] and tuple(s.shape) == plan["scales_shape"]
        assert plan["extra_bytes"] == n * k + 4 * s.numel()
    assert not e.planned_fp8_copy(128, 100)["eligible"]


def test_prepare_layer_off_gpu_keeps_bf16(caplog):
    layer = torch.nn.Linear(256, 384, bias=False, dtype=torch.bfloat16)
    with caplog.at_level("INFO", logger="fp8proj"):
        proj = e.prepare_layer(layer, "model.layers.0.self_attn.o_proj", "prefill", "test",
                               e.logger)
    if torch.cuda.is_available() and e.arch_status()[0]:
        pytest.skip("sm_90 GPU present: the layer gets an FP8 copy (weight on CPU here, though)")
    assert proj is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert lines[0].startswith(
        "[fp8proj] test model.layers.0.self_attn.o_proj [N=384 K=256]: stays bf16 (")


# ---- on an sm_90 GPU: the glue both plugins run at load and in apply() -------------------------

def _needs_sm90():
    ok, why = e.arch_status()
    if not ok:
        pytest.skip(f"needs an sm_90 GPU and fp8proj's CUDA build: {why}")


def test_gpu_prepare_layer_makes_the_copy_and_gates(caplog):
    _needs_sm90()
    torch.manual_seed(0)
    layer = torch.nn.Linear(2048, 4096, bias=False, device="cuda", dtype=torch.bfloat16)
    layer.weight.requires_grad_(False)  # as the engines load weights: inference only
    with caplog.at_level("INFO", logger="fp8proj"):
        proj = e.prepare_layer(layer, "model.layers.0.self_attn.q_b_proj", "prefill", "test", e.logger)
    assert proj is not None, [r.getMessage() for r in caplog.records]
    assert "FP8 copy made" in caplog.records[-1].getMessage()
    assert proj.extra_memory_bytes() >= 4096 * 2048  # e4m3 values + scales
    # Policy prefill: decode batches (M <= 512) stay bf16, a large prefill runs FP8.
    assert not proj.uses_fp8(1) and not proj.uses_fp8(512)
    assert proj.uses_fp8(8192)
    x = torch.randn(8192, 2048, device="cuda", dtype=torch.bfloat16)
    ref = torch.nn.functional.linear(x.float(), layer.weight.float())
    y = proj.run(x, layer.weight)
    assert y.shape == (8192, 4096) and y.dtype == torch.bfloat16
    rel = ((y.float() - ref).norm() / ref.norm()).item()
    assert 1e-2 < rel < 0.06, rel  # FP8 ran: the quantization's own error (~3.7% on Gaussian data)
    # The op under torch.compile (fake implementation, no graph break).
    compiled = torch.compile(lambda t: proj.run(t, layer.weight), fullgraph=True)
    yc = compiled(x)
    assert ((yc.float() - y.float()).norm() / y.float().norm()).item() < 1e-3
    assert proj.run(x[:0], layer.weight).shape == (0, 4096)  # M = 0 is a no-op
