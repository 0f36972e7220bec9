"""The FP8-checkpoint benchmark's CPU-testable pieces (python/fp8proj/bench_fp8ckpt.py): the
checkpoint it writes is DeepSeek-V3's layout, transformers reads it back (dequantize=True gives
the codes x scales), the C++ loader reads it as stored FP8, and the static-cache decode step it
times is valid transformers usage. The timing itself needs the H200."""
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from conftest import tiny_deepseek_v3_config

pytest.importorskip("transformers.integrations.finegrained_fp8", reason="transformers without fine-grained FP8")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from fp8proj.bench_fp8ckpt import write_fp8_checkpoint
    path = tmp_path_factory.mktemp("fp8ckpt") / "tiny"
    info = write_fp8_checkpoint(tiny_deepseek_v3_config(), path, device="cpu")
    assert info["tensors"] > 0 and info["bytes"] > 0
    return path


def read_header(path):
    with open(path, "rb") as f:
        raw = f.read(1 << 20)
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n])


def test_checkpoint_layout(ckpt):
    h = read_header(ckpt / "model.safetensors")
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["quantization_config"]["quant_method"] == "fp8"
    assert cfg["quantization_config"]["weight_block_size"] == [128, 128]
    for layer in range(2):
        for m in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"):
            w = h[f"model.layers.{layer}.self_attn.{m}.weight"]
            s = h[f"model.layers.{layer}.self_attn.{m}.weight_scale_inv"]
            assert w["dtype"] == "F8_E4M3" and s["dtype"] == "F32"
            assert s["shape"] == [-(-w["shape"][0] // 128), -(-w["shape"][1] // 128)]
    assert h["lm_head.weight"]["dtype"] == "BF16" and "lm_head.weight_scale_inv" not in h


def test_transformers_dequantizes_it_back(ckpt):
    """dequantize=True gives codes x scales for the weights made of whole 128x128 blocks. (For a
    partial last block transformers' Fp8Dequantize takes the block height from the scale grid --
    192 rows / 2 scale rows = 96 -- which is another weight; load_models checks every weight and
    stands in the correctly dequantized model where they differ.)"""
    pytest.importorskip("accelerate", reason="transformers loads FP8 checkpoints only with accelerate installed")
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, FineGrainedFP8Config

    from fp8proj.bench_fp8ckpt import _dequantized_copy, _fp8_model_by_hand
    from fp8proj.fp8_linear import dequantize_weight

    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16,
                                                 quantization_config=FineGrainedFP8Config(dequantize=True))
    t = load_file(str(ckpt / "model.safetensors"))
    for name in ("model.layers.1.self_attn.q_b_proj", "model.layers.0.mlp.down_proj"):
        want = dequantize_weight(t[name + ".weight"], t[name + ".weight_scale_inv"]).to(torch.bfloat16)
        assert torch.equal(model.get_submodule(name).weight.detach(), want), name
    # The stand-ins of load_models: the FP8 model built as the quantizer builds it, and its exact
    # dequantization, partial blocks included.
    fp8 = _fp8_model_by_hand(ckpt, device="cpu")
    kv_a = "model.layers.1.self_attn.kv_a_proj_with_mqa"  # N = 192: a partial last row block
    assert torch.equal(fp8.get_submodule(kv_a).weight.view(torch.uint8), t[kv_a + ".weight"].view(torch.uint8))
    bf16 = _dequantized_copy(fp8, device="cpu")
    want = dequantize_weight(t[kv_a + ".weight"], t[kv_a + ".weight_scale_inv"]).to(torch.bfloat16)
    assert torch.equal(bf16.get_submodule(kv_a).weight.detach(), want)


def test_cpp_loader_reads_it_as_stored_fp8(ckpt, tmp_path):
    cli = os.environ.get("FP8PROJ_CLI") or next(
        (str(p) for b in ("build", "build-cpu") if (p := REPO / b / "tools" / "fp8proj" / "fp8proj").exists()), None)
    if not cli:
        pytest.skip("no fp8proj CLI built (build/ or FP8PROJ_CLI)")
    j = tmp_path / "v.json"
    p = subprocess.run([cli, "verify", "--checkpoint", str(ckpt), "--m", "16", "--json", str(j)], capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = json.loads(j.read_text())["rows"]
    assert rows and all(r["weight_source"] == "fp8_checkpoint" and r["fp8_copy_bytes"] == 0 for r in rows)


def test_static_cache_decode_step_is_valid_usage():
    """What decode_step runs per variant, eager on the CPU: a prefill into a StaticCache, then one
    token per sequence at cache_position L, whose logits equal the full-sequence forward's last."""
    from transformers import DeepseekV3ForCausalLM, StaticCache

    from fp8proj.bench_fp8ckpt import _rewind, cache_kwargs
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(tiny_deepseek_v3_config()).eval()
    c, L = 2, 24
    ids = torch.randint(0, 256, (c, L + 1))
    with torch.no_grad():
        cache = StaticCache(config=model.config, max_cache_len=L + 8)
        model(input_ids=ids[:, :L], **cache_kwargs(model, cache, torch.arange(L)))
        full = model(input_ids=ids, use_cache=False).logits[:, -1:]
        # The timed step runs many times (warm-up, capture, replays): each must decode position L
        # again, more times than the cache has spare slots.
        for _ in range(12):
            _rewind(cache, L)
            step = model(input_ids=ids[:, L:], **cache_kwargs(model, cache, torch.tensor([L]))).logits
            assert torch.allclose(step, full, atol=1e-4, rtol=1e-4)
        # Without the rewind the static layers' own counter runs off the end of the cache.
        with pytest.raises((IndexError, RuntimeError)):
            for _ in range(12):
                model(input_ids=ids[:, L:], **cache_kwargs(model, cache, torch.tensor([L])))


def test_cache_kwargs_name_the_cache_as_the_forward_does():
    """`cache` where the forward declares it (transformers deprecated `past_key_values` for it),
    `past_key_values` where it does not; the position and use_cache either way."""
    from fp8proj.bench_fp8ckpt import cache_kwargs

    class Old(torch.nn.Module):
        def forward(self, input_ids, past_key_values=None, cache_position=None, use_cache=None):
            pass

    class New(torch.nn.Module):
        def forward(self, input_ids, cache=None, use_cache=None, **kwargs):
            pass

    pos = torch.tensor([3])
    old, new = cache_kwargs(Old(), "C", pos), cache_kwargs(New(), "C", pos)
    assert set(old) == {"past_key_values", "cache_position", "use_cache"} and old["past_key_values"] == "C"
    assert set(new) == {"cache", "cache_position", "use_cache"} and new["cache"] == "C" and new["use_cache"]


def test_summary_states_the_bars():
    from fp8proj.bench_fp8ckpt import summarize
    proj = [dict(model="glm5", projection="self_attn.o_proj", n=6144, k=16384, kind=kind, m=m, bf16_us=100.0,
                 fp8proj_us=50.0, speedup_vs_bf16=2.0 if m >= 1024 else 1.1, deepgemm_us=55.0, speedup_vs_deepgemm=1.1,
                 fp8proj_err_vs_dequant=1.6e-3, within_tolerance=True)
            for kind, m in (("prefill", 4096), ("decode", 16))]
    model = [dict(model="glm5", kind="prefill", seqs=4, bf16_ms=10.0, fp8proj_ms=8.0, fp8proj_speedup_vs_bf16=1.25,
                  deepgemm_ms=9.0, deepgemm_ms_over_fp8proj=1.125, cuda_graph=False)]
    mem = [dict(model="glm5", bf16_weight_bytes=2e9, fp8_weight_bytes=1.2e9, fp8_over_bf16=0.6, fp8proj_extra_bytes=0,
                fp8proj_taken=16, fp8_linears=16, deepgemm="deep_gemm 2.6.1")]
    md = "\n".join(summarize(proj, model, mem))
    assert "lowest fp8proj / bf16 at M >= 1024: 2.000x (met)" in md and "lowest anywhere: 1.100x (met)" in md
    assert "geometric mean over 2 points as the attention calls them: 1.100x (met)" in md and "2/2" in md


def test_bench_without_gpu_says_why():
    from fp8proj import bench
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert bench.main(["--out", "/nonexistent/never-written", "--parts", "fp8ckpt"]) == 2


def test_pair_row_calls_both_on_one_input_and_shares(monkeypatch):
    """The q_a_proj+kv_a_proj_with_mqa row, run on the CPU (the torch path, timing faked): fp8proj's
    pair quantizes once per call of the row, DeepGEMM's wrapper (a fake GEMM on the dequantized
    operands) casts twice, each output is checked against its own reference, and the group holds
    nothing afterwards. A single module's row quantizes on every call."""
    import types

    from fp8proj import bench_fp8ckpt as b
    from fp8proj import fp8_linear
    from fp8proj.integrations.transformers import ALL_FP8_LINEARS, patch

    from test_fp8_checkpoint import fp8_model

    model, _ = fp8_model("float")
    from transformers.integrations.finegrained_fp8 import FP8Linear
    originals = {n: m for n, m in model.named_modules() if isinstance(m, FP8Linear)}
    report = patch(model, targets=ALL_FP8_LINEARS, fuse_pair=False)
    assert len(report.shared) == 2
    names = ["model.layers.0.self_attn.q_a_proj", "model.layers.0.self_attn.kv_a_proj_with_mqa"]
    mos = [model.get_submodule(n) for n in names]
    lins = [torch.nn.Linear(m.in_features, m.out_features, bias=False).to(torch.bfloat16) for m in mos]
    for lin, mo in zip(lins, mos):
        with torch.no_grad():
            lin.weight.copy_(b._dequant_w(mo.weight, mo._scales()).to(torch.bfloat16))

    def fp8_gemm_nt(xs, ws, out):
        (xq, sx), (w, sw) = xs, ws
        out.copy_((xq.float() * sx.repeat_interleave(128, 1)) @ b._dequant_w(w, sw).t())

    fake_dg = types.SimpleNamespace(fp8_gemm_nt=fp8_gemm_nt)
    cast, _ = b._per_token_cast(fake_dg)
    casts = []
    counted_cast = lambda x: casts.append(1) or cast(x)  # noqa: E731
    mds = [b.DeepGemmLinear(originals[n], fake_dg, counted_cast) for n in names]

    quantized = []
    real = fp8_linear.quantize_activation_reference
    monkeypatch.setattr(fp8_linear, "quantize_activation_reference",
                        lambda x2, fmt="float": quantized.append(1) or real(x2, fmt))

    def deq_ours(x):  # what _dequant_x_ours gives, from the torch rule
        q, s = real(x, "float")
        return q.float() * s.repeat_interleave(128, 1)

    monkeypatch.setattr(b, "_dequant_x_ours", deq_ours)
    def fake_rounds(fns, reps, warmup, flush=None, delay_us=0.0):
        for _ in range(reps):
            for f in fns:
                f()
        return [2.0, 1.0, 1.5][:len(fns)]

    monkeypatch.setattr(b, "time_rounds", fake_rounds)
    with torch.no_grad():
        row = b._projection_point("tiny", lins, mos, mds, counted_cast, "prefill", 64, 3, 0, None, device="cpu")
    # 1 warm call of DeepGEMM + 1 first call + 3 timed: DeepGEMM casts twice each (and once more for
    # its error's reference), fp8proj quantizes once each.
    assert len(casts) == 2 * 5 + 1 and len(quantized) == 4
    assert row["pair"] and row["projection"] == "self_attn.q_a_proj+kv_a_proj_with_mqa" and row["n"] == "128+192"
    assert "once (shared)" in row["note"] and row["speedup_vs_bf16"] == 2.0 and row["speedup_vs_deepgemm"] == 1.5
    assert row["within_tolerance"] and 0 < row["fp8proj_err_vs_dequant"] <= 2e-3
    assert 0 < row["deepgemm_err_vs_dequant"] <= 2e-3  # the fake GEMM: only its bf16 output rounding
    assert not mos[0].shared_activation.holding
    quantized.clear()
    with torch.no_grad():
        alone = b._projection_point("tiny", lins[:1], mos[:1], None, None, "decode", 16, 3, 0, None, device="cpu")
    assert len(quantized) == 4 and not alone["pair"] and alone["n"] == 128 and "alone" in alone["note"]
    assert not mos[0].shared_activation.holding  # cleared after the row


def test_summary_reports_the_pair_beside_its_modules():
    from fp8proj.bench_fp8ckpt import summarize

    def row(proj, n, m, speedup, pair=False):
        return dict(model="glm5", projection=proj, n=n, k=6144, kind="prefill", m=m, pair=pair, bf16_us=100.0,
                    fp8proj_us=100.0 / speedup, speedup_vs_bf16=speedup, deepgemm_us=None, speedup_vs_deepgemm=None,
                    fp8proj_err_vs_dequant=1.6e-3, within_tolerance=True)
    proj = [row("self_attn.q_a_proj", 2048, 4096, 1.33), row("self_attn.kv_a_proj_with_mqa", 576, 4096, 0.79),
            row("self_attn.o_proj", 6144, 4096, 1.7),
            row("self_attn.q_a_proj+kv_a_proj_with_mqa", "2048+576", 4096, 1.65, pair=True)]
    md = "\n".join(summarize(proj, [], []))
    assert "| self_attn.q_a_proj+kv_a_proj_with_mqa | (2048+576)x6144 |" in md
    assert "lowest fp8proj / bf16 at M >= 1024: 0.790x (MISSED)" in md  # the modules alone, as before
    assert ("glm5 self_attn.q_a_proj+kv_a_proj_with_mqa prefill M=4096: 1.650x bf16 (alone: q_a_proj 1.330x, "
            "kv_a_proj_with_mqa 0.790x)") in md
    assert "counted as their pair): lowest fp8proj / bf16 at M >= 1024: 1.650x (met)" in md
    assert "own activation quantization included" in md and "4/4" in md
    # A fused pair: its members are not timed alone; the pair row says fused against unfused.
    fused = dict(row("self_attn.q_a_proj+kv_a_proj_with_mqa", "2048+576", 4096, 1.8, pair=True),
                 fused_over_shared=1.25)
    md = "\n".join(summarize([proj[2], fused], [], []))
    assert "every module alone" not in md
    assert "glm5 self_attn.q_a_proj+kv_a_proj_with_mqa prefill M=4096: 1.800x bf16; fused / unfused 1.250x" in md
    assert "counted as their pair): lowest fp8proj / bf16 at M >= 1024: 1.700x (met)" in md


def _unfused_and_bf16(originals, names, mos):
    """The pair's modules unfused (one SharedActivation) and as bf16 linears of the dequantized
    weights: the other sides of a pair row."""
    from fp8proj import bench_fp8ckpt as b
    from fp8proj.fp8_linear import Fp8CheckpointLinear, SharedActivation
    alt = [Fp8CheckpointLinear(originals[n], name=n + " (unfused)") for n in names]
    group = SharedActivation()
    for a in alt:
        group.add(a)
    lins = [torch.nn.Linear(m.in_features, m.out_features, bias=False).to(torch.bfloat16) for m in mos]
    for lin, mo in zip(lins, mos):
        with torch.no_grad():
            lin.weight.copy_(b._dequant_w(mo.weight, mo._scales()).to(torch.bfloat16))
    return alt, group, lins


def test_fused_pair_row_times_the_pair_beside_it_unfused(monkeypatch):
    """patch()'s default fuses the pair: the row runs one quantization and one GEMM per call for
    fp8proj and, in the same rounds, the same two weights as an unfused pair (shared quantization,
    two GEMMs); both outputs are checked against the dequantized product."""
    from fp8proj import bench_fp8ckpt as b
    from fp8proj import fp8_linear
    from fp8proj.integrations.transformers import ALL_FP8_LINEARS, patch
    from transformers.integrations.finegrained_fp8 import FP8Linear

    from test_fp8_checkpoint import fp8_model

    model, _ = fp8_model("float", hidden_size=512)  # K = 512: a pair patch() fuses
    originals = {n: m for n, m in model.named_modules() if isinstance(m, FP8Linear)}
    patch(model, targets=ALL_FP8_LINEARS, fuse_input_norm=False)  # the pair alone (the next test: with it)
    names = ["model.layers.0.self_attn.q_a_proj", "model.layers.0.self_attn.kv_a_proj_with_mqa"]
    mos = [model.get_submodule(n) for n in names]
    assert mos[0].fused_pair is mos[1].fused_pair is not None
    alt, group, lins = _unfused_and_bf16(originals, names, mos)
    quantized = []
    real = fp8_linear.quantize_activation_reference
    monkeypatch.setattr(fp8_linear, "quantize_activation_reference",
                        lambda x2, fmt="float": quantized.append(1) or real(x2, fmt))

    def deq_ours(x):
        q, s = real(x, "float")
        return q.float() * s.repeat_interleave(128, 1)

    monkeypatch.setattr(b, "_dequant_x_ours", deq_ours)
    monkeypatch.setattr(b, "time_rounds", lambda fns, reps, warmup, flush=None, delay_us=0.0:
                        [f() for _ in range(reps) for f in fns] and [2.0, 1.0, 1.25][:len(fns)])
    with torch.no_grad():
        row = b._projection_point("tiny", lins, mos, None, None, "prefill", 64, 3, 0, None, device="cpu", alt=alt)
    # First calls + 3 timed rounds: one quantization per call of the fused pair and of the unfused
    # one (shared), none for the reference (made by deq_ours through `real`, not counted).
    assert len(quantized) == 2 * 4
    assert "one fused GEMM over both weights" in row["note"] and row["fused_over_shared"] == 1.25
    assert row["fp8proj_shared_us"] == 1250.0 and row["speedup_vs_bf16"] == 2.0
    assert row["within_tolerance"] and 0 < row["fp8proj_shared_err_vs_dequant"] <= 2e-3
    assert not mos[0].fused_pair.holding and not group.holding


def test_pair_row_with_the_input_norm_times_the_norm_on_every_side(monkeypatch):
    """Where patch() fused input_layernorm into the pair, its row starts from the layer's input:
    bf16, the unfused pair (and DeepGEMM) behind the norm module, fp8proj's pair alone; bf16 also
    behind the one-pass norm, the faster bf16 taken for the ratio; each output against its own
    codes' product."""
    from fp8proj import bench_fp8ckpt as b
    from fp8proj import fp8_linear
    from fp8proj.integrations.transformers import ALL_FP8_LINEARS, patch
    from transformers.integrations.finegrained_fp8 import FP8Linear

    from test_fp8_checkpoint import fp8_model

    model, bf16 = fp8_model("float", hidden_size=512)
    originals = {n: m for n, m in model.named_modules() if isinstance(m, FP8Linear)}
    norm_mod = model.model.layers[0].input_layernorm
    report = patch(model, targets=ALL_FP8_LINEARS)
    assert report.fused_input_norm == ["model.layers.0", "model.layers.1"]
    names = ["model.layers.0.self_attn.q_a_proj", "model.layers.0.self_attn.kv_a_proj_with_mqa"]
    mos = [model.get_submodule(n) for n in names]
    alt, group, lins = _unfused_and_bf16(originals, names, mos)
    real = fp8_linear.quantize_activation_reference
    onepass = []

    def deq_ours(x, quantize=None):
        # The CPU path's fused pass is the norm module, then the same quantization.
        q, s = real(norm_mod(x) if quantize is not None else x, "float")
        return q.float() * s.repeat_interleave(128, 1)

    def one_pass(x):
        onepass.append(1)
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), norm_mod.weight, 1e-6)

    monkeypatch.setattr(b, "_dequant_x_ours", deq_ours)
    # Round times: bf16 behind the module 3.0, fp8proj 1.0, unfused 1.5, bf16 behind one pass 2.0,
    # the norms alone 1.2 and 0.4.
    monkeypatch.setattr(b, "time_rounds", lambda fns, reps, warmup, flush=None, delay_us=0.0:
                        [f() for _ in range(reps) for f in fns] and [3.0, 1.0, 1.5, 2.0, 1.2, 0.4][:len(fns)])
    with torch.no_grad():
        row = b._projection_point("tiny", lins, mos, None, None, "prefill", 64, 3, 0, None, device="cpu", alt=alt,
                                  norm=(norm_mod, one_pass, "fused"))
    assert row["projection"] == "input_layernorm+self_attn.q_a_proj+kv_a_proj_with_mqa"
    assert row["bf16_us"] == 2000.0 and row["speedup_vs_bf16"] == 2.0  # the faster bf16: behind one pass
    assert row["bf16_module_norm_us"] == 3000.0 and row["bf16_onepass_us"] == 2000.0
    assert row["norm_module_us"] == 1200.0 and row["norm_onepass_us"] == 400.0 and row["fused_over_shared"] == 1.5
    assert "input_layernorm" in row["note"] and len(onepass) == 2 * 4  # first calls + 3 rounds, each once
    assert row["within_tolerance"] and 0 < row["fp8proj_shared_err_vs_dequant"] <= 2e-3
    assert not mos[0].fused_pair.holding and not group.holding


