"""A gated MLP of FP8 checkpoint layers: silu(gate) * up quantized for down_proj in one pass
(torch.ops.fp8proj.silu_mul_quantize, fp8_linear.GatedMLP, patch(fuse_mlp=...))."""
import ctypes

import pytest
import torch
from torch import nn

import fp8proj
from fp8proj import _lib, ops
from fp8proj.fp8_linear import Fp8CheckpointLinear, FusedPair, GatedMLP, gated_mlp_skip_reason

pytest.importorskip("transformers.integrations.finegrained_fp8", reason="transformers without fine-grained FP8")
from transformers.integrations.finegrained_fp8 import FP8Linear  # noqa: E402

from test_fp8_checkpoint import fp8_model  # noqa: E402

BF16, E4M3 = torch.bfloat16, torch.float8_e4m3fn
HAVE_GPU = fp8proj.cuda_status()[0]


def meta(*shape, dtype=BF16):
    return torch.empty(shape, dtype=dtype, device="meta")


# ---- the op on any machine ---------------------------------------------------------------------------

def test_schema_and_fake_shapes():
    assert str(torch.ops.fp8proj.silu_mul_quantize.default._schema) == (
        'fp8proj::silu_mul_quantize(Tensor gate, Tensor up, str scale_fmt="ue8m0") -> (Tensor, Tensor)')
    gu = meta(7, 1024)  # the two column halves of one gate_up output
    v, s = ops.silu_mul_quantize(gu[:, :512], gu[:, 512:], "float")
    assert (v.shape, v.dtype, s.shape, s.dtype) == ((7, 512), E4M3, (4, 8), torch.float32)
    v, s = ops.silu_mul_quantize(meta(2, 3, 256), meta(2, 3, 256))
    assert v.shape == (2, 3, 256) and s.shape == (2, 8)
    with pytest.raises(ValueError, match="differ in shape"):
        ops.silu_mul_quantize(meta(4, 256), meta(4, 384))
    with pytest.raises(ValueError, match="scale_fmt"):
        ops.silu_mul_quantize(meta(4, 256), meta(4, 256), "e5m2")


def test_argument_errors_name_the_problem():
    f = ops._silu_mul_quantize_cuda
    with pytest.raises(TypeError, match="gate must be torch.bfloat16"):
        f(torch.zeros(4, 128), torch.zeros(4, 128, dtype=BF16))
    with pytest.raises(ValueError, match="K=100 must be a positive multiple of 128"):
        f(torch.zeros(4, 100, dtype=BF16), torch.zeros(4, 100, dtype=BF16))
    wide = torch.zeros(4, 512, dtype=BF16)
    with pytest.raises(ValueError, match="one row stride, got 512 and 128"):
        f(wide[:, :128], torch.zeros(4, 128, dtype=BF16))
    with pytest.raises(ValueError, match="gate is on cpu; the fp8proj ops run on CUDA tensors"):
        f(torch.zeros(4, 128, dtype=BF16), torch.zeros(4, 128, dtype=BF16))
    with pytest.raises(ValueError, match="CPU tensors"):
        ops.silu_mul_quantize(torch.zeros(4, 128, dtype=BF16), torch.zeros(4, 128, dtype=BF16))


def test_c_abi_error_paths_through_ctypes():
    L = _lib.LIB
    buf = (ctypes.c_uint8 * 4096)()
    p = ctypes.addressof(buf) + (-ctypes.addressof(buf)) % 16
    for args, needle in (((p, p, 256, 4, 100, 1, p, p, 4, None), "multiple of 128"),
                         ((p, p, 100, 4, 128, 1, p, p, 4, None), "stride=100"),
                         ((p, p, 256, 4, 128, 3, p, p, 4, None), "scale_format=3"),
                         ((p, p, 256, 5, 128, 1, p, p, 5, None), "multiple of 4")):
        assert L.fp8proj_silu_mul_quantize(*args) == -1
        assert needle in L.last_error(), L.last_error()
    assert L.fp8proj_silu_mul_quantize(None, None, 128, 0, 128, 1, None, None, 0, None) == 0  # M = 0: nothing


# ---- which MLPs qualify, and patch() ----------------------------------------------------------------

def _mlp_of(model):
    return model.model.layers[0].mlp


def _taken(mlp):
    for a in ("gate_proj", "up_proj", "down_proj"):
        setattr(mlp, a, Fp8CheckpointLinear(getattr(mlp, a), name=a))
    return mlp


