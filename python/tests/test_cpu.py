"""What runs without a GPU: import, op schemas, fake shapes and torch.compile tracing, argument
errors, the C ABI's error paths through ctypes, the bf16 fallback of the modules, and the
transformers patch on tiny random models."""
import ctypes
import os
import logging
import types

import pytest
import torch
from torch import nn

import fp8proj
from fp8proj import _lib, ops
from fp8proj.torch import DeferredRMSNorm, Fp8ProjLinear, Fp8ProjRMSNormLinear

from conftest import tiny_deepseek_v3_config

BF16 = torch.bfloat16
E4M3 = torch.float8_e4m3fn
HAVE_GPU = fp8proj.cuda_status()[0]
cpu_only = pytest.mark.skipif(HAVE_GPU, reason="checks the no-GPU behaviour; this machine has a Hopper GPU")


def test_import_and_status():
    assert fp8proj.__version__ == "0.1.0"
    ok, why = fp8proj.cuda_status()
    assert isinstance(ok, bool) and isinstance(why, str)
    assert ok or why, "without a usable GPU the status must say why"
    assert _lib.LIB is not None, _lib.LOAD_ERROR
    assert fp8proj.library_version().startswith("0.1.0+")


SCHEMAS = {
    "quantize_activation": 'fp8proj::quantize_activation(Tensor x, str scale_fmt="ue8m0") -> (Tensor, Tensor)',
    "rmsnorm_quantize": 'fp8proj::rmsnorm_quantize(Tensor x, Tensor weight, float eps, str scale_fmt="ue8m0") '
                        "-> (Tensor, Tensor)",
    "quantize_weight": 'fp8proj::quantize_weight(Tensor w, str scale_fmt="ue8m0") -> (Tensor, Tensor)',
    "fp8_gemm": "fp8proj::fp8_gemm(Tensor xv, Tensor xs, Tensor wv, Tensor ws) -> Tensor",
    "linear": "fp8proj::linear(Tensor x, Tensor weight, int handle) -> Tensor",
    "rmsnorm_linear": "fp8proj::rmsnorm_linear(Tensor x, Tensor norm_weight, float eps, Tensor weight, int handle) "
                      "-> Tensor",
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_schema(name):
    assert str(getattr(torch.ops.fp8proj, name).default._schema) == SCHEMAS[name]


def meta(*shape, dtype=BF16):
    return torch.empty(shape, dtype=dtype, device="meta")


def test_fake_shapes():
    v, s = ops.quantize_activation(meta(5, 256))
    assert (v.shape, v.dtype, s.shape, s.dtype) == ((5, 256), E4M3, (2, 8), torch.float32)
    v, s = ops.quantize_activation(meta(2, 3, 384))  # leading dims fold into M = 6 -> ld 8
    assert v.shape == (2, 3, 384) and s.shape == (3, 8)
    strided = meta(7, 640)[:, :512]  # the q_a columns of a wider row
    v, s = ops.rmsnorm_quantize(strided, meta(512), 1e-6)
    assert v.shape == (7, 512) and s.shape == (4, 8)
    v, s = ops.rmsnorm_quantize(strided, meta(512), 1e-6, "float")
    assert v.shape == (7, 512) and s.shape == (4, 8)
    with pytest.raises(ValueError, match="scale_fmt"):
        ops.rmsnorm_quantize(strided, meta(512), 1e-6, "e5m2")
    v, s = ops.quantize_weight(meta(300, 256))
    assert v.shape == (300, 256) and s.shape == (3, 2)
    y = ops.fp8_gemm(meta(5, 256, dtype=E4M3), meta(2, 8, dtype=torch.float32), meta(384, 256, dtype=E4M3),
                     meta(3, 2, dtype=torch.float32))
    assert y.shape == (5, 384) and y.dtype == BF16
    assert ops.linear(meta(2, 9, 256), meta(384, 256), 1).shape == (2, 9, 384)
    assert ops.rmsnorm_linear(meta(9, 256), meta(256), 1e-6, meta(384, 256), 1).shape == (9, 384)
    v, s = ops.quantize_activation(meta(0, 256))
    assert v.shape == (0, 256) and s.shape == (2, 0)
    v, s = ops.quantize_activation(meta(5, 256), "float")  # fp32 amax/448 scales: the same layout
    assert v.shape == (5, 256) and s.shape == (2, 8)
    v, s = ops.quantize_weight(meta(300, 256), "float")
    assert v.shape == (300, 256) and s.shape == (3, 2) and s.dtype == torch.float32
    with pytest.raises(ValueError, match='scale_fmt must be "ue8m0" or "float", got \'fp16\''):
        ops.quantize_weight(meta(128, 128), "fp16")


def test_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        x = torch.empty(33, 512, dtype=BF16)
        v, s = ops.quantize_activation(x)
        assert v.shape == (33, 512) and s.shape == (4, 36)
        assert ops.linear(x, torch.empty(1024, 512, dtype=BF16), 3).shape == (33, 1024)


class _Recorder:
    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward


def _op_targets(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_compile_fullgraph_ops():
    torch._dynamo.reset()
    rec = _Recorder()

    def fn(x, nw, w, wv, ws):
        xv, xs = torch.ops.fp8proj.rmsnorm_quantize(x, nw, 1e-6)
        y1 = torch.ops.fp8proj.fp8_gemm(xv, xs, wv, ws)
        y2 = torch.ops.fp8proj.linear(x, w, 7)
        y3 = torch.ops.fp8proj.rmsnorm_linear(x, nw, 1e-6, w, 7)
        qv, qs = torch.ops.fp8proj.quantize_weight(w, "float")
        av, as_ = torch.ops.fp8proj.quantize_activation(x, "float")
        return y1 + y2 + y3, qv, qs, av, as_

    out = torch.compile(fn, fullgraph=True, backend=rec)(meta(8, 256), meta(256), meta(384, 256),
                                                          meta(384, 256, dtype=E4M3), meta(3, 2, dtype=torch.float32))
    assert out[0].shape == (8, 384)
    assert len(rec.graphs) == 1
    targets = _op_targets(rec.graphs[0])
    for op in ("rmsnorm_quantize", "fp8_gemm", "linear", "rmsnorm_linear", "quantize_weight", "quantize_activation"):
        assert f"fp8proj.{op}" in targets, targets


def test_compile_aot_traces_fake_impls():
    # AOTAutograd functionalizes and traces with FakeTensors: the fake impls and the schemas
    # (no aliasing, no mutation) have to be right for this to pass.
    torch._dynamo.reset()

    def fn(x, w):
        xv, xs = torch.ops.fp8proj.quantize_activation(x)
        return torch.ops.fp8proj.linear(x, w, 5) * 2, xv, xs

    y, xv, xs = torch.compile(fn, fullgraph=True, backend="aot_eager")(meta(6, 256), meta(128, 256))
    assert y.shape == (6, 128) and xv.dtype == E4M3 and xs.shape == (2, 8)


@torch.no_grad()
def test_compile_fullgraph_module_traces_the_op():
    # The module's compiled path with a (stand-in) FP8 layer: the op is one node, no graph break.
    torch._dynamo.reset()
    lin = nn.Linear(256, 384, bias=False, device="meta", dtype=BF16)
    mod = Fp8ProjLinear.from_linear(lin, name="t")
    mod._fp8, mod._proj = True, types.SimpleNamespace(id=11)
    rec = _Recorder()
    y = torch.compile(mod, fullgraph=True, backend=rec)(meta(4, 256))
    assert y.shape == (4, 384)
    assert len(rec.graphs) == 1 and "fp8proj.linear" in _op_targets(rec.graphs[0])

    norm = types.SimpleNamespace(weight=nn.Parameter(meta(256)), variance_epsilon=1e-6)
    fused = Fp8ProjRMSNormLinear.__new__(Fp8ProjRMSNormLinear)
    nn.Module.__init__(fused)
    fused.__dict__["_norm"] = norm
    fused.eps = 1e-6
    fused._setup(lin.weight, None, "f", {"enabled": False}, None)
    fused._fp8, fused._proj = True, types.SimpleNamespace(id=12)
    rec = _Recorder()
    y = torch.compile(fused, fullgraph=True, backend=rec)(meta(4, 256))
    assert y.shape == (4, 384) and "fp8proj.rmsnorm_linear" in _op_targets(rec.graphs[0])


@pytest.mark.parametrize("name", ["quantize_activation", "quantize_weight", "linear"])
def test_cpu_tensors_to_gpu_ops_raise(name):
    x = torch.zeros(4, 128, dtype=BF16)
    args = {"quantize_activation": (x,), "quantize_weight": (x,), "linear": (x, x, 1)}[name]
    with pytest.raises(ValueError, match="CPU tensors"):
        getattr(ops, name)(*args)


def test_argument_errors_name_the_problem():
    qa, rq, gemm = ops._quantize_activation_cuda, ops._rmsnorm_quantize_cuda, ops._fp8_gemm_cuda
    with pytest.raises(TypeError, match="x must be torch.bfloat16, got torch.float32"):
        qa(torch.zeros(4, 128))
    with pytest.raises(ValueError, match="K=100 must be a positive multiple of 128"):
        qa(torch.zeros(4, 100, dtype=BF16))
    with pytest.raises(ValueError, match="must be contiguous"):
        qa(torch.zeros(128, 4, dtype=BF16).t())
    with pytest.raises(ValueError, match=r"weight must have shape \(128,\)"):
        rq(torch.zeros(4, 128, dtype=BF16), torch.zeros(64, dtype=BF16), 1e-6)
    with pytest.raises(ValueError, match="last dimension must have stride 1"):
        rq(torch.zeros(128, 4, dtype=BF16).t(), torch.zeros(4, dtype=BF16), 1e-6)
    with pytest.raises(TypeError, match="xv must be torch.float8_e4m3fn"):
        gemm(torch.zeros(4, 128, dtype=BF16), torch.zeros(1, 4), torch.zeros(128, 128, dtype=E4M3),
             torch.zeros(1, 1))
    with pytest.raises(ValueError, match=r"xs must be \[K/128=1"):
        gemm(torch.zeros(5, 128, dtype=E4M3), torch.zeros(1, 5), torch.zeros(128, 128, dtype=E4M3),
             torch.zeros(1, 1))
    with pytest.raises(ValueError, match="x is on cpu; the fp8proj ops run on CUDA tensors"):
        qa(torch.zeros(4, 128, dtype=BF16))
    with pytest.raises(ValueError, match="w is on cpu"):
        ops._quantize_weight_cuda(torch.zeros(128, 128, dtype=BF16))
    with pytest.raises(ValueError, match="handle 424242 is not live"):
        ops._linear_cuda(torch.zeros(4, 128, dtype=BF16), torch.zeros(128, 128, dtype=BF16), 424242)


def _fails(rc, needle):
    assert rc == -1
    msg = _lib.LIB.last_error()
    assert needle in msg, msg


def test_c_abi_error_paths_through_ctypes():
    L = _lib.LIB
    buf = (ctypes.c_uint8 * 4096)()
    p = ctypes.addressof(buf) + (-ctypes.addressof(buf)) % 16
    _fails(L.fp8proj_quantize_activation(p, 100, 4, 100, p, p, 4, None), "multiple of 128")
    _fails(L.fp8proj_quantize_activation(p, 128, 5, 128, p, p, 5, None), "multiple of 4")
    _fails(L.fp8proj_rmsnorm_quantize(p, 130, p, 1e-6, 4, 128, p, p, 4, None), "multiple of 8")
    _fails(L.fp8proj_quantize_weight(p, -1, 128, p, p, None), "must be positive")
    _fails(L.fp8proj_projection_forward(None, p, 1, p, None), "handle is null")
    _fails(L.fp8proj_projection_explain(None, 1, ctypes.create_string_buffer(8), 8), "handle is null")
    h = ctypes.c_void_p()
    _fails(L.fp8proj_fp8_gemm_create(p, p, 100, 128, 16, None, ctypes.byref(h)), "not a multiple of 16")
    assert not h.value
    opts = _lib.ProjectionOptions()
    assert L.fp8proj_projection_options_init(ctypes.byref(opts)) == 0
    opts.policy = b"never"
    _fails(L.fp8proj_projection_create(p, 128, 128, ctypes.byref(opts), ctypes.byref(h)), "policy must be")
    assert L.fp8proj_quantize_activation(None, 128, 0, 128, None, None, 0, None) == 0  # M = 0: a no-op


def test_device_fault_latch_from_python(monkeypatch):
    # A healthy process: no fault. Once a C call has reported one (_lib.fail records it), the
    # ops raise before they allocate -- a RuntimeError, as torch's own CUDA errors are.
    assert _lib.device_fault() is None and _lib.LIB.fp8proj_device_fault() is None
    assert issubclass(fp8proj.DeviceFaultError, RuntimeError)
    monkeypatch.setattr(_lib, "FAULT", "CUDA error cudaErrorIllegalAddress (synthetic)")
    with pytest.raises(fp8proj.DeviceFaultError, match="fp8proj.quantize_activation: .*unusable after an earlier "
                                                       "error: CUDA error cudaErrorIllegalAddress"):
        ops._cuda_impl("quantize_activation", ops._quantize_activation_cuda)(torch.empty(4, 128, dtype=BF16))


@cpu_only
def test_c_abi_without_gpu_says_so():
    L = _lib.LIB
    buf = (ctypes.c_uint8 * 4096)()
    p = ctypes.addressof(buf) + (-ctypes.addressof(buf)) % 16
    h = ctypes.c_void_p()
    _fails(L.fp8proj_projection_create(p, 128, 128, None, ctypes.byref(h)), "no usable CUDA GPU")
    _fails(L.fp8proj_quantize_weight(p, 128, 128, p, p, None), "no usable CUDA GPU")


@pytest.mark.parametrize("bias", [False, True])
def test_linear_bf16_fallback_is_nn_linear(bias):
    torch.manual_seed(0)
    lin = nn.Linear(256, 384, bias=bias, dtype=BF16)
    sd = {k: v.clone() for k, v in lin.state_dict().items()}
    mod = Fp8ProjLinear.from_linear(lin, name="layers.0.o_proj", enabled=True)
    assert mod.weight is lin.weight and (mod.bias is lin.bias)
    x = torch.randn(2, 7, 256, dtype=BF16)
    assert torch.equal(mod(x), lin(x))
    assert list(mod.state_dict()) == list(sd) and all(torch.equal(mod.state_dict()[k], v) for k, v in sd.items())
    assert not mod.uses_fp8(4096) and mod.extra_memory_bytes() == 0
    assert "bf16 via torch" in mod.explain(4096)
    # Loading a state_dict rebuilds the layer and keeps the fallback exact.
    new = {k: torch.randn_like(v) for k, v in sd.items()}
    mod.load_state_dict(new)
    assert torch.equal(mod(x), torch.nn.functional.linear(x, new["weight"], new.get("bias")))


def test_fused_norm_fallback_is_norm_then_linear():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm
    torch.manual_seed(0)
    norm = DeepseekV3RMSNorm(256).to(BF16)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(256) + 0.5)
    lin = nn.Linear(256, 384, bias=False, dtype=BF16)
    mod = Fp8ProjRMSNormLinear.from_modules(norm, lin, name="q_b_proj")
    assert isinstance(mod.norm_passthrough, DeferredRMSNorm) and mod.norm_passthrough.weight is norm.weight
    assert list(mod.state_dict()) == ["weight"]
    wide = torch.randn(5, 320, dtype=BF16)
    x = wide[:, :256]  # a row-strided view
    assert torch.equal(mod(x), lin(norm(x)))
    assert mod.eps == norm.variance_epsilon


def test_module_errors():
    with pytest.raises(TypeError, match="needs an nn.Linear"):
        Fp8ProjLinear.from_linear(nn.Conv1d(4, 4, 1), name="c")
    with pytest.raises(ValueError, match="policy must be"):
        Fp8ProjLinear.from_linear(nn.Linear(128, 128), name="p", policy="sometimes")
    with pytest.raises(ValueError, match="scales must be 'ue8m0' or 'float', got 'e8m0'"):
        Fp8ProjLinear.from_linear(nn.Linear(128, 128), name="p", scales="e8m0")


def test_weight_scales_option_reaches_the_layer(monkeypatch):
    # The scale format of the FP8 copy: argument, then FP8PROJ_WEIGHT_SCALES on top (as in C++).
    monkeypatch.delenv("FP8PROJ_WEIGHT_SCALES", raising=False)
    lin = nn.Linear(256, 256, bias=False, dtype=BF16)
    assert Fp8ProjLinear.from_linear(lin, name="a").weight_scales() == "ue8m0"
    assert Fp8ProjLinear.from_linear(lin, name="b", scales="float").weight_scales() == "float"
    monkeypatch.setenv("FP8PROJ_WEIGHT_SCALES", "float")
    assert Fp8ProjLinear.from_linear(lin, name="c", scales="ue8m0").weight_scales() == "float"


@cpu_only
def test_fallback_is_said_once(caplog):
    import fp8proj.torch as ft
    ft._said.clear()
    with caplog.at_level(logging.WARNING, logger="fp8proj"):
        for i in range(3):
            Fp8ProjLinear.from_linear(nn.Linear(128, 128, dtype=BF16), name=f"l{i}")
    said = [r for r in caplog.records if "run bf16" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]


def _tiny_model(cls_name="DeepseekV3ForCausalLM", **kw):
    import transformers
    torch.manual_seed(0)
    if cls_name == "DeepseekV3ForCausalLM":
        cfg = tiny_deepseek_v3_config(**kw)
    else:
        cfg_cls = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))
        cfg = cfg_cls(vocab_size=256, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=128,
                      kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=64,
                      first_k_dense_replace=8, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
                      index_topk=8, index_head_dim=64, index_n_heads=2)
    return getattr(transformers, cls_name)(cfg).to(BF16).eval()


