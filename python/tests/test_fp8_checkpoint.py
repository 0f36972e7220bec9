"""FP8 checkpoints through fp8proj on the CPU: transformers' FP8Linear modules (made the way its
fine-grained FP8 quantizer makes them: replace_with_fp8_linear, then e4m3 weights and fp32 or
UE8M0 weight_scale_inv per 128x128 block from the bf16 weights), detected and reported by
patch(), run without the `kernels` package, put back exactly by unpatch(); the fp32-scale path
against the fp64 product of independently dequantized operands (numpy + ml_dtypes); the
activation rule against transformers' own two rules; torch.compile tracing. The same modules on
a Hopper GPU run fp8proj's kernels (python/tests/test_gpu.py)."""

import ml_dtypes
import numpy as np
import pytest
import torch
from torch import nn

import fp8proj
from fp8proj.fp8_linear import (Fp8CheckpointLinear, dequantize_weight, fp8_linear_skip_reason,
                                quantize_activation_float_reference)

from conftest import tiny_deepseek_v3_config

pytest.importorskip("transformers.integrations.finegrained_fp8", reason="transformers without fine-grained FP8")
from transformers.integrations.finegrained_fp8 import FP8Linear  # noqa: E402

BF16 = torch.bfloat16
E4M3 = torch.float8_e4m3fn
HAVE_GPU = fp8proj.cuda_status()[0]


def kernels_available() -> bool:
    from transformers.utils.import_utils import is_kernels_available
    return is_kernels_available()


def quantize_like_transformers(w: torch.Tensor, scale_fmt: str):
    """transformers' Fp8Quantize rule (scale = 448 / amax per block, weight_scale_inv = 1 / scale,
    codes = e4m3(clamp(w * scale)); UE8M0: weight_scale_inv rounded up to a power of two first),
    with partial edge blocks as FP8 checkpoints store them (ceil(N/128) x ceil(K/128) scales)."""
    n, k = w.shape
    rb, cb = -(-n // 128), -(-k // 128)
    wp = torch.zeros(rb * 128, cb * 128)
    wp[:n, :k] = w.float()
    blocks = wp.view(rb, 128, cb, 128)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, 448.0 / amax.clamp_min(1e-30), torch.ones_like(amax))
    inv = (1.0 / scale).float()
    if scale_fmt == "ue8m0":
        inv = torch.pow(2.0, torch.ceil(torch.log2(inv)))
        scale = 1.0 / inv
    q = torch.clamp(blocks * scale[:, None, :, None], -448.0, 448.0).to(E4M3).view(rb * 128, cb * 128)[:n, :k]
    return q.contiguous(), (inv.to(torch.float8_e8m0fnu) if scale_fmt == "ue8m0" else inv)


def fp8_model(scale_fmt="float", moe=False, **cfg):
    """A tiny DeepseekV3 with its linear layers replaced by transformers' FP8Linear (and FP8Experts
    with moe), holding the transformers-quantized bf16 weights; lm_head stays bf16. cfg: changes to
    tiny_deepseek_v3_config."""
    from transformers import DeepseekV3ForCausalLM, FineGrainedFP8Config
    from transformers.integrations.finegrained_fp8 import replace_with_fp8_linear

    torch.manual_seed(0)
    cfg.setdefault("first_k_dense_replace", 1 if moe else 8)
    model = DeepseekV3ForCausalLM(tiny_deepseek_v3_config(**cfg)).to(BF16).eval()
    bf16 = {k: v.clone() for k, v in model.state_dict().items()}
    qcfg = FineGrainedFP8Config(weight_block_size=[128, 128], scale_fmt=scale_fmt, modules_to_not_convert=["lm_head"])
    replace_with_fp8_linear(model, modules_to_not_convert=["lm_head"], quantization_config=qcfg, pre_quantized=True)
    g = torch.Generator().manual_seed(1)
    for name, mod in model.named_modules():
        if isinstance(mod, FP8Linear):
            mod.to_empty(device="cpu")
            q, s = quantize_like_transformers(bf16[name + ".weight"], scale_fmt)
            with torch.no_grad():
                mod.weight.copy_(q)
                mod.weight_scale_inv.data = s
        elif type(mod).__name__.startswith("FP8Experts"):
            mod.to_empty(device="cpu")
            for p in mod.parameters():  # random codes and scales: the experts never run here
                with torch.no_grad():
                    if p.dtype == E4M3:
                        p.copy_((torch.randn(p.shape, generator=g) * 0.1).to(E4M3))
                    else:
                        p.copy_(torch.rand(p.shape, generator=g).to(p.dtype) * 1e-3 + 1e-4)
    return model, bf16


