"""The decode-step benchmark's CPU-testable pieces (python/fp8proj/bench_decode.py): the stub that
stands for the attention has the attention's output structure and leaves the rest of the decoder
layer as it is, the four variants swap in full, the whole part runs through (eager, timing faked),
the attention's time is the paired per-round difference, and the arguments are checked. The timing
itself needs the H200."""
import json

import pytest
import torch

from conftest import tiny_deepseek_v3_config
from fp8proj.bench_fp8ckpt import cache_kwargs

pytest.importorskip("transformers.models.deepseek_v3", reason="transformers without DeepseekV3")


def tiny_model():
    from transformers import DeepseekV3ForCausalLM
    torch.manual_seed(0)
    return DeepseekV3ForCausalLM(tiny_deepseek_v3_config()).to(torch.bfloat16).eval()


def decode_inputs(model, c=2, L=16):
    """A StaticCache filled by a prefill of L tokens, and the step's token and position."""
    from transformers import StaticCache
    cache = StaticCache(config=model.config, max_cache_len=L + 8)
    ids = torch.randint(0, 256, (c, L))
    with torch.no_grad():
        model(input_ids=ids, **cache_kwargs(model, cache, torch.arange(L)))
    return cache, torch.randint(0, 256, (c, 1)), torch.tensor([L])


def test_stub_has_the_attention_structure_and_leaves_the_rest_of_the_layer():
    """Run on one decode step's recorded inputs: NoAttention returns what the attention returns
    (same arity, shape, dtype, None where it has None), and the decoder layer with it computes
    residual + mlp(post_attention_layernorm(residual)): everything but the attention."""
    from fp8proj.bench_decode import NoAttention, check_stub, structure
    from fp8proj.bench_fp8ckpt import _rewind

    model = tiny_model()
    L = 16
    cache, tok, pos = decode_inputs(model, L=L)
    layer = model.model.layers[0]
    seen = {}

    def rec(key):
        def hook(mod, args, kwargs):
            seen.setdefault(key, (args, kwargs))
        return hook

    hs = [layer.self_attn.register_forward_pre_hook(rec("attn"), with_kwargs=True),
          layer.register_forward_pre_hook(rec("layer"), with_kwargs=True)]
    with torch.no_grad():
        _rewind(cache, L)
        model(input_ids=tok, **cache_kwargs(model, cache, pos))
    for h in hs:
        h.remove()
    stub = NoAttention()
    with torch.no_grad():
        _rewind(cache, L)
        check_stub(layer.self_attn, stub, *seen["attn"])
        real = layer.self_attn(*seen["attn"][0], **seen["attn"][1])
    out = stub(*seen["attn"][0], **seen["attn"][1])
    assert structure(out) == structure(real) and isinstance(real, tuple) and real[0].abs().sum() > 0
    assert torch.count_nonzero(out[0]) == 0

    args, kwargs = seen["layer"]
    x = args[0] if args else kwargs["hidden_states"]
    attn = layer.self_attn
    layer.self_attn = stub
    try:
        with torch.no_grad():
            got = layer(*args, **kwargs)
            got = got[0] if isinstance(got, tuple) else got
            want = x + layer.mlp(layer.post_attention_layernorm(x))
    finally:
        layer.self_attn = attn
    assert torch.equal(got, want)


def test_check_stub_rejects_another_structure():
    from fp8proj.bench_decode import check_stub

    class Bare(torch.nn.Module):  # the tensor alone: the decoder layer's `x, _ = ...` would break
        def forward(self, hidden_states=None, **kw):
            return torch.zeros_like(hidden_states)

    class Attn(torch.nn.Module):
        def forward(self, hidden_states=None, **kw):
            return hidden_states * 2, None

    x = torch.ones(2, 1, 8)
    with pytest.raises(RuntimeError, match="would not be this model's step"):
        check_stub(Attn(), Bare(), (), {"hidden_states": x})


