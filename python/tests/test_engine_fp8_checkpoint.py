"""The engine plugins' FP8-checkpoint path without an engine: which layers an engine's FP8 linear
method leaves in a form fp8proj takes (and why not), the activation rule per checkpoint scale_fmt,
the decode-ceiling gate, and SGLang's two Fp8LinearMethod hooks on a stand-in layer carrying the
attributes SGLang 0.5.23 sets (python/tests/engines/ checks those names on the real package).
The GPU tests at the end run the taken layer's GEMM; they skip, with the reason, without one."""
import logging
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fp8proj.fp8_linear import (activation_scale_format, block_fp8_linear, block_fp8_linear_reference,
                                block_fp8_skip_reason, dequantize_weight, quantize_activation_reference)
from fp8proj.integrations import _engines as e
from fp8proj.integrations import sglang as plugin

BF16, E4M3, F32 = torch.bfloat16, torch.float8_e4m3fn, torch.float32


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in (e.REFERENCE_FLAG, e.FP8PROJ_FLAG, e.TARGETS_ENV, e.DECODE_CEILING_ENV):
        monkeypatch.delenv(name, raising=False)


def _ckpt(n, k, device="cpu", seed=0):
    """A checkpoint block as DeepSeek-V3 stores it (fp8proj.bench_fp8ckpt's writer)."""
    from fp8proj.bench_fp8ckpt import quantize_checkpoint_weight
    g = torch.Generator().manual_seed(seed)
    w, s = quantize_checkpoint_weight(torch.randn(n, k, generator=g) * 0.02)
    return w.to(device), s.to(device)


def _state(**kw):
    return e.Fp8MethodState(**dict(dict(block_size=(128, 128), act_dtype=BF16), **kw))


# ---- the decision -----------------------------------------------------------------------------

def test_activation_rule_follows_the_checkpoint_scale_fmt():
    # SGLang: act_scale_ue8m0 = quant_config.scale_fmt == "ue8m0" (exact match).
    assert activation_scale_format("ue8m0") == "ue8m0"
    for other in (None, "float", "", "UE8M0"):
        assert activation_scale_format(other) == "float"


def test_plain_block_fp8_layers_are_eligible():
    w, s = _ckpt(256, 384)
    assert e.fp8_checkpoint_skip_reason(w, s, _state()) == ""
    w, s = _ckpt(2624, 256)  # GLM-5's fused_qkv_a: a partial last row block of scales
    assert s.shape == (21, 2)
    assert e.fp8_checkpoint_skip_reason(w, s, _state(scale_fmt="ue8m0")) == ""


@pytest.mark.parametrize("state,want", [
    (dict(mxfp8=True), "MXFP8"),
    (dict(block_size=None), "per-tensor or per-channel"),
    (dict(block_size=(64, 64)), "weight_block_size [64, 64], not [128, 128]"),
    (dict(block_size=(32, 32)), "weight_block_size [32, 32]"),
    (dict(marlin=True), "Marlin"),
    (dict(served_as_mxfp8=True), "block_fp8_mxfp8_ready"),
    (dict(preshuffled=True), "aiter_bpreshuffled"),
    (dict(cpu_packed=True), "AMX"),
    (dict(static_input_scale=True), "static activation scale"),
    (dict(act_dtype=torch.float16), "torch.float16"),
])
def test_engine_states_fp8proj_leaves_alone_name_the_reason(state, want):
    w, s = _ckpt(256, 256)
    assert want in e.fp8_checkpoint_skip_reason(w, s, _state(**state))