def np_e4m3(x):
    return np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)


def np_float_rule(x):
    """(dequantized activations, scales) of fp8proj's fp32 rule, in numpy float32 (IEEE division)."""
    m, k = x.shape
    g = x.astype(np.float32).reshape(m, k // 128, 128)
    s = (np.maximum(np.abs(g).max(-1, keepdims=True), np.float32(1e-10)) / np.float32(448)).astype(np.float32)
    return (np_e4m3((g / s).astype(np.float32)) * s).reshape(m, k), s[..., 0]


# ---- detection and the report ---------------------------------------------------------------------

def test_fp8_linears_detected_and_reported():
    from fp8proj.integrations.transformers import patch, unpatch
    model, _ = fp8_model("float")
    sd = dict(model.state_dict())
    report = patch(model)
    taken = [f"model.layers.{i}.self_attn.{t}" for i in range(2) for t in ("q_b_proj", "o_proj")]
    assert sorted(report.patched) == sorted(taken) and sorted(report.fp8) == sorted(taken)
    # q_a_layernorm feeds q_b_proj alone (DeepSeek-V3's forward): fused into the FP8-checkpoint q_b_proj.
    assert sorted(report.fused) == [f"model.layers.{i}.self_attn.q_b_proj" for i in range(2)]
    left = dict(report.left)
    for i in range(2):
        for t in ("q_a_proj", "kv_a_proj_with_mqa", "kv_b_proj"):
            assert "not a target" in left[f"model.layers.{i}.self_attn.{t}"]
        for t in ("gate_proj", "up_proj", "down_proj"):
            assert "outside the MLA attention" in left[f"model.layers.{i}.mlp.{t}"]
        assert f"model.layers.{i}.self_attn.q_a_layernorm" not in dict(report.skipped)
    attn = model.model.layers[0].self_attn
    assert isinstance(attn.q_b_proj, Fp8CheckpointLinear) and isinstance(attn.q_a_proj, FP8Linear)
    norm = attn.q_b_proj.pre_norm
    assert type(attn.q_a_layernorm).__name__ == "DeferredRMSNorm" and attn.q_a_layernorm.weight is norm.weight
    assert "(q_a_layernorm fused)" in str(report)
    assert "RMSNorm before it " + ("fused" if attn.q_b_proj.uses_fp8_kernel else "runs first") in \
        attn.q_b_proj.explain(64)
    # The module's own tensors, shared: same state_dict keys, same tensor objects, nothing copied.
    after = dict(model.state_dict())
    assert list(after) == list(sd)
    assert all(after[k].data_ptr() == sd[k].data_ptr() and after[k].dtype == sd[k].dtype for k in sd)
    assert attn.q_b_proj.weight.data_ptr() == sd["model.layers.0.self_attn.q_b_proj.weight"].data_ptr()
    want = sum(sd[f"{n}.weight"].numel() + 4 * sd[f"{n}.weight_scale_inv"].numel() for n in taken)
    assert report.fp8_weight_bytes == want
    assert report.fp8_extra_bytes == 0  # fp32 scales are used as they are; no plan off the GPU
    text = str(report)
    assert "4 FP8 checkpoint layers" in text and f"{want} bytes of e4m3 weights and scales" in text
    assert "left on transformers' path model.layers.0.mlp.gate_proj" in text
    if not HAVE_GPU:
        assert "run fp8proj's numerics in torch" in report.note
        assert "torch (weight dequantized per call" in attn.q_b_proj.explain(4096)
    assert unpatch(model) == 6  # 4 modules and the 2 norms
    assert attn.q_a_layernorm is norm and attn.q_b_proj.__class__ is FP8Linear
    r2 = patch(model, fuse_norm=False)
    assert r2.fused == [] and "fuse_norm" not in str(r2) and attn.q_a_layernorm is norm
    unpatch(model)
    assert patch(model, targets=("q_b_proj",)).fp8 == ["model.layers.0.self_attn.q_b_proj",
                                                       "model.layers.1.self_attn.q_b_proj"]


def test_all_fp8_linears_and_ue8m0_scales():
    from fp8proj.integrations.transformers import ALL_FP8_LINEARS, patch, unpatch
    model, _ = fp8_model("ue8m0")
    fp8_names = [n for n, m in model.named_modules() if isinstance(m, FP8Linear)]
    assert len(fp8_names) == 16 and all(model.get_submodule(n).weight_scale_inv.dtype == torch.float8_e8m0fnu
                                        for n in fp8_names)
    report = patch(model, targets=ALL_FP8_LINEARS)
    assert sorted(report.fp8) == sorted(fp8_names) and report.left == []
    scales = sum(model.get_submodule(n).weight_scale_inv.numel() for n in fp8_names)
    # UE8M0 scales widened once to fp32 (exact): 4 bytes per 128x128 block, the only extra memory.
    assert report.fp8_extra_bytes == 4 * scales
    m = model.get_submodule("model.layers.0.mlp.down_proj")
    assert m.scale_format == "ue8m0" and torch.equal(m.scales_fp32, m.weight_scale_inv.float())
    unpatch(model)


def test_moe_experts_and_other_layers_are_listed_with_the_reason():
    from fp8proj.integrations.transformers import ALL_FP8_LINEARS, patch
    model, _ = fp8_model("float", moe=True)
    report = patch(model, targets=ALL_FP8_LINEARS)
    left = dict(report.left)
    assert "MoE experts" in left["model.layers.1.mlp.experts"]
    assert "model.layers.1.mlp.shared_experts.gate_proj" in report.fp8
    assert not any(n.endswith("lm_head") for n in report.fp8)  # kept bf16 by the quantization config


def test_skip_reasons_name_the_problem():
    assert fp8_linear_skip_reason(nn.Linear(128, 128)) == "a Linear, not an FP8Linear"
    assert "per-tensor" in fp8_linear_skip_reason(FP8Linear(256, 256, block_size=None))
    assert "static" in fp8_linear_skip_reason(FP8Linear(256, 256, block_size=(128, 128), activation_scheme="static"))
    assert "(64, 64)" in fp8_linear_skip_reason(FP8Linear(256, 256, block_size=(64, 64)))
    assert "K=200 is not a multiple of 128" in fp8_linear_skip_reason(FP8Linear(200, 256, block_size=(128, 128)))
    assert "N=200 is not a multiple of 16" not in fp8_linear_skip_reason(FP8Linear(256, 208, block_size=(128, 128)))
    assert "N=200 is not a multiple of 16" in fp8_linear_skip_reason(FP8Linear(256, 200, block_size=(128, 128)))
    assert fp8_linear_skip_reason(FP8Linear(256, 208, block_size=(128, 128))) == ""  # a partial last block
    with pytest.raises(ValueError, match="per-tensor"):
        Fp8CheckpointLinear(FP8Linear(256, 256, block_size=None), name="x")


# ---- running without the `kernels` package; unpatch -----------------------------------------------

@pytest.mark.skipif(HAVE_GPU, reason="checks the CPU path; on a Hopper GPU test_gpu.py runs the kernels")
def test_model_without_kernels_runs_after_patch_and_unpatch_restores():
    from fp8proj.integrations.transformers import ALL_FP8_LINEARS, patch, unpatch
    model, bf16 = fp8_model("float")
    ids = torch.randint(0, 256, (2, 40))
    originals = {n: m for n, m in model.named_modules() if isinstance(m, FP8Linear)}
    if not kernels_available():
        with pytest.raises(ImportError, match="finegrained-fp8 kernel unavailable"), torch.no_grad():
            model(ids)  # what a user without the hub kernels gets today
    report = patch(model, targets=ALL_FP8_LINEARS)
    assert report.fused_mlp == ["model.layers.0.mlp (gate_proj + up_proj one GEMM)",
                                "model.layers.1.mlp (gate_proj + up_proj one GEMM)"]
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.isfinite(logits).all()
    # The dequantized model in bf16 (what dequantize=True gives): close, the difference being the
    # activations' FP8 rounding through two untrained layers.
    from transformers import DeepseekV3ForCausalLM
    ref_model = DeepseekV3ForCausalLM(tiny_deepseek_v3_config()).to(BF16).eval()
    sd = {}
    for k, v in model.state_dict().items():
        if k.endswith("weight_scale_inv"):
            continue
        name = k[:-len(".weight")]
        sd[k] = dequantize_weight(v, model.state_dict()[name + ".weight_scale_inv"]).to(BF16) \
            if v.dtype == E4M3 else v
    ref_model.load_state_dict(sd)
    with torch.no_grad():
        ref = ref_model(ids).logits
    rel = ((logits.float() - ref.float()).norm() / ref.float().norm()).item()
    assert rel < 0.2, rel
    norms = [layer.self_attn.q_a_layernorm.original for layer in model.model.layers]  # fused into q_b_proj
    # The modules, the norms fused into q_b_proj (and into the pairs where they fused) and each
    # MLP's forward.
    assert unpatch(model) == len(originals) + len(norms) + len(report.fused_input_norm) + len(report.fused_mlp)
    assert [layer.self_attn.q_a_layernorm for layer in model.model.layers] == norms
    assert not any("forward" in vars(layer.mlp) for layer in model.model.layers)
    for n, m in originals.items():  # the very modules, with their own forward
        assert model.get_submodule(n) is m and type(m).forward is FP8Linear.forward and "forward" not in vars(m)
    if not kernels_available():
        with pytest.raises(ImportError), torch.no_grad():
            model(ids)


# ---- numerics -------------------------------------------------------------------------------------

@pytest.mark.parametrize("scale_fmt,bias", [("float", False), ("ue8m0", False), ("float", True)])
def test_fp32_scale_path_against_the_dequantized_product(scale_fmt, bias):
    """Fp8CheckpointLinear's output (here the torch path; on the GPU the kernel, test_gpu.py)
    against the fp64 product of the operands dequantized independently: the activations by the
    float rule in numpy, the weight as codes x scales. Random e4m3 codes (no NaN) and random
    non-power-of-two scales; N = 272 (a partial last weight block)."""
    n, k, m = 272, 384, 37
    g = torch.Generator().manual_seed(7)
    lin = FP8Linear(k, n, block_size=(128, 128), scale_fmt=scale_fmt, has_bias=bias)
    codes = torch.randint(0, 256, (n, k), generator=g, dtype=torch.uint8)
    codes[(codes & 0x7f) == 0x7f] = 0x3c  # NaN codes -> a finite value
    with torch.no_grad():
        lin.weight.copy_(codes.view(E4M3))
        s = torch.rand(3, 3, generator=g) * 1e-2 + 1e-3
        lin.weight_scale_inv.data = s.to(torch.float8_e8m0fnu) if scale_fmt == "ue8m0" else s
        if bias:
            lin.bias.data = (torch.randn(n, generator=g) * 0.1).to(BF16)
    mod = Fp8CheckpointLinear(lin, name="t")
    x = (torch.randn(m, k, generator=g) * 2).to(BF16)
    x[3, 130] = 300.0  # an outlier: its group gets its own scale
    with torch.no_grad():
        y = mod(x.view(1, m, k))
    assert y.shape == (1, m, n) and y.dtype == BF16
    xd, _ = np_float_rule(x.float().numpy())
    sc = lin.weight_scale_inv.detach().float().numpy()
    wd = codes.view(E4M3).float().numpy().astype(np.float64) * np.repeat(np.repeat(sc, 128, 0), 128, 1)[:n, :k]
    ref = xd.astype(np.float64) @ wd.T
    if bias:
        ref = ref + lin.bias.detach().float().numpy()
    got = y[0].float().numpy().astype(np.float64)
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert np.isfinite(got).all() and err <= 2e-3, err  # kFp8GemmRelTol: the bf16 output rounding


def test_activation_rule_against_transformers_rules():
    """fp8proj's fp32 activation rule (amax/448 clamped at 1e-10, x / scale) against the two rules
    transformers' FP8Linear runs: its Triton kernel's (amax/448 floored at 1e-12, x / scale) --
    identical here -- and DeepGEMM's per_token_cast_to_fp8 (amax clamped at 1e-4, x * (1/scale)),
    which gives another code for a few values in 10^4, each one e4m3 step away."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4096, 2048, generator=g).to(BF16)
    q, s = quantize_activation_float_reference(x)
    xf = x.float().view(4096, 16, 128)
    amax = xf.abs().amax(-1, keepdim=True)
    triton_s = amax / torch.full_like(amax, 448.0)  # IEEE division (a scalar divisor can be a reciprocal multiply)
    triton_q = (xf / triton_s.clamp_min(1e-12)).to(E4M3)
    assert torch.equal(s, triton_s[..., 0]) and torch.equal(q.view(torch.uint8), triton_q.view(4096, 2048).view(torch.uint8))
    dg_s = amax.clamp_min(1e-4) / 448.0
    dg_q = (xf * (1.0 / dg_s)).to(E4M3).view(4096, 2048)
    diff = q.view(torch.uint8) != dg_q.view(torch.uint8)
    frac = diff.float().mean().item()
    print(f"codes differing from DeepGEMM's per_token_cast_to_fp8: {frac:.2e} ({int(diff.sum())} of {diff.numel()})")
    assert 0 < frac < 2e-3
    steps = (q.view(torch.uint8)[diff].int() - dg_q.view(torch.uint8)[diff].int()).abs()
    assert int(steps.max()) == 1  # adjacent codes (same sign): one e4m3 step


def test_reference_quantizer_against_numpy_and_nan():
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(9, 384, generator=g) * torch.logspace(-8, 3, 9)[:, None]).to(BF16)
    x[2, 5] = float("nan")
    x[4, 300] = float("inf")
    q, s = quantize_activation_float_reference(x)
    xd, s_np = np_float_rule(np.nan_to_num(x.float().numpy(), nan=0.0, posinf=0.0))
    fin = np.ones((9, 3), bool)
    fin[2, 0] = fin[4, 2] = False
    assert np.array_equal(np.isnan(s.numpy()), ~fin)
    assert np.array_equal(s.numpy()[fin], s_np[fin])
    deq = (q.float().view(9, 3, 128) * s.unsqueeze(-1)).view(9, 384).numpy()
    keep = np.repeat(fin, 128, axis=1)
    assert np.array_equal(deq[keep], xd[keep]) and np.isnan(deq[~keep]).all()


# ---- torch.compile -------------------------------------------------------------------------------

@torch.no_grad()
def test_compile_fullgraph_traces_the_two_ops():
    torch._dynamo.reset()
    lin = FP8Linear(256, 384, block_size=(128, 128), scale_fmt="float", has_bias=True).to("meta")
    mod = Fp8CheckpointLinear(lin, name="t")
    mod._fp8 = True  # as on a Hopper GPU: the ops' fake implementations carry the trace
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x = torch.empty(2, 5, 256, dtype=BF16, device="meta")
    y = torch.compile(mod, fullgraph=True, backend=backend)(x)
    assert y.shape == (2, 5, 384) and y.dtype == BF16
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert "fp8proj.quantize_activation" in targets and "fp8proj.fp8_gemm" in targets, targets


def test_compile_fullgraph_traces_the_fused_norm():
    """A q_b_proj that took its RMSNorm (fuse_norm): one rmsnorm_quantize (fp32 scales) and the GEMM."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm
    torch._dynamo.reset()
    lin = FP8Linear(256, 384, block_size=(128, 128), scale_fmt="float").to("meta")
    mod = Fp8CheckpointLinear(lin, name="q_b_proj")
    norm = DeepseekV3RMSNorm(256, eps=1e-6).to(device="meta", dtype=BF16)
    passthrough = mod.fuse_norm(norm)
    assert passthrough.weight is norm.weight and mod.norm_eps == 1e-6
    mod._fp8 = True
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with torch.no_grad():  # the norm's weight is a Parameter: with autograd on, the module runs unfused
        y = torch.compile(mod, fullgraph=True, backend=backend)(torch.empty(3, 256, dtype=BF16, device="meta"))
    assert y.shape == (3, 384) and len(graphs) == 1
    nodes = [n for n in graphs[0].graph.nodes if n.op == "call_function"]
    targets = [str(n.target) for n in nodes]
    assert "fp8proj.rmsnorm_quantize" in targets and "fp8proj.fp8_gemm" in targets, targets
    assert "fp8proj.quantize_activation" not in targets
    rq = next(n for n in nodes if str(n.target) == "fp8proj.rmsnorm_quantize")
    assert "float" in [a for a in rq.args if isinstance(a, str)] + list(rq.kwargs.values()), rq
    with pytest.raises(ValueError, match="shape"):
        Fp8CheckpointLinear(lin, name="other").fuse_norm(DeepseekV3RMSNorm(128).to("meta"))
