"""q_a_proj and kv_a_proj_with_mqa of an FP8 checkpoint as one GEMM (fp8_linear.FusedPair): their
e4m3 weights and fp32 scales become row ranges of one buffer (the model holds the same bytes), a
call quantizes the shared input once and runs one GEMM, each module gets its columns; the numbers
are those of the modules run apart; where the pair cannot share (torch.compile, a moved weight)
each module runs alone, still right; unpatch gives each module its own buffers back, bit for bit.
The CPU tests run the torch path; the GPU tests, the kernels and a CUDA graph capture."""
import pytest
import torch

import fp8proj
from fp8proj import fp8_linear
from fp8proj.fp8_linear import Fp8CheckpointLinear, FusedPair, SharedActivation, fuse_pair_skip_reason
from fp8proj.torch import DeferredRMSNorm

pytest.importorskip("transformers.integrations.finegrained_fp8", reason="transformers without fine-grained FP8")
from transformers.integrations.finegrained_fp8 import FP8Linear  # noqa: E402

from test_fp8_checkpoint import fp8_model, quantize_like_transformers  # noqa: E402

BF16 = torch.bfloat16
HAVE_GPU = fp8proj.cuda_status()[0]


def checkpoint_linear(k, n, seed, fmt="float", device="cpu", bias=False):
    g = torch.Generator().manual_seed(seed)
    lin = FP8Linear(k, n, block_size=(128, 128), scale_fmt=fmt)
    q, s = quantize_like_transformers(torch.randn(n, k, generator=g) * 0.05, fmt)
    lin.weight.data, lin.weight_scale_inv.data = q, s
    if bias:  # set after construction: the keyword naming it differs across transformers versions
        lin.bias = torch.nn.Parameter(torch.randn(n, generator=g).to(BF16))
    return lin.to(device)


def fused(device="cpu", k=512, fmt="float", n1=256, n2=192):
    """(q_a, kv_a, pair) and, on copies of the same checkpoint tensors, the two modules apart."""
    qa_src, kv_src = checkpoint_linear(k, n1, 1, fmt, device), checkpoint_linear(k, n2, 2, fmt, device)
    apart = []
    for src, name in ((qa_src, "q_a"), (kv_src, "kv_a")):
        twin = checkpoint_linear(k, src.out_features, 0, fmt, device)
        twin.weight.data, twin.weight_scale_inv.data = src.weight.data.clone(), src.weight_scale_inv.data.clone()
        apart.append(Fp8CheckpointLinear(twin, name=name))
    qa = Fp8CheckpointLinear(qa_src, name="attn.q_a_proj")
    kv = Fp8CheckpointLinear(kv_src, name="attn.kv_a_proj_with_mqa")
    return qa, kv, FusedPair(qa, kv), apart


@pytest.fixture
def count_quantizations(monkeypatch):
    calls = []
    real = fp8_linear.quantize_activation_reference
    monkeypatch.setattr(fp8_linear, "quantize_activation_reference",
                        lambda x2, fmt="float": calls.append(x2.shape) or real(x2, fmt))
    return calls


def x_like(shape=(2, 5, 512), seed=3, device="cpu"):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2).to(BF16).to(device)


def captured(fn):
    """(a CUDA graph of fn, fn's outputs in it): warmed up once on a side stream, then captured."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        out = fn()
    return g, out


class Attn(torch.nn.Module):
    """The attention's use of the pair: both projections called on one input."""

    def __init__(self, qa, kv):
        super().__init__()
        self.q_a_proj, self.kv_a_proj_with_mqa = qa, kv

    def forward(self, h):
        return self.q_a_proj(h), self.kv_a_proj_with_mqa(h)


def close(a, b, tol=1e-2):
    return a.shape == b.shape and ((a.float() - b.float()).norm() / b.float().norm()).item() < tol


def near(a, b):
    """Equal up to one bf16 rounding step of each output (the fp32 sums may differ in their last
    bits between one product over both weights and two apart)."""
    d = (a.float() - b.float()).abs()
    return a.shape == b.shape and bool((d <= 2 ** -7 * b.float().abs() + 1e-6).all())