def test_transformers_patch_deepseek_v3():
    from fp8proj.integrations.transformers import patch, unpatch
    model = _tiny_model()
    ids = torch.randint(0, 256, (2, 12))
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        ref = model(ids).logits
    report = patch(model)
    names = [f"model.layers.{i}.self_attn.{t}" for i in range(2) for t in ("q_b_proj", "o_proj")]
    assert report.patched == names
    assert report.fused == [n for n in names if n.endswith("q_b_proj")]
    assert report.skipped == []
    attn = model.model.layers[0].self_attn
    assert isinstance(attn.q_b_proj, Fp8ProjRMSNormLinear) and isinstance(attn.q_a_layernorm, DeferredRMSNorm)
    assert isinstance(attn.o_proj, Fp8ProjLinear)
    assert list(model.state_dict()) == list(sd)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in sd.items())
    if not HAVE_GPU:
        with torch.no_grad():
            assert torch.equal(model(ids).logits, ref)
        assert "bf16" in report.note
    assert patch(model).patched == []  # patching twice patches nothing more
    assert unpatch(model) == 6
    assert type(model.model.layers[0].self_attn.o_proj) is nn.Linear
    assert type(model.model.layers[0].self_attn.q_a_layernorm).__name__ == "DeepseekV3RMSNorm"
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref)