def test_skip_reasons():
    model, _ = fp8_model("float", hidden_size=512)
    mlp = _mlp_of(model)
    assert "not all FP8 checkpoint layers" in gated_mlp_skip_reason(mlp)
    _taken(mlp)
    assert gated_mlp_skip_reason(mlp) == ""
    act = mlp.act_fn
    mlp.act_fn = nn.GELU()
    assert gated_mlp_skip_reason(mlp) == "act_fn is a GELU, not SiLU"
    mlp.act_fn = act

    class Other(type(mlp)):
        def forward(self, x):
            return self.down_proj(self.act_fn(self.up_proj(x)) * self.gate_proj(x))  # the roles swapped

    mlp.__class__ = Other
    assert gated_mlp_skip_reason(mlp) == "Other.forward is not down_proj(act_fn(gate_proj(x)) * up_proj(x))"
    with pytest.raises(ValueError, match="Other.forward is not"):
        GatedMLP(mlp, name="m")


def test_patch_fuses_each_mlp_and_unpatch_removes_it():
    from fp8proj.integrations.transformers import ALL_FP8_LINEARS, patch, unpatch
    model, _ = fp8_model("float", hidden_size=512)
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(0))
    report = patch(model, targets=ALL_FP8_LINEARS, fuse_mlp=False)
    assert report.fused_mlp == [] and "forward" not in vars(_mlp_of(model))
    with torch.no_grad():
        plain = model(ids).logits
    unpatch(model)
    report = patch(model, targets=ALL_FP8_LINEARS)
    mlp = _mlp_of(model)
    assert report.fused_mlp == [f"model.layers.{i}.mlp (gate_proj + up_proj one GEMM)" for i in range(2)]
    assert "fused model.layers.1.mlp (gate_proj + up_proj one GEMM): silu(gate_proj) * up_proj" in str(report)
    assert isinstance(vars(mlp)["forward"], GatedMLP) and isinstance(mlp.gate_proj.fused_pair, FusedPair)
    with torch.no_grad():
        out = model(ids).logits
    # The model's weights are on the CPU, off the kernel path: the MLP runs its own forward.
    assert torch.equal(out, plain) and mlp.forward.fused_calls == 0
    unpatch(model)
    assert "forward" not in vars(mlp) and type(mlp.gate_proj) is FP8Linear and mlp.gate_proj.weight.is_contiguous()
    # share_inputs=False: gate_proj and up_proj stay apart, the MLP is still fused.
    report = patch(model, targets=ALL_FP8_LINEARS, share_inputs=False)
    assert report.fused_mlp == [f"model.layers.{i}.mlp" for i in range(2)] and mlp.gate_proj.fused_pair is None
    unpatch(model)


# ---- the kernel path (Hopper GPU) ---------------------------------------------------------------------

def _eager(g, u, fmt):
    """What the module-by-module forward quantizes: PyTorch's bf16 silu(gate) * up, then the
    activation quantization."""
    return torch.ops.fp8proj.quantize_activation((torch.nn.functional.silu(g) * u).contiguous(), fmt)