# ---- the buffer ------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["float", "ue8m0"])
def test_weights_become_ranges_of_one_buffer_with_the_same_values(fmt):
    qa_src, kv_src = checkpoint_linear(512, 256, 1, fmt), checkpoint_linear(512, 192, 2, fmt)
    before = {n: t.clone() for n, t in (("qw", qa_src.weight), ("kw", kv_src.weight),
                                        ("qs", qa_src.weight_scale_inv), ("ks", kv_src.weight_scale_inv))}
    params = [qa_src.weight, kv_src.weight, qa_src.weight_scale_inv, kv_src.weight_scale_inv]
    qa, kv = Fp8CheckpointLinear(qa_src, name="q"), Fp8CheckpointLinear(kv_src, name="kv")
    pair = FusedPair(qa, kv)
    # The very Parameters of the checkpoint's modules, now views of the pair's buffer.
    assert [qa_src.weight, kv_src.weight, qa_src.weight_scale_inv, kv_src.weight_scale_inv] == params
    assert pair.weight.shape == (448, 512) and pair.scales.shape == (2 + 2, 4)
    assert qa.weight.data_ptr() == pair.weight.data_ptr()
    assert kv.weight.data_ptr() == pair.weight[256].data_ptr()
    assert qa.weight.untyped_storage().data_ptr() == kv.weight.untyped_storage().data_ptr()
    assert torch.equal(qa_src.weight.view(torch.uint8), before["qw"].view(torch.uint8))
    assert torch.equal(kv_src.weight.view(torch.uint8), before["kw"].view(torch.uint8))
    if fmt == "float":  # the fp32 Parameters are ranges of the fp32 buffer too
        assert qa_src.weight_scale_inv.data_ptr() == pair.scales.data_ptr()
        assert torch.equal(qa_src.weight_scale_inv, before["qs"]) and torch.equal(kv_src.weight_scale_inv, before["ks"])
    else:  # UE8M0 Parameters untouched; their exact fp32 widening is what the buffer holds
        assert qa_src.weight_scale_inv.dtype == torch.float8_e8m0fnu
        assert torch.equal(qa.scales_fp32, before["qs"].float()) and qa.scales_fp32.data_ptr() == pair.scales.data_ptr()
    # The bytes the modules report are the checkpoint's, as before fusing.
    assert qa.memory()["fp8_weight"] == 256 * 512 and kv.memory()["fp8_weight"] == 192 * 512
    pair.unfuse()
    for mod, w, s in ((qa, "qw", "qs"), (kv, "kw", "ks")):
        assert mod.fused_pair is None
        assert torch.equal(mod.weight.view(torch.uint8), before[w].view(torch.uint8))
        assert torch.equal(mod.weight_scale_inv.float(), before[s].float())
    assert qa.weight.untyped_storage().data_ptr() != kv.weight.untyped_storage().data_ptr()


def test_skip_reasons():
    a = Fp8CheckpointLinear(checkpoint_linear(512, 256, 1), name="a")
    assert fuse_pair_skip_reason(a, Fp8CheckpointLinear(checkpoint_linear(256, 192, 2), name="b")) == \
        "in_features 512 and 256 differ"
    assert "has a bias" in fuse_pair_skip_reason(a, Fp8CheckpointLinear(checkpoint_linear(512, 192, 2, bias=True),
                                                                         name="b"))
    odd = Fp8CheckpointLinear(checkpoint_linear(512, 192, 3), name="odd")
    assert "192 rows, not a multiple of 128" in fuse_pair_skip_reason(odd, a)
    assert "weight_scale_inv" in fuse_pair_skip_reason(a, Fp8CheckpointLinear(checkpoint_linear(512, 192, 2, "ue8m0"),
                                                                                name="b"))
    # K = 384: one 128-row block of scales is 12 bytes, so b's would start 12 bytes in; K = 256 and
    # two blocks: 16 bytes, aligned.
    a3, b3 = (Fp8CheckpointLinear(checkpoint_linear(384, n, i), name=f"{n}") for i, n in ((1, 128), (2, 192)))
    assert fuse_pair_skip_reason(a3, b3) == ("192's scales would start 12 bytes into the joint buffer, not a multiple "
                                             "of 16 (the kernel's scale alignment)")
    a2, b2 = (Fp8CheckpointLinear(checkpoint_linear(256, n, i), name=f"{n}") for i, n in ((1, 256), (2, 192)))
    assert fuse_pair_skip_reason(a2, b2) == ""
    b = Fp8CheckpointLinear(checkpoint_linear(512, 192, 2), name="b")
    g = SharedActivation()
    g.add(b)
    assert fuse_pair_skip_reason(a, b) == "b is already grouped"
    with pytest.raises(ValueError, match="cannot fuse a and b: b is already grouped"):
        FusedPair(a, b)


