"""kv_b_proj writing the key layout of transformers' MLA attention (fp8proj/integrations/kv_expand.py):
the gapped columns, the check of the attention's own expand_kv, patch()/unpatch(), and on a Hopper
GPU the FP8 route against the class's expand_kv, in a CUDA graph and under torch.compile."""
import pytest
import torch

from conftest import tiny_deepseek_v3_config

pytest.importorskip("transformers.models.deepseek_v3", reason="transformers without DeepseekV3")


def tiny_model(device="cpu", **kw):
    from transformers import DeepseekV3ForCausalLM
    torch.manual_seed(0)
    return DeepseekV3ForCausalLM(tiny_deepseek_v3_config(**kw)).to(device=device, dtype=torch.bfloat16).eval()


def latent(attn, b, l, device="cpu", seed=1):
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn(b, 1, l, attn.kv_b_proj.in_features, generator=g).to(device, torch.bfloat16)
    k_rot = torch.randn(b, 1, l, attn.qk_rope_head_dim, generator=g).to(device, torch.bfloat16)
    return kv, k_rot


def test_gapped_columns_inserts_zero_columns_per_group():
    from fp8proj.ops import gapped_columns
    y = torch.arange(2 * 12, dtype=torch.float32).view(2, 12)  # 3 groups of 4 columns
    out = gapped_columns(y, 3, 1, 2)
    assert out.shape == (2, 18)
    g = out.view(2, 3, 6)
    assert torch.equal(g[..., :1], y.view(2, 3, 4)[..., :1]) and torch.equal(g[..., 3:], y.view(2, 3, 4)[..., 1:])
    assert not g[..., 1:3].any()
    assert torch.equal(gapped_columns(y, 3, 4, 0), y)  # no gap: the same columns


def test_the_attention_expand_kv_is_checked():
    from fp8proj.integrations.kv_expand import expand_kv_skip_reason
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention
    attn = tiny_model().model.layers[0].self_attn
    assert expand_kv_skip_reason(attn) == ""

    class Reordered(DeepseekV3Attention):  # value first: not the layout the replacement writes
        def expand_kv(self, kv_nope, k_rot):
            key, value = super().expand_kv(kv_nope, k_rot)
            return key.flip(-1), value

    other = Reordered(attn.config, 0).to(torch.bfloat16)
    assert "does not give the layout" in expand_kv_skip_reason(other)

    class NoExpand(DeepseekV3Attention):
        expand_kv = None

    assert "has no expand_kv" in expand_kv_skip_reason(NoExpand(attn.config, 0))
    odd = DeepseekV3Attention(attn.config, 0).to(torch.bfloat16)
    odd.kv_b_proj = torch.nn.Linear(odd.kv_b_proj.in_features, 8, bias=False).to(torch.bfloat16)
    assert "outputs, not heads" in expand_kv_skip_reason(odd)
    k, n = attn.kv_b_proj.in_features, attn.kv_b_proj.out_features
    odd.kv_b_proj = torch.nn.Linear(k, n, bias=True)
    assert "bias-free nn.Linear" in expand_kv_skip_reason(odd)
    odd.kv_b_proj = torch.nn.Linear(k, n, bias=False)
    assert "not bfloat16" in expand_kv_skip_reason(odd)  # float32
    with torch.device("meta"):
        odd.kv_b_proj = torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16)
    assert "meta device" in expand_kv_skip_reason(odd)


def test_patch_replaces_expand_kv_and_unpatch_restores_it():
    from fp8proj.integrations.kv_expand import KeyValueExpand
    from fp8proj.integrations.transformers import ALL_TARGETS, patch, unpatch
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention
    model = tiny_model()
    attns = [layer.self_attn for layer in model.model.layers]
    ids = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        want = model(ids).logits
    keys = set(model.state_dict())
    report = patch(model, enabled=True, policy="all", targets=ALL_TARGETS)
    assert report.expanded == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    assert "kv_b_proj writes the key layout" in str(report)
    assert all(isinstance(a.__dict__.get("expand_kv"), KeyValueExpand) for a in attns)
    assert set(model.state_dict()) == keys  # no Parameters or buffers added
    with torch.no_grad():
        got = model(ids).logits  # CPU: the modules run bf16 and the class's expand_kv serves
    assert torch.equal(got, want)
    assert attns[0].expand_kv.calls_gapped == 0 and "the class's expand_kv" in attns[0].expand_kv.explain(18)
    unpatch(model)
    assert all("expand_kv" not in a.__dict__ for a in attns)
    assert all(a.expand_kv.__func__ is DeepseekV3Attention.expand_kv for a in attns)