@torch.no_grad()
@pytest.mark.parametrize("fmt", ["float", "ue8m0"])
@pytest.mark.parametrize("m,k", [(1, 128), (64, 12288), (333, 18432), (4096, 1536)])
def test_gpu_op_quantizes_what_eager_silu_times_up_gives(gpu, fmt, m, k):
    gu = torch.randn(m, 2 * k, dtype=BF16, device="cuda") * 3
    g, u = gu[:, :k], gu[:, k:]
    v, s = ops.silu_mul_quantize(g, u, fmt)
    ev, es = _eager(g, u, fmt)
    # fp8proj's own exp (the CPU reference's bits) against PyTorch's expf: the bf16 silu agrees
    # except where a last-bit exp difference moves a rounding near a tie (a handful of the 65,536
    # bf16 gates, if any), so at most a few codes may differ, and a group's scale only where one of
    # its codes does.
    diff = v.view(torch.uint8) != ev.view(torch.uint8)
    bad = diff.sum().item()
    assert bad <= m * k // 65536, f"{bad} of {m * k} codes differ from eager silu(gate) * up"
    group_diff = diff.view(m, k // 128, 128).any(-1).t()  # [K/128, M], as the scales
    assert torch.equal(s[:, :m][~group_diff], es[:, :m][~group_diff])
    v2, s2 = ops.silu_mul_quantize(g.contiguous(), u.contiguous(), fmt)  # dense tensors: the same bits
    assert torch.equal(v.view(torch.uint8), v2.view(torch.uint8)) and torch.equal(s[:, :m], s2[:, :m])
    if m > 2:
        gu[1, 5] = float("nan")
        v, s = ops.silu_mul_quantize(gu[:, :k], gu[:, k:], fmt)
        assert v[1, :128].view(torch.uint8).eq(0x7f).all() and torch.isnan(s[0, 1])


def _gpu_mlp(hidden=512, inter=1536):
    model, _ = fp8_model("float", hidden_size=hidden, intermediate_size=inter)
    model = model.to("cuda")
    return model, _mlp_of(model)


def _gpu_fused_mlp():
    """(model, mlp, pair, fused): layer 0's MLP on the GPU, taken, gate_proj + up_proj one pair, and
    the GatedMLP over it (not installed as the forward)."""
    model, mlp = _gpu_mlp()
    _taken(mlp)
    pair = FusedPair(mlp.gate_proj, mlp.up_proj)
    return model, mlp, pair, GatedMLP(mlp, name="mlp")


@torch.no_grad()
@pytest.mark.parametrize("m", [1, 64, 4096])
def test_gpu_fused_mlp_matches_the_module_by_module_forward(gpu, m):
    model, mlp = _gpu_mlp()
    _taken(mlp)
    x = torch.randn(m, 512, dtype=BF16, device="cuda")
    plain = type(mlp).forward(mlp, x)  # gate, up apart; eager silu * up; down_proj quantizes it
    FusedPair(mlp.gate_proj, mlp.up_proj)
    fused = GatedMLP(mlp, name="mlp")
    y = fused(x)
    pair = mlp.gate_proj.fused_pair
    assert fused.fused_calls == 1 and pair.joint_calls == 1 and pair.hits == 0  # one GEMM, called by the MLP
    # The same codes for down_proj; gate and up from one GEMM over both weights may take another
    # split-K order than apart: within a bf16 step of each output, far inside the FP8 error.
    assert ((y.float() - plain.float()).norm() / plain.float().norm()).item() < 5e-3
    d = mlp.down_proj
    q = torch.ops.fp8proj.silu_mul_quantize(*(lambda t: (t[..., :1536], t[..., 1536:]))(
        torch.ops.fp8proj.fp8_gemm(*torch.ops.fp8proj.quantize_activation(x, "float"), mlp.gate_proj.fused_pair.weight,
                                   mlp.gate_proj.fused_pair.scales)), "float")
    assert torch.equal(y, torch.ops.fp8proj.fp8_gemm(*q, d.weight, d._scales()))  # exactly the pass, then the GEMM
    assert "silu(gate) * up quantized in one pass" in fused.explain(m)


@torch.no_grad()
def test_gpu_fused_mlp_takes_batch_and_sequence_dims(gpu):
    # A decoder layer calls its MLP on [batch, seq, hidden]: the output keeps that shape and each
    # row equals the same MLP over the flattened rows.
    model, mlp, pair, fused = _gpu_fused_mlp()
    x = torch.randn(2, 33, 512, dtype=BF16, device="cuda")
    y = fused(x)
    assert y.shape == (2, 33, 512) and fused.fused_calls == 1
    assert torch.equal(y.reshape(66, 512), fused(x.reshape(66, 512)))


@torch.no_grad()
def test_gpu_fused_mlp_compiled_and_graphed(gpu):
    model, mlp, pair, fused = _gpu_fused_mlp()
    mlp.__dict__["forward"] = fused
    x = torch.randn(96, 512, dtype=BF16, device="cuda")
    y = mlp(x)
    yc = torch.compile(mlp, fullgraph=True)(x)  # the pair apart under Dynamo: a bf16 step at most
    assert ((yc.float() - y.float()).abs() <= 2 ** -7 * y.float().abs() + 1e-3).all()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        mlp(x)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        yg = mlp(x)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(yg, y)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_gpu_fused_mlp_runs_gate_and_up_as_one_gemm_under_either_mode(gpu, mode):
    # Inference tensors keep no version counter, so the pair's hand-over between two member calls
    # cannot hold; the MLP calls the pair once for both halves instead.
    model, mlp, pair, fused = _gpu_fused_mlp()
    x = torch.randn(40, 512, dtype=BF16, device="cuda")
    with torch.no_grad():
        want = fused(x)
    with getattr(torch, mode)():
        y = fused(fused_in := x.clone())
        assert fused_in.is_inference() == (mode == "inference_mode")
    assert torch.equal(y, want) and pair.joint_calls == 2 and fused.fused_calls == 2


@torch.no_grad()
def test_gpu_fused_mlp_steps_aside_for_hooks_and_another_act_fn(gpu):
    model, mlp, pair, fused = _gpu_fused_mlp()
    x = torch.randn(24, 512, dtype=BF16, device="cuda")
    seen = []
    # A hook on down_proj (or act_fn) must see its call: the module-by-module forward runs.
    h = mlp.down_proj.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape))
    y = fused(x)
    assert seen == [(24, 1536)] and fused.fused_calls == 0
    assert torch.equal(y, type(mlp).forward(mlp, x))
    h.remove()
    h = mlp.act_fn.register_forward_pre_hook(lambda mod, args: seen.append("act"))
    fused(x)
    assert seen[-1] == "act" and fused.fused_calls == 0
    h.remove()
    fused(x)
    assert fused.fused_calls == 1
    # act_fn replaced after the MLP was taken: the class's forward with the new act_fn.
    mlp.act_fn = nn.GELU()
    y = fused(x)
    assert fused.fused_calls == 1 and torch.equal(y, type(mlp).forward(mlp, x))