# ---- calls on the torch path -----------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["float", "ue8m0"])
def test_one_quantization_one_gemm_and_the_numbers_of_the_modules_apart(count_quantizations, fmt):
    qa, kv, pair, (pq, pk) = fused(fmt=fmt)
    x = x_like()
    with torch.no_grad():
        yq, yk = qa(x), kv(x)
        assert len(count_quantizations) == 1 and pair.hits == 1 and not pair.holding
        rq, rk = pq(x), pk(x)
    assert yq.shape == (2, 5, 256) and yk.shape == (2, 5, 192)
    # One fp32 product over both weights: each column's sum is the same as apart, up to the BLAS's
    # blocking over K (the dequantized operands are identical).
    assert near(yq, rq) and near(yk, rk)
    assert yq.stride()[-2] == 448  # a view of the pair's output, as torch.split gives
    # Either order; a member called twice on one input runs the pair again.
    count_quantizations.clear()
    with torch.no_grad():
        yk2, yq2 = kv(x), qa(x)
        assert torch.equal(yk2, yk) and torch.equal(yq2, yq) and len(count_quantizations) == 1
        qa(x), qa(x)
    assert len(count_quantizations) == 3 and pair.holding  # kv's columns of the last call are kept
    pair.clear()


def test_another_input_or_a_modified_one_runs_again(count_quantizations):
    qa, kv, pair, (pq, pk) = fused()
    x, x2 = x_like(), x_like(seed=4)
    with torch.no_grad():
        qa(x)
        yk = kv(x2)  # another tensor: the pair runs again, on x2
        assert len(count_quantizations) == 2 and near(yk, pk(x2))
        pair.clear()
        qa(x)
        x.mul_(2)  # written in place after q_a_proj read it
        yk = kv(x)
        assert near(yk, pk(x))
    assert pair.hits == 0


def test_autograd_and_a_moved_weight_run_the_modules_apart(count_quantizations):
    qa, kv, pair, (pq, pk) = fused()
    x = x_like().requires_grad_()
    with torch.enable_grad():
        qa(x), kv(x)
    assert pair.hits == 0 and pair.quantizations == 0 and len(count_quantizations) == 2
    # A Parameter replaced by another buffer (what .to() another device does): the pair falls
    # apart, each module runs alone on its own weight, and the buffer is let go.
    y = x.detach()
    qa.weight.data = qa.weight.data.clone()
    with torch.no_grad():
        assert close(qa(y), pq(y), 1e-5) and close(kv(y), pk(y), 1e-5)
    assert pair.weight is None and not pair.intact() and pair.hits == 0
    assert "no longer" in qa.explain(16)


def test_inference_tensors_run_the_modules_apart(count_quantizations):
    # No version counter under torch.inference_mode: the other member's columns could not be handed
    # on, so the joint GEMM would run once per member. Each member runs alone on its own rows.
    qa, kv, pair, (pq, pk) = fused()
    with torch.inference_mode():
        x = x_like()
        yq, yk = qa(x), kv(x)
    assert x.is_inference() and pair.hits == 0 and pair.joint_calls == 0 and not pair.holding
    assert len(count_quantizations) == 2
    with torch.no_grad():
        assert close(yq, pq(x), 1e-5) and close(yk, pk(x), 1e-5)