def test_variants_swap_in_full():
    from fp8proj.bench_decode import NoAttention, Variants
    from fp8proj.integrations.transformers import ALL_TARGETS, patch
    from fp8proj.torch import Fp8ProjLinear

    model = tiny_model()
    attns = [layer.self_attn for layer in model.model.layers]
    before = [(a, attr, getattr(a, attr)) for a in attns for attr in ("q_a_layernorm",) + ALL_TARGETS
              if hasattr(a, attr)]
    patch(model, enabled=True, policy="all", targets=ALL_TARGETS, max_tokens=4)
    after = [(a, attr, getattr(a, attr)) for a, attr, _ in before]
    assert sum(m1 is not m2 for (_, _, m1), (_, _, m2) in zip(before, after)) == 2 * 6  # 5 linears + the norm
    v = Variants(model, before, after)
    for seq in (("fp8proj_rest", "bf16"), ("bf16_rest", "fp8proj"), ("fp8proj", "bf16_rest")):
        for label in seq:
            v.set(label)
        label = seq[-1]
        want = after if label.startswith("fp8proj") else before
        assert all(getattr(a, attr) is m for a, attr, m in want)
        rest = label.endswith("_rest")
        assert all(isinstance(layer.self_attn, NoAttention) == rest for layer in model.model.layers)
        assert all(layer.self_attn is a for layer, a in zip(model.model.layers, attns)) != rest
    v.set("fp8proj")
    assert isinstance(attns[1].o_proj, Fp8ProjLinear)
    # patch()'s expand_kv replacement shows in the fp8proj states only; the unfused one has the
    # fp8proj modules with the class's expand_kv.
    expands = [a.__dict__.get("expand_kv") for a in attns]
    assert all(e is not None for e in expands) and v.expands == expands
    for label, has in (("bf16", False), ("fp8proj_unfused", False), ("fp8proj_rest", True), ("bf16_rest", False),
                       ("fp8proj", True)):
        v.set(label)
        assert [a.__dict__.get("expand_kv") for a in attns] == (expands if has else [None, None])
    v.set("fp8proj_unfused")
    assert all(getattr(a, attr) is m for a, attr, m in after)
    with pytest.raises(ValueError):
        v.set("fp8")


def rounds(n=3):
    """Per-round ms where the paired median differs from the difference of medians: bf16 attention
    is 1.0 ms in 2 of 3 rounds (medians: 3.2 - 2.6 = 0.6), fp8proj 0.8 in all three."""
    return {"bf16": [3.0, 4.0, 3.2], "bf16_rest": [2.0, 3.0, 2.6],
            "fp8proj": [2.8, 3.8, 3.0], "fp8proj_rest": [2.0, 3.0, 2.2]}


def test_summarize_rounds_pairs_each_round():
    from fp8proj.bench_decode import summarize_rounds
    t = summarize_rounds(rounds())
    assert t["attn_bf16_ms"] == 1.0 and t["attn_fp8proj_ms"] == 0.8 and t["attn_speedup"] == 1.25
    assert t["bf16_ms"] == 3.2 and t["fp8proj_ms"] == 3.0 and t["model_speedup"] == round(3.2 / 3.0, 4)
    assert t["attn_share_bf16"] == round(1.0 / 3.2, 4) and t["rest_ratio"] == round(2.6 / 2.2, 4)
    bad = rounds()
    bad["fp8proj_rest"] = bad["fp8proj_rest"][:2]
    with pytest.raises(ValueError, match="equally many rounds"):
        summarize_rounds(bad)
    with pytest.raises(ValueError):
        summarize_rounds({k: v for k, v in rounds().items() if k != "bf16_rest"})