def test_patch_leaves_expand_kv_without_kv_b_proj_or_when_asked():
    from fp8proj.integrations.transformers import ALL_TARGETS, patch, unpatch
    model = tiny_model()
    assert patch(model, enabled=True).expanded == []  # the default targets: q_b_proj, o_proj
    unpatch(model)
    report = patch(model, enabled=True, targets=ALL_TARGETS, fuse_kv_expand=False)
    assert report.expanded == [] and all("expand_kv" not in layer.self_attn.__dict__ for layer in model.model.layers)


def test_linear_gapped_refuses_cpu_tensors_and_has_a_fake():
    from torch._subclasses.fake_tensor import FakeTensorMode
    import fp8proj.ops  # noqa: F401 - registers the ops
    x, w = torch.zeros(4, 128, dtype=torch.bfloat16), torch.zeros(8, 128, dtype=torch.bfloat16)
    wv, ws = torch.zeros(12, 128, dtype=torch.float8_e4m3fn), torch.zeros(1, 1)
    with pytest.raises(ValueError, match="CPU tensors"):
        torch.ops.fp8proj.linear_gapped(x, w, 0, wv, ws, 2, 1, 2)
    with FakeTensorMode():
        y = torch.ops.fp8proj.linear_gapped(torch.empty(3, 5, 128, dtype=torch.bfloat16, device="cuda"),
                                            torch.empty(8, 128, dtype=torch.bfloat16, device="cuda"), 0,
                                            torch.empty(12, 128, dtype=torch.float8_e4m3fn, device="cuda"),
                                            torch.empty(1, 1, device="cuda"), 2, 1, 2)
    assert y.shape == (3, 5, 12) and y.dtype == torch.bfloat16


# ---- on a Hopper GPU --------------------------------------------------------------------------

def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def patched_attention(gpu, policy="all"):
    from fp8proj.integrations.transformers import ALL_TARGETS, patch
    model = tiny_model(gpu)
    attn = model.model.layers[0].self_attn
    lin = attn.kv_b_proj
    report = patch(model, enabled=True, policy=policy, targets=ALL_TARGETS)
    assert "model.layers.0.self_attn" in report.expanded, str(report)
    return model, attn, lin


def test_fp8_route_matches_the_class_expand_kv(gpu):
    """M = 2 x 600 > 512: the layer's gate picks FP8 (no tuned row for the tiny shape); key and
    value are views of one gapped tensor, near the bf16 expand_kv and the unfused FP8 kv_b_proj."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention
    model, attn, lin = patched_attention(gpu)
    kv, k_rot = latent(attn, 2, 600, gpu)
    assert attn.kv_b_proj.uses_fp8(1200)
    with torch.no_grad():
        key, value = attn.expand_kv(kv, k_rot)
        assert attn.expand_kv.calls_gapped == 1
        attn.kv_b_proj, fp8 = lin, attn.kv_b_proj
        key_bf16, value_bf16 = DeepseekV3Attention.expand_kv(attn, kv, k_rot)  # the model's own, bf16
        attn.kv_b_proj = fp8
        key_fp8, value_fp8 = DeepseekV3Attention.expand_kv(attn, kv, k_rot)  # unfused, FP8 kv_b_proj
    assert key.shape == key_bf16.shape and value.shape == value_bf16.shape
    assert key.untyped_storage().data_ptr() == value.untyped_storage().data_ptr()
    nope = attn.qk_nope_head_dim
    assert torch.equal(key[..., nope:], key_bf16[..., nope:])  # k_rot, copied as it is
    # FP8 at K = 128 (one scale group): a few percent from bf16 either way. The gapped copy's
    # weight blocks hold other rows than the layer's own copy, so its error is another draw of the
    # same size, not the same values.
    for got, fp8_unfused, ref in ((key, key_fp8, key_bf16), (value, value_fp8, value_bf16)):
        e, e_unfused = _rel(got, ref), _rel(fp8_unfused, ref)
        assert 0 < e_unfused < 6e-2 and e < 1.5 * e_unfused + 5e-3, (e, e_unfused)
        assert _rel(got, fp8_unfused) < 6e-2
    assert torch.isfinite(key).all() and torch.isfinite(value).all()
    assert "kv_b_proj writes the key layout" in attn.expand_kv.explain(1200)
    assert attn.expand_kv.extra_memory_bytes() > 0


def test_bf16_route_is_the_layer_bf16_output_moved_apart(gpu):
    """policy prefill at M = 8: the layer's bf16 path, its columns moved apart -- bitwise the
    patched kv_b_proj's output."""
    model, attn, lin = patched_attention(gpu, policy="prefill")
    kv, k_rot = latent(attn, 2, 4, gpu)
    assert not attn.kv_b_proj.uses_fp8(8)
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention
    with torch.no_grad():
        key, value = attn.expand_kv(kv, k_rot)
        key_ref, value_ref = DeepseekV3Attention.expand_kv(attn, kv, k_rot)
    assert torch.equal(key, key_ref) and torch.equal(value, value_ref)