def test_a_norm_whose_output_is_not_bf16_takes_the_torch_path(monkeypatch):
    # An fp32 norm weight: the norm module runs (rmsnorm_quantize takes bf16 weights) and its fp32
    # output goes the torch way, not into the kernel's bf16-only quantizer. The kernel path is
    # forced on here; any call into the kernel's ops fails the test.
    def no_kernel(*args, **kwargs):
        raise AssertionError("the kernel path got the norm's fp32 output")

    monkeypatch.setattr(fp8_linear, "block_fp8_linear", no_kernel)
    qa, kv, pair, (pq, pk) = fused()
    norm = norm_like().float()
    passthrough = pair.fuse_norm(norm)
    qa._fp8 = kv._fp8 = True
    x = x_like()
    with torch.no_grad():
        yq, yk = qa(passthrough(x)), kv(passthrough(x))
        xn = norm(x)
        assert xn.dtype == torch.float32 and pair.joint_calls == 1 and pair.hits == 1
        assert close(yq, pq(xn), 1e-5) and close(yk, pk(xn), 1e-5)
        solo = fused()[3][0]  # a q_a_proj alone, the same checkpoint tensors
        solo_pass = solo.fuse_norm(norm)
        solo._fp8 = True
        assert close(solo(solo_pass(x)), pq(xn), 1e-5)


def test_torch_compile_traces_the_modules_apart():
    qa, kv, pair, _ = fused("cpu")
    qa.to("meta"), kv.to("meta")

    graphs = []
    x = torch.empty(2, 5, 512, dtype=BF16, device="meta")
    yq, yk = torch.compile(Attn(qa, kv), fullgraph=True,
                           backend=lambda gm, ex: graphs.append(gm) or gm.forward)(x)
    assert yq.shape == (2, 5, 256) and yk.shape == (2, 5, 192)
    assert pair.hits == 0 and not pair.holding


# ---- patch() on a transformers model ---------------------------------------------------------------

def test_patch_fuses_the_pair_changes_no_byte_and_unpatch_restores(tmp_path):
    from fp8proj.integrations.transformers import ALL_FP8_LINEARS, patch, unpatch
    model, _ = fp8_model("float", hidden_size=512)  # K = 512: q_a_proj's scales end 16 bytes in
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(0))
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    report = patch(model, targets=ALL_FP8_LINEARS, fuse_pair=False)
    with torch.no_grad():
        shared = model(ids).logits
    unpatch(model)
    report = patch(model, targets=ALL_FP8_LINEARS)
    assert report.shared == [f"model.layers.{i}.self_attn: q_a_proj + kv_a_proj_with_mqa fused: one quantization "
                             "and one GEMM (N=128+192) over their weights laid end to end, no extra memory (both "
                             "read hidden_states)" for i in range(2)]
    attn = model.model.layers[0].self_attn
    assert attn.q_a_proj.fused_pair is attn.kv_a_proj_with_mqa.fused_pair is not None
    assert "fused with model.layers.0.self_attn.kv_a_proj_with_mqa" in attn.q_a_proj.explain(64)
    with torch.no_grad():
        out = model(ids).logits
    assert close(out, shared, 1e-3)
    # The state_dict holds the same values under the same keys while fused.
    now = model.state_dict()
    assert now.keys() == sd.keys() and all(torch.equal(now[k].view(torch.uint8) if now[k].dtype == torch.float8_e4m3fn
                                                        else now[k], sd[k].view(torch.uint8)
                                                        if sd[k].dtype == torch.float8_e4m3fn else sd[k]) for k in sd)
    # Each layer's input_layernorm went into its pair (the output above already ran through it).
    assert report.fused_input_norm == ["model.layers.0", "model.layers.1"]
    layer = model.model.layers[0]
    assert isinstance(layer.input_layernorm, DeferredRMSNorm) and attn.q_a_proj.fused_pair.norm is not None
    assert "the RMSNorm before it runs first" in attn.kv_a_proj_with_mqa.explain(64)  # weights on the CPU
    assert [n.split(" ")[0] for n in report.fused_mlp] == ["model.layers.0.mlp", "model.layers.1.mlp"]
    assert layer.mlp.gate_proj.fused_pair is layer.mlp.up_proj.fused_pair is not None
    # 16 modules, the 2 norms fused into q_b_proj and the 2 into the pairs, the 2 MLPs' forwards.
    assert unpatch(model) == 22
    assert "forward" not in vars(layer.mlp) and layer.mlp.gate_proj.weight.untyped_storage().nbytes() == \
        layer.mlp.gate_proj.weight.numel()
    assert type(layer.input_layernorm).__name__ == "DeepseekV3RMSNorm"
    q, kv = attn.q_a_proj, attn.kv_a_proj_with_mqa
    assert type(q) is FP8Linear and q.weight.untyped_storage().data_ptr() != kv.weight.untyped_storage().data_ptr()
    assert q.weight.untyped_storage().nbytes() == q.weight.numel()  # its own buffer again, no larger
    # And the unpatched model saves as loaded (safetensors refuses tensors that share a buffer).
    model.save_pretrained(tmp_path)
    from safetensors.torch import load_file
    saved = load_file(str(tmp_path / "model.safetensors"))
    k = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
    assert torch.equal(saved[k].view(torch.uint8), sd[k].view(torch.uint8))