def test_tensors_not_in_the_plain_layout_name_the_reason():
    w, s = _ckpt(256, 256)
    assert "not row-major" in e.fp8_checkpoint_skip_reason(w.t(), s, _state())  # a transposed weight
    assert "not float8_e4m3fn" in e.fp8_checkpoint_skip_reason(w.to(BF16), s, _state())
    assert "not (2, 2)" in e.fp8_checkpoint_skip_reason(w, s[:1], _state())
    assert "K=200" in block_fp8_skip_reason(torch.zeros(256, 200, dtype=E4M3), torch.ones(2, 2))
    assert "N=200" in block_fp8_skip_reason(torch.zeros(200, 256, dtype=E4M3), torch.ones(2, 2))
    assert e.fp8_checkpoint_skip_reason(None, None, _state()) == "no weight or weight_scale_inv"
    # DeepGEMM's UE8M0 path (SGLang on sm_100/sm_120) rewrites the scales into a packed int32
    # layout at load: said as such.
    packed = torch.zeros(2, 4, dtype=torch.int32)
    why = e.fp8_checkpoint_skip_reason(w, packed, _state(scales_requantized=True))
    assert why.startswith("weight_scale_inv re-laid out for DeepGEMM") and "torch.int32" in why


def test_take_decides_logs_and_reports(caplog):
    w, s = _ckpt(256, 256)
    report = e.TagReport()
    log = logging.getLogger("fp8proj.test")
    with caplog.at_level(logging.INFO, logger="fp8proj.test"):
        proj = e.take_fp8_checkpoint_layer(w, s, _state(scale_fmt="ue8m0"), "a.o_proj", "prefill", "sglang",
                                           log, report)
        none = e.take_fp8_checkpoint_layer(w, s, _state(block_size=(64, 64)), "a.q_b_proj", "prefill",
                                           "sglang", log, report)
    assert none is None
    ok, why = e.arch_status()
    d = report.fp8_checkpoint["a.o_proj"]
    assert (d["n"], d["k"], d["eligible"], d["act_scale_fmt"], d["policy"]) == (256, 256, True, "ue8m0", "prefill")
    if not ok:  # a CPU weight: eligible, SGLang's method stays
        assert proj is None and d["taken"] is False and d["reason"] == why
    assert report.fp8_checkpoint["a.q_b_proj"]["reason"] == "weight_block_size [64, 64], not [128, 128]"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and all("FP8 checkpoint layer" in ln for ln in lines)
    report.clear()
    assert report.fp8_checkpoint == {}


def test_explicit_off_switch(monkeypatch):
    assert not e.fp8_switched_off()
    monkeypatch.setenv(e.FP8PROJ_FLAG, "0")
    assert e.fp8_switched_off()
    monkeypatch.setenv(e.FP8PROJ_FLAG, "all")
    assert not e.fp8_switched_off()


def test_decode_ceiling_gate(monkeypatch):
    w, s = _ckpt(256, 256)
    p = e.CheckpointProjection("x", w, s, "float", "prefill", e.decode_ceiling_from_env())
    assert p.decode_ceiling == 512 and p.extra_memory_bytes() == 0 and p.weight_scale_fmt == "float"
    assert [p.uses_fp8proj(m) for m in (0, 1, 512, 513, 8192)] == [False, False, False, True, True]
    p.policy = "all"
    assert [p.uses_fp8proj(m) for m in (0, 1, 512)] == [False, True, True]
    monkeypatch.setenv(e.DECODE_CEILING_ENV, "64")
    assert e.decode_ceiling_from_env() == 64
    for bad in ("-1", "1.5", "lots"):
        monkeypatch.setenv(e.DECODE_CEILING_ENV, bad)
        with pytest.raises(ValueError, match=e.DECODE_CEILING_ENV):
            e.decode_ceiling_from_env()


# ---- the activation rules and the reference ---------------------------------------------------

