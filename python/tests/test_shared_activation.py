"""One activation quantization for q_a_proj and kv_a_proj_with_mqa (fp8_linear.SharedActivation):
the pair reuses it exactly when the second call reads the very same, unmodified tensor on the same
stream, and quantizes again otherwise; the outputs are bit-identical to the unshared modules';
nothing is held after the pair; patch() groups the pair of a transformers DeepseekV3 FP8 model
and says so. The CPU tests run the torch fallback path (the same rule); the GPU tests, the kernel
path and a CUDA graph capture, skip without a Hopper GPU."""
import gc
import weakref

import pytest
import torch

import fp8proj
from fp8proj import fp8_linear
from fp8proj.fp8_linear import Fp8CheckpointLinear, SharedActivation

pytest.importorskip("transformers.integrations.finegrained_fp8", reason="transformers without fine-grained FP8")
from transformers.integrations.finegrained_fp8 import FP8Linear  # noqa: E402

from test_fp8_checkpoint import fp8_model, quantize_like_transformers  # noqa: E402

BF16 = torch.bfloat16
HAVE_GPU = fp8proj.cuda_status()[0]


def fp8_linear_like_checkpoint(k, n, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    lin = FP8Linear(k, n, block_size=(128, 128), scale_fmt="float")
    q, s = quantize_like_transformers(torch.randn(n, k, generator=g) * 0.05, "float")
    lin.weight.data, lin.weight_scale_inv.data = q, s
    return lin.to(device)


def pair(device="cpu", k=384):
    """(q_a, kv_a) sharing one SharedActivation, and the same two layers unshared. kv_a has N = 192:
    a partial last weight block, like the models' 576."""
    qa_src, kv_src = fp8_linear_like_checkpoint(k, 256, 1, device), fp8_linear_like_checkpoint(k, 192, 2, device)
    qa = Fp8CheckpointLinear(qa_src, name="attn.q_a_proj")
    kv = Fp8CheckpointLinear(kv_src, name="attn.kv_a_proj_with_mqa")
    group = SharedActivation()
    group.add(qa)
    group.add(kv)
    plain = (Fp8CheckpointLinear(qa_src, name="q_a"), Fp8CheckpointLinear(kv_src, name="kv_a"))
    return qa, kv, group, plain


@pytest.fixture
def count_quantizations(monkeypatch):
    """How many times the torch path quantized an activation (every route goes through this one)."""
    calls = []
    real = fp8_linear.quantize_activation_reference

    def counted(x2, fmt="float"):
        calls.append(x2.shape)
        return real(x2, fmt)

    monkeypatch.setattr(fp8_linear, "quantize_activation_reference", counted)
    return calls


def x_like(shape=(2, 5, 384), seed=3):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2).to(BF16)


def same(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int16), b.view(torch.int16))


# ---- the hit rule on the torch path ------------------------------------------------------------------

@pytest.mark.parametrize("grad_mode", ["no_grad", "enabled"])
def test_pair_quantizes_once_and_matches_unshared(count_quantizations, grad_mode):
    qa, kv, group, (pq, pk) = pair()
    x = x_like()
    with torch.no_grad() if grad_mode == "no_grad" else torch.enable_grad():
        yq, yk = qa(x), kv(x)
        assert len(count_quantizations) == 1 and group.hits == 1 and not group.holding
        assert same(yq, pq(x)) and same(yk, pk(x))  # the unshared modules quantize twice more
    assert len(count_quantizations) == 3
    # Either order: whichever member comes first quantizes.
    with torch.no_grad():
        yk2, yq2 = kv(x), qa(x)
    assert len(count_quantizations) == 4 and same(yq2, yq) and same(yk2, yk)


def test_another_tensor_with_equal_values_is_quantized_again(count_quantizations):
    qa, kv, group, (_, pk) = pair()
    x = x_like()
    with torch.no_grad():
        qa(x)
        y = kv(x.clone())
    assert len(count_quantizations) == 2 and group.hits == 0
    assert same(y, pk(x))


@pytest.mark.parametrize("how", ["tensor", "view", "slice assignment"])
def test_in_place_change_between_the_calls_is_quantized_again(count_quantizations, how):
    qa, kv, group, (_, pk) = pair()
    x = x_like()
    before = x.clone()
    with torch.no_grad():
        qa(x)
        if how == "tensor":
            x.mul_(3)
        elif how == "view":
            x[1].add_(7)  # a view shares the base's version counter
        else:
            x[0, 2, 128:256] = 100.0
        y = kv(x)
        assert len(count_quantizations) == 2 and group.hits == 0
        assert same(y, pk(x))  # the modified input's result ...
        assert not same(y, pk(before))  # ... not the one quantized before the change