def test_patch_keeps_the_input_norm_where_its_output_is_read_elsewhere():
    from fp8proj.integrations.transformers import ALL_FP8_LINEARS, patch, unpatch
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

    class Layer(ds.DeepseekV3DecoderLayer):  # the normalized rows also feed the residual
        def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                    use_cache=False, position_embeddings=None, **kwargs):
            hidden_states = self.input_layernorm(hidden_states)
            residual = hidden_states
            hidden_states, _ = self.self_attn(hidden_states=hidden_states, attention_mask=attention_mask,
                                              position_ids=position_ids, past_key_values=past_key_values,
                                              use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
            return residual + hidden_states

    model, _ = fp8_model("float", hidden_size=512)
    for layer in model.model.layers:
        layer.__class__ = Layer
    report = patch(model, targets=ALL_FP8_LINEARS)
    assert report.fused_input_norm == [] and len(report.shared) == 2
    assert dict(report.skipped)["model.layers.0.input_layernorm"] == (
        "not fused into the attention's q_a_proj + kv_a_proj_with_mqa: Layer.forward uses input_layernorm's output "
        "before the attention")
    assert type(model.model.layers[0].input_layernorm).__name__ == "DeepseekV3RMSNorm"
    unpatch(model)
    report = patch(model, targets=ALL_FP8_LINEARS, fuse_input_norm=False)
    assert report.fused_input_norm == [] and not any(n.endswith("input_layernorm") for n, _ in report.skipped)


def norm_like(k=512, seed=7):
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm
    norm = DeepseekV3RMSNorm(k, eps=1e-6).to(BF16)
    with torch.no_grad():
        norm.weight.copy_((torch.rand(k, generator=torch.Generator().manual_seed(seed)) + 0.5).to(BF16))
    return norm


def test_pair_with_its_norm_runs_the_norm_once_and_alone_each_member_applies_it(count_quantizations):
    qa, kv, pair, (pq, pk) = fused()
    norm = norm_like()
    passthrough = pair.fuse_norm(norm)
    assert isinstance(passthrough, DeferredRMSNorm) and passthrough.weight is norm.weight
    x = x_like()
    with torch.no_grad():
        yq, yk = qa(passthrough(x)), kv(passthrough(x))
        assert len(count_quantizations) == 1 and pair.hits == 1
        xn = norm(x)
        assert torch.equal(yq, qa_ref := pq(xn)) and torch.equal(yk, pk(xn))
        # Alone (another input each time: nothing to hand over), each member normalizes first.
        assert torch.equal(qa(x.clone()), qa_ref)
    with pytest.raises(ValueError, match="already have a norm fused"):
        pair.fuse_norm(norm)
    with pytest.raises(ValueError, match=r"shape \(512,\)"):
        fused()[2].fuse_norm(norm_like(256))
    with pytest.raises(ValueError, match="reads a shared input"):
        qa.fuse_norm(norm)
    pair.unfuse()
    assert pair.norm is None


def test_patch_shares_where_the_pair_cannot_be_fused():
    from fp8proj.integrations.transformers import ALL_FP8_LINEARS, patch
    model, _ = fp8_model("float")  # K = 256, q_a_proj 128 rows: its scales end 8 bytes in
    report = patch(model, targets=ALL_FP8_LINEARS)
    assert report.shared[0] == ("model.layers.0.self_attn: q_a_proj + kv_a_proj_with_mqa share one activation "
                                "quantization (both read hidden_states; not fused: "
                                "model.layers.0.self_attn.kv_a_proj_with_mqa's scales would start 8 bytes into the "
                                "joint buffer, not a multiple of 16 (the kernel's scale alignment))")
    attn = model.model.layers[0].self_attn
    assert attn.q_a_proj.fused_pair is None and attn.q_a_proj.shared_activation is not None


# ---- the kernel path (Hopper GPU) ---------------------------------------------------------------------

@torch.no_grad()
@pytest.mark.parametrize("m", [1, 64, 333, 4096])
def test_gpu_fused_pair_matches_the_modules_apart(gpu, m):
    qa, kv, pair, (pq, pk) = fused("cuda")
    for mod in (qa, kv, pq, pk):
        mod.prepare()
    assert qa.uses_fp8_kernel and "N=448" in qa.explain(m)
    x = torch.randn(m, 512, dtype=BF16, device="cuda")
    yq, yk = qa(x), kv(x)
    assert pair.hits == 1
    rq, rk = pq(x), pk(x)
    # The same codes and block products; only the kernel configuration chosen for N = 448 against
    # 256 and 192 may differ (split-K order): at most a bf16 rounding step apart.
    for y, r in ((yq, rq), (yk, rk)):
        d = (y.float() - r.float()).abs()
        assert (d <= 2 ** -7 * r.float().abs() + 1e-6).all(), d.max()


@torch.no_grad()
@pytest.mark.parametrize("m", [1, 64, 4096])
def test_gpu_pair_with_its_norm_is_the_fused_pass_then_the_gemm(gpu, m):
    qa, kv, pair, (pq, pk) = fused("cuda")
    norm = norm_like().to("cuda")
    pair.fuse_norm(norm)
    for mod in (qa, kv):
        mod.prepare()
    x = torch.randn(m, 512, dtype=BF16, device="cuda") * 3
    yq, yk = qa(x), kv(x)
    assert pair.hits == 1
    # Exactly: rmsnorm_quantize's codes (fp32 scales), then the pair's GEMM over both weights.
    q = torch.ops.fp8proj.rmsnorm_quantize(x, norm.weight, 1e-6, "float")
    y2 = fp8_linear.block_fp8_linear(x, pair.weight, pair.scales, "float", quantized=q)
    assert torch.equal(yq, y2[:, :256]) and torch.equal(yk, y2[:, 256:])
    # Against the norm module then the modules apart: two FP8 roundings of rows one bf16 rounding apart.
    xn = norm(x)
    assert close(yq, pq(xn), 3e-2) and close(yk, pk(xn), 3e-2)
    # torch.compile (the members run apart, each behind the fused pass) and a CUDA graph: the same bits.
    cq, ck = torch.compile(Attn(qa, kv), fullgraph=True)(x)
    d = (cq.float() - yq.float()).abs()
    assert (d <= 2 ** -7 * yq.float().abs() + 1e-6).all()  # N = 256 alone may pick another split-K order
    g, (gq, gk) = captured(lambda: (qa(x), kv(x)))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(gq, yq) and torch.equal(gk, yk)


@torch.no_grad()
def test_gpu_fused_pair_in_a_cuda_graph(gpu):
    qa, kv, pair, (pq, pk) = fused("cuda")
    for mod in (qa, kv):
        mod.prepare()
    x = torch.randn(256, 512, dtype=BF16, device="cuda")
    g, (yq, yk) = captured(lambda: (qa(x), kv(x)))
    assert not pair.holding
    for seed in (1, 2):
        x.copy_(torch.randn(256, 512, generator=torch.Generator().manual_seed(seed)).to(BF16))
        g.replay()
        torch.cuda.synchronize()
        eq, ek = qa(x), kv(x)
        assert torch.equal(yq, eq) and torch.equal(yk, ek)