def test_transformers_patch_all_targets():
    from fp8proj.integrations.transformers import ALL_TARGETS, patch, unpatch
    model = _tiny_model()
    ids = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        ref = model(ids).logits
    report = patch(model, targets=ALL_TARGETS)
    kinds = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")
    assert sorted(report.patched) == sorted(f"model.layers.{i}.self_attn.{t}" for i in range(2) for t in kinds)
    assert report.skipped == []  # q_proj, absent where there is a q LoRA, is not a skip
    attn = model.model.layers[0].self_attn
    assert all(isinstance(getattr(attn, t), (Fp8ProjLinear, Fp8ProjRMSNormLinear)) for t in kinds)
    if not HAVE_GPU:
        with torch.no_grad():
            assert torch.equal(model(ids).logits, ref)
    unpatch(model)
    assert all(type(getattr(attn, t)) is nn.Linear for t in kinds)
    with pytest.raises(TypeError, match="sequence of names"):
        patch(model, targets="q_b_proj")  # a string would be read as its letters
    with pytest.raises(ValueError, match="unknown targets"):
        patch(model, targets=("q_b_proj", "k_proj"))


def test_transformers_patch_scales_option(monkeypatch):
    from fp8proj.integrations.transformers import patch, unpatch
    monkeypatch.delenv("FP8PROJ_WEIGHT_SCALES", raising=False)
    model = _tiny_model()
    with pytest.raises(ValueError, match="scales must be 'ue8m0' or 'float'"):
        patch(model, scales="fp8")
    report = patch(model, scales="float")
    assert len(report.patched) == 4
    for name in report.patched:
        assert model.get_submodule(name).weight_scales() == "float"
    unpatch(model)