def test_mlp_row_times_the_mlp_as_its_forward_calls_it(monkeypatch):
    """The MLP row: bf16 (eager, and with the elementwise part as one pass; the faster counts),
    fp8proj's patched MLP, its three modules unfused in the MLP's own forward; down_proj's output
    against the product of its own codes."""
    from fp8proj import bench_fp8ckpt as b
    from fp8proj.fp8_linear import Fp8CheckpointLinear, GatedMLP, quantize_activation_reference
    from fp8proj.integrations.transformers import ALL_FP8_LINEARS, patch
    from transformers.integrations.finegrained_fp8 import FP8Linear
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MLP

    from test_fp8_checkpoint import fp8_model

    model, _ = fp8_model("float", hidden_size=512)
    originals = {n: m for n, m in model.named_modules() if isinstance(m, FP8Linear)}
    report = patch(model, targets=ALL_FP8_LINEARS)
    mlp = model.model.layers[0].mlp
    assert isinstance(vars(mlp)["forward"], GatedMLP) and report.fused_mlp
    bf16_mlp = DeepseekV3MLP(model.config).to(torch.bfloat16)
    names = [f"model.layers.0.mlp.{a}" for a in ("gate_proj", "up_proj", "down_proj")]
    for a, n in zip(("gate_proj", "up_proj", "down_proj"), names):
        mo = model.get_submodule(n)
        with torch.no_grad():
            getattr(bf16_mlp, a).weight.copy_(b._dequant_w(mo.weight, mo._scales()).to(torch.bfloat16))
    alt = [Fp8CheckpointLinear(originals[n], name=n + " (unfused)") for n in names]
    onepass = []

    def one_pass(g, u):
        onepass.append(1)
        return torch.nn.functional.silu(g) * u

    def deq_silu_mul(g, u):  # the CPU reference of silu_mul_quantize's codes, dequantized
        q, s = quantize_activation_reference((torch.nn.functional.silu(g) * u).reshape(-1, g.shape[-1]), "float")
        return q.float() * s.repeat_interleave(128, 1)

    monkeypatch.setattr(b, "_dequant_silu_mul", deq_silu_mul)
    # Round times: bf16 eager 3.0, fp8proj 1.5, unfused 1.6, bf16 with one pass 2.5.
    monkeypatch.setattr(b, "time_rounds", lambda fns, reps, warmup, flush=None, delay_us=0.0:
                        [f() for _ in range(reps) for f in fns] and [3.0, 1.5, 1.6, 2.5][:len(fns)])
    with torch.no_grad():
        row = b._mlp_point("tiny", bf16_mlp, mlp, None, alt, one_pass, "prefill", 64, 3, 0, None, device="cpu")
    assert row["projection"] == "mlp.gate_proj+up_proj+down_proj" and row["pair"]
    assert row["bf16_us"] == 2500.0 and row["bf16_eager_us"] == 3000.0 and row["bf16_onepass_us"] == 2500.0
    assert row["fp8proj_us"] == 1500.0 and row["speedup_vs_bf16"] == round(2.5 / 1.5, 4)
    assert row["fp8proj_shared_us"] == 1600.0 and row["deepgemm_us"] is None and len(onepass) == 4
    assert row["within_tolerance"] and row["fused_vs_unfused_rel"] < 1e-2 and row["fp8proj_vs_bf16_rel"] < 0.1
    assert "as one fused GEMM" in row["note"] and not mlp.gate_proj.fused_pair.holding