def test_whole_part_runs_eager_on_cpu(monkeypatch, tmp_path):
    """bench_model on the CPU (capture fails there: every variant runs eagerly and says why), the
    timing faked but every timed step really called: the stubbed steps' logits differ from the
    full ones, the two variants agree (on the CPU the patched modules run torch's bf16 ops), and the
    rows and the written results carry the method, the bar and explain()."""
    from fp8proj import bench, bench_decode

    calls = []

    def fake_rounds(fns, reps, warmup, flush=None, delay_us=0.0, samples=False):
        assert samples and len(fns) == 5  # the four variants, then fp8proj with transformers' expand_kv
        outs = [f() for f in fns]
        calls.append([o.float().clone() for o in outs])
        per = rounds()
        return [per[k] for k in bench_decode.VARIANTS] + [[3.0, 4.0, 3.2]]

    monkeypatch.setattr(bench_decode, "time_rounds", fake_rounds)
    logs = []
    rows = bench_decode.bench_model("tiny", tiny_deepseek_v3_config(), [2, 3], 3, 0, log=logs.append,
                                    device="cpu", context=32, max_tokens=32)
    assert [r["seqs"] for r in rows] == [2, 3] and len(calls) == 2
    for outs, r in zip(calls, rows):
        full_bf16, full_fp8, rest_bf16, rest_fp8, unfused = outs
        assert torch.equal(unfused, full_fp8)  # on the CPU both run the class's expand_kv
        assert r["unfused_speedup"] == 1.0
        assert full_bf16.shape == (r["seqs"], 1, 256)
        assert torch.allclose(full_bf16, full_fp8, atol=2e-2, rtol=0) and torch.equal(rest_bf16, rest_fp8)
        assert not torch.allclose(full_bf16, rest_bf16, atol=1e-2)
        assert r["cuda_graph"] is False
        assert set(r["capture_errors"]) == set(bench_decode.VARIANTS) | {bench_decode.UNFUSED}
        assert r["attn_speedup"] == 1.25 and r["context"] == 33 and r["layers"] == 2
        assert r["logits_rel_err"] < 1e-2
        assert set(r["explain"]) == {"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj", "expand_kv"}
        # kv_b_proj expands the whole compressed cache (33 + 8 slots per sequence); the rest see M = C.
        kv_rows = r["seqs"] * (32 + 8)
        assert r["rows"] == dict(q_a_proj=r["seqs"], q_b_proj=r["seqs"], kv_a_proj_with_mqa=r["seqs"],
                                 kv_b_proj=kv_rows, o_proj=r["seqs"])
        assert r["max_tokens"] == 32 and r["chunks"]["kv_b_proj"] == -(-kv_rows // 32)
        assert r["explain"]["kv_b_proj"].startswith(f"M={kv_rows}:")
        assert all("bf16 via torch" in t for t in r["explain"].values())
    assert any("[decode] tiny C=2 (eager:" in s for s in logs)

    meta = dict(gpu="cpu", command="python -m fp8proj.bench --parts decode", torch=torch.__version__,
                transformers="x", library="x")
    bench._write(tmp_path, [], [], meta, None, rows)
    assert (tmp_path / "decode.csv").read_text().count("\n") == 3
    assert [r["seqs"] for r in json.loads((tmp_path / "results.json").read_text())["decode"]] == [2, 3]
    md = (tmp_path / "results.md").read_text()
    assert "## The decode step from PyTorch" in md and "tiny C=2: attention 1.250x (met)" in md
    assert "Attention = step - stubbed step" in md and "tiny C=3 o_proj: M=3: bf16 via torch" in md
    assert "tiny C=3 kv_b_proj: M=120: bf16 via torch" in md and "(4 chunks)" in md


def test_summary_says_missed_below_the_bar():
    from fp8proj.bench_decode import summarize, summarize_rounds
    per = rounds()
    per["fp8proj"] = [2.9, 3.9, 3.1]  # attention 0.9 ms: 1.111x
    row = dict(model="glm5", seqs=64, context=1025, layers=2, reps=3, cuda_graph=True, capture_errors={},
               logits_rel_err=0.1, attn_implementation="sdpa", explain={"o_proj": "M=64: fp8 ..."},
               **summarize_rounds(per))
    md = "\n".join(summarize([row]))
    assert "- glm5 C=64: attention 1.111x (MISSED), step 1.032x" in md and "| yes |" in md


def test_arguments_of_the_decode_part():
    from fp8proj import bench
    a = bench.parse_args(["--out", "x", "--parts", "decode", "--decode", "16,64"])
    assert a.part_set == {"decode"} and a.decode_list == [16, 64] and a.decode_reps == 200
    for bad in (["--parts", "decod"], ["--parts", "decode", "--decode", "16,x"], ["--parts", "decode", "--decode", ""],
                ["--decode", "0,16"], ["--models", "glm4"]):
        with pytest.raises(SystemExit):
            bench.parse_args(["--out", "x"] + bad)


def test_decode_part_without_gpu_says_why(capsys):
    from fp8proj import bench
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert bench.main(["--out", "/nonexistent/never-written", "--parts", "decode"]) == 2
    assert "needs a Hopper GPU" in capsys.readouterr().err


def test_decode_part_captures_on_the_gpu(gpu):
    """The part on a small model on the GPU: all four steps capture as CUDA graphs (the patched
    modules included), the fp8proj step's logits stay near bf16's, and the stubbed steps, which run
    the same work, time alike."""
    import math

    from fp8proj.bench_decode import bench_model
    cfg = tiny_deepseek_v3_config(vocab_size=1024)
    (row,) = bench_model("tiny", cfg, [4], 20, 3, log=lambda s: None, device="cuda", context=64)
    assert row["cuda_graph"] and not row["capture_errors"], row["capture_errors"]
    # Random weights through 2 untrained layers: FP8's error is amplified (docs/python.md: 1.4e-1
    # at full size with every projection on FP8); NaN never passes.
    assert math.isfinite(row["logits_rel_err"]) and row["logits_rel_err"] < 0.5
    assert row["bf16_ms"] > row["rest_bf16_ms"] > 0 and 0.5 < row["rest_ratio"] < 2.0
    assert set(row["explain"]) >= {"q_b_proj", "o_proj"} and row["max_tokens"] == 8192
    assert row["rows"]["kv_b_proj"] == 4 * (64 + 8) and row["chunks"]["kv_b_proj"] == 1
    assert all(t.startswith(f"M={row['rows'].get(a, row['rows']['kv_b_proj'])}:") for a, t in row["explain"].items())
    assert "unfused_speedup" in row and "kv_b_proj writes the key layout" in row["explain"]["expand_kv"]