def test_transformers_patch_q_lora_none():
    from fp8proj.integrations.transformers import patch
    model = _tiny_model(q_lora_rank=None)
    report = patch(model)
    assert report.patched == ["model.layers.0.self_attn.o_proj", "model.layers.1.self_attn.o_proj"]
    assert ("model.layers.0.self_attn.q_b_proj", "absent") in report.skipped


@pytest.mark.parametrize("cls_name", ["DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"])
def test_transformers_patch_dsa_keeps_the_norm(cls_name):
    import transformers
    if not hasattr(transformers, cls_name):
        pytest.skip(f"transformers {transformers.__version__} has no {cls_name}")
    from fp8proj.integrations.transformers import patch, unpatch
    model = _tiny_model(cls_name)
    report = patch(model)
    attn = model.model.layers[0].self_attn
    assert "model.layers.0.self_attn.q_b_proj" in report.patched and report.fused == []
    assert isinstance(attn.q_b_proj, Fp8ProjLinear) and not isinstance(attn.q_a_layernorm, DeferredRMSNorm)
    why = dict(report.skipped)["model.layers.0.self_attn.q_a_layernorm"]
    assert "indexer" in why or "other than" in why
    unpatch(model)
    assert type(attn.q_b_proj) is nn.Linear


def test_bench_model_configs_have_the_attention_dims():
    from fp8proj import bench
    glm = bench.model_config("glm5")
    assert (glm.hidden_size, glm.num_attention_heads, glm.q_lora_rank, glm.kv_lora_rank) == (6144, 64, 2048, 512)
    assert (glm.qk_nope_head_dim, glm.qk_rope_head_dim, glm.v_head_dim) == (192, 64, 256)
    v3 = bench.model_config("deepseek-v3")
    assert (v3.hidden_size, v3.num_attention_heads, v3.q_lora_rank, v3.qk_nope_head_dim, v3.v_head_dim) == \
        (7168, 128, 1536, 128, 128)
    assert glm.first_k_dense_replace > glm.num_hidden_layers == 2  # dense layers only, no MoE
    if not HAVE_GPU:
        assert bench.main(["--out", "/nonexistent/never-written"]) == 2  # says why and exits