def test_norm_fold_part_arguments_and_table(tmp_path):
    from fp8proj import bench
    a = bench.parse_args(["--out", "x", "--parts", "fp8ckpt_norm", "--norm-m", "16,4096"])
    assert a.part_set == {"fp8ckpt_norm"} and a.norm_m_list == [16, 4096]
    for bad in (["--parts", "fp8ckpt_norm", "--norm-m", ""], ["--norm-m", "16,x"], ["--norm-m", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(["--out", "x"] + bad)
    row = dict(model="glm5", projection="q_a_layernorm+q_b_proj", m=16, n=16384, k=2048, unfused_us=20.0,
               fused_us=16.0, bf16_us=30.0, fused_over_unfused=1.25, fused_over_bf16=1.875, unfused_over_bf16=1.5,
               rel_err_fused_vs_unfused=3e-3, rel_err_fused=2e-2, rel_err_unfused=2.1e-2)
    meta = dict(gpu="cpu", command="python -m fp8proj.bench --parts fp8ckpt_norm", torch="t", transformers="t",
                library="l")
    bench._write(tmp_path, [], [], meta, {"projections": [], "model": [], "memory": [], "norm_fold": [row]})
    md = (tmp_path / "results.md").read_text()
    assert "| glm5 | 16 | 20.0 | 16.0 | 1.250x | 30.0 | 1.875x | 1.500x | 2.00e-02 / 2.10e-02 |" in md
    assert (tmp_path / "fp8ckpt_norm.csv").read_text().startswith("model,projection,m,")