def _np_e4m3_check(x, q, s, fmt):
    """Both rules in numpy: float scale = fp32(amax/448); ue8m0 the power of two at or above it."""
    xg = x.float().numpy().reshape(x.shape[0], -1, 128)
    amax = np.maximum(np.abs(xg).max(-1, keepdims=True), np.float32(1e-10))
    sf = (amax / np.float32(448.0)).astype(np.float32)
    if fmt == "ue8m0":
        sf = np.exp2(np.ceil(np.log2(sf.astype(np.float64)))).astype(np.float32)
    np.testing.assert_array_equal(s.numpy().reshape(sf.shape), sf)
    want = torch.from_numpy(np.clip(xg / sf, -448, 448)).to(E4M3).view(x.shape)
    assert torch.equal(q.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("fmt", ["float", "ue8m0"])
def test_quantize_activation_reference_rules(fmt):
    torch.manual_seed(1)
    x = (torch.randn(9, 384) * torch.logspace(-3, 2, 9)[:, None]).to(BF16)
    x[0, :128] = 0  # a zero group: scale from the 1e-10 floor
    x[1, 0] = 448.0 * 2 ** -3  # amax/448 an exact power of two: both rules give the same scale
    q, s = quantize_activation_reference(x, fmt)
    _np_e4m3_check(x, q, s, fmt)
    if fmt == "ue8m0":
        mant, _ = torch.frexp(s)
        assert (mant == 0.5).all()  # powers of two
    with pytest.raises(ValueError, match="scale_fmt"):
        quantize_activation_reference(x, "e8m0")


@pytest.mark.parametrize("fmt", ["float", "ue8m0"])
def test_block_fp8_linear_reference_is_the_dequantized_product(fmt):
    w, s = _ckpt(272, 256)  # N = 272: a partial last block
    x = torch.randn(3, 5, 256).to(BF16)
    bias = torch.randn(272).to(BF16)
    y = block_fp8_linear_reference(x.float(), w, s, fmt, bias)
    q, xs = quantize_activation_reference(x.reshape(-1, 256), fmt)
    xd = q.float().view(-1, 2, 128) * xs.unsqueeze(-1)
    want = xd.view(-1, 256) @ dequantize_weight(w, s).T + bias.float()
    assert y.shape == (3, 5, 272)
    torch.testing.assert_close(y.reshape(-1, 272), want, rtol=1e-5, atol=1e-5)


# ---- SGLang's Fp8LinearMethod hooks on a stand-in layer ---------------------------------------

class _Method:
    """The attributes plugin._fp8_method_state reads from SGLang 0.5.23's Fp8LinearMethod."""

    def __init__(self, block=(128, 128), scale_fmt=None):
        self.quant_config = SimpleNamespace(scale_fmt=scale_fmt)
        self.block_quant = block is not None
        self.weight_block_size = list(block) if block else None
        self.use_mxfp8 = self.use_marlin = self.block_fp8_as_mxfp8 = False
        self.applied = 0


def _original_apply(method, layer, x, bias=None):
    method.applied += 1
    x = x[0] if isinstance(x, tuple) else x  # SGLang's apply also takes pre-quantized (values, scales)
    return torch.full((*x.shape[:-1], layer.weight.shape[0]), -1.0, dtype=x.dtype, device=x.device)


def _layer(n, k, device="cpu"):
    w, s = _ckpt(n, k, device)
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(w, requires_grad=False)
    layer.weight_scale_inv = torch.nn.Parameter(s, requires_grad=False)
    layer.input_scale = None
    layer.orig_dtype = BF16
    return layer


def _process(method, layer, name="model.layers.0.self_attn.o_proj"):
    plugin.REPORT.clear()
    layer.__dict__[plugin._NAME] = name
    plugin._fp8_process_weights(lambda m, lyr: None, method, layer)
    return plugin.REPORT.fp8_checkpoint[name]


def test_sglang_hooks_leave_an_untaken_layer_to_sglang():
    method, layer = _Method(), _layer(256, 256)
    d = _process(method, layer)
    if not e.arch_status()[0]:
        assert d["eligible"] and not d["taken"] and plugin._CKPT not in layer.__dict__
    x = torch.randn(1024, 256).to(BF16)
    y = plugin._fp8_apply(_original_apply, method, layer, x)
    if plugin._CKPT not in layer.__dict__:
        assert method.applied == 1 and (y == -1).all()
    method64 = _Method(block=(64, 64))
    assert _process(method64, _layer(256, 256))["reason"] == "weight_block_size [64, 64], not [128, 128]"


def test_sglang_state_is_read_by_sglang_names():
    method, layer = _Method(scale_fmt="ue8m0"), _layer(256, 256)
    layer.block_fp8_mxfp8_ready = True  # ignored unless the method serves block FP8 as MXFP8
    st = plugin._fp8_method_state(method, layer)
    assert (st.block_size, st.scale_fmt, st.served_as_mxfp8, st.act_dtype) == ((128, 128), "ue8m0", False, BF16)
    method.block_fp8_as_mxfp8 = True
    layer.aiter_bpreshuffled = True
    layer.weight_scale_inv.format_ue8m0 = True
    layer.use_intel_amx_backend = True
    layer.input_scale = torch.nn.Parameter(torch.ones(1), requires_grad=False)
    st = plugin._fp8_method_state(method, layer)
    assert st.served_as_mxfp8 and st.preshuffled and st.scales_requantized and st.cpu_packed
    assert st.static_input_scale
    method.use_marlin = True
    del layer.input_scale  # SGLang deletes it for Marlin
    st = plugin._fp8_method_state(method, layer)
    assert st.marlin and not st.static_input_scale


# ---- on a Hopper GPU: the taken layer's apply -------------------------------------------------

@pytest.mark.parametrize("scale_fmt", [None, "ue8m0"])
@pytest.mark.parametrize("policy", ["prefill", "all"])
def test_sglang_taken_layer_runs_fp8proj_above_the_ceiling(gpu, monkeypatch, scale_fmt, policy):
    monkeypatch.setitem(plugin._state, "policy", policy)
    method, layer = _Method(scale_fmt=scale_fmt), _layer(7168, 2048, "cuda")
    d = _process(method, layer)
    assert d["taken"] and d["eligible"] and d["reason"] == "", d
    act = "ue8m0" if scale_fmt == "ue8m0" else "float"
    assert d["act_scale_fmt"] == act
    proj = layer.__dict__[plugin._CKPT]
    with torch.no_grad():
        for m in (1, 16, 512, 513, 2048):
            x = torch.randn(m, 2048, device="cuda").to(BF16)
            before = method.applied
            y = plugin._fp8_apply(_original_apply, method, layer, x)
            if policy == "prefill" and m <= 512:
                assert method.applied == before + 1 and (y == -1).all()  # SGLang's own apply
                continue
            assert method.applied == before and y.shape == (m, 7168)
            assert torch.equal(y, block_fp8_linear(x, layer.weight, layer.weight_scale_inv, act))
            ref = block_fp8_linear_reference(x.float(), layer.weight, layer.weight_scale_inv, act)
            rel = ((y.float() - ref).norm() / ref.norm()).item()
            assert rel < 2e-3, (m, rel)
        # Pre-quantized tuple inputs and other dtypes are SGLang's.
        before = method.applied
        plugin._fp8_apply(_original_apply, method, layer, (x, x))
        plugin._fp8_apply(_original_apply, method, layer, x.half())
        assert method.applied == before + 2
    assert proj.extra_memory_bytes() == 0  # the checkpoint's own tensors, no copy


def test_sglang_explicit_off_leaves_the_layer_to_sglang(gpu, monkeypatch):
    monkeypatch.setenv(e.REFERENCE_FLAG, "1")
    monkeypatch.setenv(e.FP8PROJ_FLAG, "0")
    d = _process(_Method(), _layer(1536, 1024, "cuda"))
    assert d["eligible"] and not d["taken"] and d["reason"] == "FP8PROJ_PREFILL_FP8=0 turns fp8proj's FP8 off"


def test_sglang_taken_layer_in_a_cuda_graph(gpu, monkeypatch):
    monkeypatch.setitem(plugin._state, "policy", "all")
    method, layer = _Method(), _layer(1536, 1024, "cuda")
    assert _process(method, layer)["taken"]
    x = torch.randn(64, 1024, device="cuda").to(BF16)
    with torch.no_grad():
        eager = plugin._fp8_apply(_original_apply, method, layer, x)
        side = torch.cuda.Stream()  # warm up on a side stream, as before any capture
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            plugin._fp8_apply(_original_apply, method, layer, x)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):  # the plan was made at load (CheckpointProjection.prepare)
            out = plugin._fp8_apply(_original_apply, method, layer, x)
        g.replay()
        torch.cuda.synchronize()
    assert torch.equal(out, eager)