def test_opt_in_reads_the_knob_like_cpp(monkeypatch):
    from fp8proj.torch import _fp8_wanted
    monkeypatch.delenv("FP8PROJ_PREFILL_FP8", raising=False)
    assert _fp8_wanted(True) and not _fp8_wanted(False)
    for v, want in (("0", False), ("off", False), ("1", True), ("prefill", True), ("all", True), ("bogus", True)):
        monkeypatch.setenv("FP8PROJ_PREFILL_FP8", v)
        assert _fp8_wanted(False) == want and _fp8_wanted(True) == want, v


def test_import_without_the_library(tmp_path):
    # A library that cannot be loaded: the package still imports, says why, and modules run bf16.
    import subprocess
    import sys
    code = ("import torch, fp8proj; from fp8proj.torch import Fp8ProjLinear; ok, why = fp8proj.cuda_status(); "
            "assert not ok and 'could not be loaded' in why, why; "
            "lin = torch.nn.Linear(128, 128); m = Fp8ProjLinear.from_linear(lin, name='x', enabled=True); "
            "x = torch.randn(2, 128); assert torch.equal(m(x), lin(x)); print('ok')")
    env = dict(os.environ, FP8PROJ_PYTHON_LIB=str(tmp_path / "missing" / "libfp8proj_c.so"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("cls_name", ["DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"])
def test_transformers_patch_dsa_expand_kv(cls_name):
    """DeepSeek-V3.2 and GLM-5 (DSA) expand their cached latent with expand_kv too: patch() takes it
    where the layout checks out (kv_expand.py), bitwise, and the model's output is unchanged on
    the CPU (the class's expand_kv serves there)."""
    import transformers
    if not hasattr(transformers, cls_name):
        pytest.skip(f"transformers {transformers.__version__} has no {cls_name}")
    from fp8proj.integrations.kv_expand import KeyValueExpand, expand_kv_skip_reason
    from fp8proj.integrations.transformers import ALL_TARGETS, patch, unpatch
    model = _tiny_model(cls_name)
    attn = model.model.layers[0].self_attn
    assert expand_kv_skip_reason(attn) == ""
    ids = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        want = model(ids).logits
    report = patch(model, enabled=True, targets=ALL_TARGETS)
    assert "model.layers.0.self_attn" in report.expanded and isinstance(attn.__dict__["expand_kv"], KeyValueExpand)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)
    unpatch(model)
    assert "expand_kv" not in attn.__dict__


def test_packaged_tables_are_found_by_gpu_name(monkeypatch):
    # Every table the package carries is the one its GPU's name maps to (the C++ file-name rule),
    # and the import points FP8PROJ_TUNE_FILE at it -- but never over a user's own setting, and
    # not at all for a GPU without a table.
    import json

    tables = sorted((_lib._HERE / "configs").glob("*.json"))
    names = {t.name for t in tables}
    assert {"nvidia-h200.json", "nvidia-h100-80gb-hbm3.json"} <= names, names
    for t in tables:
        gpu = json.loads(t.read_text())["stamp"]["gpu_name"]
        assert _lib._tune_file_name(gpu) == t.name, (gpu, t.name)
        monkeypatch.delenv("FP8PROJ_TUNE_FILE", raising=False)
        _lib._point_at_packaged_table(gpu)
        assert os.environ["FP8PROJ_TUNE_FILE"] == str(t)
    monkeypatch.delenv("FP8PROJ_TUNE_FILE", raising=False)
    _lib._point_at_packaged_table("NVIDIA H800 PCIe")
    assert "FP8PROJ_TUNE_FILE" not in os.environ
    monkeypatch.setenv("FP8PROJ_TUNE_FILE", "/my/table.json")
    _lib._point_at_packaged_table("NVIDIA H200")
    assert os.environ["FP8PROJ_TUNE_FILE"] == "/my/table.json"
    assert _lib._tune_file_name("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3.json"
    assert _lib._tune_file_name("  NVIDIA--H200 ") == "nvidia-h200.json"