def test_inference_tensors_are_not_shared(count_quantizations):
    """An inference tensor keeps no version counter: an in-place write could not be seen, so the
    pair quantizes twice, and nothing is held."""
    qa, kv, group, (pq, pk) = pair()
    with torch.inference_mode():
        x = x_like()
        with pytest.raises(RuntimeError):
            x._version  # what makes sharing unsafe here
        yq = qa(x)
        assert not group.holding
        yk = kv(x)
        assert same(yq, pq(x)) and same(yk, pk(x))
    assert len(count_quantizations) == 4 and group.hits == 0


def test_input_requiring_grad_bypasses_the_group(count_quantizations):
    qa, kv, group, _ = pair()
    x = x_like().float().requires_grad_()
    qa(x), kv(x)
    assert len(count_quantizations) == 2 and group.hits == 0 and not group.holding


def test_nothing_held_after_the_pair():
    qa, kv, group, _ = pair()
    x = x_like()
    ref = weakref.ref(x)
    with torch.no_grad():
        qa(x)
        assert group.holding  # kept for kv_a ...
        kv(x)
    assert not group.holding  # ... and dropped once kv_a used it
    del x
    gc.collect()
    assert ref() is None


def test_one_module_called_twice_quantizes_twice(count_quantizations):
    """A member does not reuse its own entry: one module timed alone still pays its quantization;
    the later call replaces the entry, which the other member then uses."""
    qa, kv, group, (_, pk) = pair()
    x = x_like()
    with torch.no_grad():
        qa(x)
        qa(x)
        assert len(count_quantizations) == 2 and group.hits == 0
        y = kv(x)
    assert len(count_quantizations) == 2 and group.hits == 1 and same(y, pk(x))


def test_a_new_input_replaces_the_entry(count_quantizations):
    qa, kv, group, (_, pk) = pair()
    a, b = x_like(seed=5), x_like(seed=6)
    ra = weakref.ref(a)
    with torch.no_grad():
        qa(a)
        kv(b)  # a miss: b is kept now, not a
        del a
        gc.collect()
        assert ra() is None and group.holding
        qa(b)
    assert len(count_quantizations) == 2 and group.hits == 1 and not group.holding


def test_membership_is_checked():
    qa, kv, group, (pq, _) = pair()
    with pytest.raises(ValueError, match="already shares"):
        SharedActivation().add(qa)
    with pytest.raises(ValueError, match="already a member"):
        group.add(qa)
    assert "shared with attn.kv_a_proj_with_mqa" in qa.explain(64) and "shared" not in pq.explain(64)


@torch.no_grad()
def test_compile_bypasses_the_group():
    """Under torch.compile each module quantizes (two quantize nodes in the graph) and the group is
    never touched: Dynamo traces no host-side cache."""
    torch._dynamo.reset()
    mods = [Fp8CheckpointLinear(FP8Linear(256, n, block_size=(128, 128), scale_fmt="float").to("meta"), name=name)
            for n, name in ((384, "q_a"), (192, "kv_a"))]
    group = SharedActivation()
    for m in mods:
        m._fp8 = True  # as on a Hopper GPU: the ops' fake implementations carry the trace
        group.add(m)

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_a_proj, self.kv_a_proj_with_mqa = mods

        def forward(self, h):
            return self.q_a_proj(h), self.kv_a_proj_with_mqa(h)

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x = torch.empty(2, 5, 256, dtype=BF16, device="meta")
    yq, yk = torch.compile(Attn(), fullgraph=True, backend=backend)(x)
    assert yq.shape == (2, 5, 384) and yk.shape == (2, 5, 192)
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert targets.count("fp8proj.quantize_activation") == 2 and targets.count("fp8proj.fp8_gemm") == 2, targets
    assert group.hits == 0 and group.quantizations == 0 and not group.holding


# ---- patch() on a transformers model ---------------------------------------------------------------

def test_patch_shares_the_pair_and_changes_no_bit(count_quantizations):
    from fp8proj.integrations.transformers import ALL_FP8_LINEARS, patch, unpatch
    model, _ = fp8_model("float")
    originals = {n: m for n, m in model.named_modules() if isinstance(m, FP8Linear)}
    ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(0))
    report = patch(model, targets=ALL_FP8_LINEARS, share_inputs=False)
    assert report.shared == [] and dict(report.unshared)["model.layers.0.self_attn"] == "share_inputs=False"
    with torch.no_grad():
        unshared = model(ids).logits
    per_forward = len(count_quantizations)
    assert per_forward == 16  # every FP8 layer quantizes its input
    assert unpatch(model) == 20  # 16 modules, the 2 norms fused into q_b_proj, the 2 MLPs' forwards
    report = patch(model, targets=ALL_FP8_LINEARS, fuse_pair=False)
    assert report.shared == [f"model.layers.{i}.self_attn: q_a_proj + kv_a_proj_with_mqa share one activation "
                             "quantization (both read hidden_states; not fused: fuse_pair=False)" for i in range(2)]
    assert report.unshared == []
    assert "shared model.layers.1.self_attn: q_a_proj + kv_a_proj_with_mqa" in str(report)
    attn = model.model.layers[0].self_attn
    assert attn.q_a_proj.shared_activation is attn.kv_a_proj_with_mqa.shared_activation is not None
    count_quantizations.clear()
    with torch.no_grad():
        shared = model(ids).logits
    assert len(count_quantizations) == per_forward - 2  # one saved per layer
    assert torch.equal(shared, unshared)
    assert not any(model.get_submodule(f"model.layers.{i}.self_attn.q_a_proj").shared_activation.holding
                   for i in range(2))
    assert unpatch(model) == 20
    for n, m in originals.items():  # the very modules, with their own forward, no group attached
        assert model.get_submodule(n) is m and type(m).forward is FP8Linear.forward and "forward" not in vars(m)
        assert "shared_activation" not in vars(m)


