"""The FP8-checkpoint benchmark's CPU-testable pieces (python/fp8proj/bench_fp8ckpt.py): the
checkpoint it writes is DeepSeek-V3's layout, transformers reads it back (dequantize=True gives
the codes x scales), the C++ loader reads it as stored FP8, and the static-cache decode step it
times is valid transformers usage. The timing itself needs the H200."""
import json
import os
import subprocess
import sys
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
    raw = open(path, "rb").read(1 << 20)
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

    from fp8proj.bench_fp8ckpt import _rewind
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(tiny_deepseek_v3_config()).eval()
    c, L = 2, 24
    ids = torch.randint(0, 256, (c, L + 1))
    with torch.no_grad():
        cache = StaticCache(config=model.config, max_cache_len=L + 8)
        model(input_ids=ids[:, :L], past_key_values=cache, cache_position=torch.arange(L), use_cache=True)
        full = model(input_ids=ids, use_cache=False).logits[:, -1:]
        # The timed step runs many times (warm-up, capture, replays): each must decode position L
        # again, more times than the cache has spare slots.
        for _ in range(12):
            _rewind(cache, L)
            step = model(input_ids=ids[:, L:], past_key_values=cache, cache_position=torch.tensor([L]),
                         use_cache=True).logits
            assert torch.allclose(step, full, atol=1e-4, rtol=1e-4)
        # Without the rewind the static layers' own counter runs off the end of the cache.
        with pytest.raises((IndexError, RuntimeError)):
            for _ in range(12):
                model(input_ids=ids[:, L:], past_key_values=cache, cache_position=torch.tensor([L]), use_cache=True)


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
    assert "geometric mean over 2 points: 1.100x (met)" in md and "2/2" in md


def test_bench_without_gpu_says_why():
    from fp8proj import bench
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert bench.main(["--out", "/nonexistent/never-written", "--parts", "fp8ckpt"]) == 2