def test_fp8_route_in_a_cuda_graph_and_under_compile(gpu):
    model, attn, lin = patched_attention(gpu)
    kv, k_rot = latent(attn, 2, 600, gpu)
    with torch.no_grad():
        want_k, want_v = (t.clone() for t in attn.expand_kv(kv, k_rot))
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            attn.expand_kv(kv, k_rot)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            gk, gv = attn.expand_kv(kv, k_rot)
        gk.zero_()
        g.replay()
        assert torch.equal(gk, want_k) and torch.equal(gv, want_v)

        torch._dynamo.reset()
        fn = torch.compile(lambda a, b: attn.expand_kv(a, b), fullgraph=True)
        ck, cv = fn(kv, k_rot)
    assert torch.equal(ck, want_k) and torch.equal(cv, want_v)


def test_weight_changed_in_place_is_seen(gpu):
    """A weight changed in place after patch() (its version counter moved): the next call rebuilds
    kv_b_proj's layer and the gapped copy, as kv_b_proj's own call would; doubling the weight
    doubles the nope and value columns exactly (UE8M0 block scales double, codes stay)."""
    model, attn, lin = patched_attention(gpu)
    kv, k_rot = latent(attn, 2, 600, gpu)
    with torch.no_grad():
        key, value = (t.clone() for t in attn.expand_kv(kv, k_rot))
        handle = attn.kv_b_proj.handle
        attn.kv_b_proj.weight.mul_(2)
        key2, value2 = attn.expand_kv(kv, k_rot)
    assert attn.kv_b_proj.handle != handle
    nope = attn.qk_nope_head_dim
    assert torch.equal(key2[..., :nope], 2 * key[..., :nope]) and torch.equal(value2, 2 * value)
    assert torch.equal(key2[..., nope:], key[..., nope:])


def test_linear_gapped_names_bad_input(gpu):
    model, attn, lin = patched_attention(gpu)
    e, kv_b = attn.expand_kv, attn.kv_b_proj
    x = torch.randn(8, kv_b.in_features, device=gpu, dtype=torch.bfloat16)
    heads, nope, rope, v = e.dims
    with pytest.raises(ValueError, match="wv must be"):
        torch.ops.fp8proj.linear_gapped(x, kv_b.weight, kv_b.handle, e.values[:-1], e.scales, heads, nope, rope)
    with pytest.raises(ValueError, match="groups must divide"):
        torch.ops.fp8proj.linear_gapped(x, kv_b.weight, kv_b.handle, e.values, e.scales, 7, nope, rope)
    with pytest.raises(TypeError, match="x must be torch.bfloat16"):
        torch.ops.fp8proj.linear_gapped(x.float(), kv_b.weight, kv_b.handle, e.values, e.scales, heads, nope, rope)
    y = torch.ops.fp8proj.linear_gapped(x[:0], kv_b.weight, kv_b.handle, e.values, e.scales, heads, nope, rope)
    assert y.shape == (0, heads * (nope + rope + v))