def test_patch_says_why_a_pair_does_not_share():
    from fp8proj.integrations.transformers import patch
    model, _ = fp8_model("float")
    report = patch(model, targets=("q_a_proj", "o_proj"))
    why = dict(report.unshared)["model.layers.0.self_attn"]
    assert why.startswith("kv_a_proj_with_mqa is not run by fp8proj as an FP8 checkpoint layer (not a target")
    assert model.model.layers[0].self_attn.q_a_proj.shared_activation is None
    model, _ = fp8_model("float")
    assert patch(model).unshared == []  # neither of the pair taken (the default targets): nothing to say


class _TwoInputs(torch.nn.Module):
    def forward(self, hidden_states, other):
        q = self.q_a_proj(hidden_states)
        kv = self.kv_a_proj_with_mqa(other)
        return q, kv


class _Expression(torch.nn.Module):
    def forward(self, hidden_states):
        return self.q_a_proj(hidden_states), self.kv_a_proj_with_mqa(hidden_states * 2)


class _Nested(torch.nn.Module):
    def forward(self, h):
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj( h )))
        return q, self.kv_a_proj_with_mqa(h)


def test_pair_input_read_from_the_forward_source():
    from fp8proj.integrations.transformers import _pair_input
    assert _pair_input(_Nested()) == ("h", "")
    assert "q_a_proj(hidden_states) and kv_a_proj_with_mqa(other): two inputs" in _pair_input(_TwoInputs())[1]
    assert "kv_a_proj_with_mqa on something other than one variable" in _pair_input(_Expression())[1]
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention
    assert _pair_input(DeepseekV3Attention.__new__(DeepseekV3Attention)) == ("hidden_states", "")


# ---- the kernel path (Hopper GPU) ---------------------------------------------------------------------

@torch.no_grad()
@pytest.mark.parametrize("m", [1, 333, 4096])
def test_gpu_pair_bit_identical_to_unshared(gpu, m):
    qa, kv, group, (pq, pk) = pair("cuda", k=512)
    assert qa.uses_fp8_kernel and kv.uses_fp8_kernel
    x = torch.randn(m, 512, dtype=BF16, device="cuda")
    yq, yk = qa(x), kv(x)
    assert group.hits == 1 and group.quantizations == 1 and not group.holding
    assert same(yq, pq(x)) and same(yk, pk(x))
    # Another stream: the kept quantization was written on the first one, so it is made again.
    qa(x)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        yk2 = kv(x)
    torch.cuda.current_stream().wait_stream(s)
    assert group.hits == 1 and group.quantizations == 3 and same(yk2, yk)


@torch.no_grad()
def test_gpu_pair_in_a_cuda_graph(gpu):
    """A manual capture runs the modules eagerly: q_a_proj quantizes, kv_a_proj_with_mqa reuses it
    (one quantization and two GEMMs recorded); replays with new values in the static input give
    the unshared modules' outputs bit for bit. An entry kept before the capture, on the capture's
    own stream, is not used inside it (its codes would never be refreshed by a replay)."""
    qa, kv, group, (pq, pk) = pair("cuda", k=512)
    for mod in (qa, kv, pq, pk):
        mod.prepare()
    x = torch.randn(256, 512, dtype=BF16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            qa(x), kv(x)
        hits = group.hits
        qa(x)  # kept outside the capture, on the stream the capture will use: it must not use it
    g = torch.cuda.CUDAGraph()  # captured on s (CUDA refuses the legacy default stream)
    with torch.cuda.graph(g, stream=s):
        yq, yk = qa(x), kv(x)
    torch.cuda.current_stream().wait_stream(s)
    names_graph = hasattr(torch.cuda.CUDAGraph, "get_currently_capturing_graph")
    print(f"torch {torch.__version__}: CUDAGraph.get_currently_capturing_graph "
          f"{'present: shared in the capture' if names_graph else 'absent: not shared in a capture'}")
    assert group.hits == hits + (1 if names_graph else 0) and not group.holding
    for seed in range(3):
        x.copy_(torch.randn(x.shape, generator=torch.Generator("cuda").manual_seed(seed), device="cuda", dtype=BF16))
        g.replay()
        torch.cuda.synchronize()
        assert same(yq, pq(x)) and same(yk, pk(x))
