#!/usr/bin/env python3
"""`fp8proj verify --checkpoint` on the tiny checkpoints of tests/fixtures/make_mla_checkpoints.py:
eligibility, tagging, FP8 copy bytes and the weight error recomputed here with numpy/ml_dtypes
(an independent quantizer: power-of-two scale at or above amax/448 per 128x128 block, or with
--weight-scales float fp32 amax/448), GEMM rows within the numerics contract, sharded FP8 input
used as stored (no copy, no re-quantization: the norm of the operand the GEMM ran equals the
file's codes x scales, and the report says so), no-q-LoRA layout, and clear errors for a config
that disagrees with the tensors or a directory without config.json.

Usage: test_verify_checkpoint.py FP8PROJ_CLI WORK_DIR
"""
import json
import math
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
from safetensors.numpy import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures"))
import make_mla_checkpoints as fx  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(cli, *args):
    p = subprocess.run([cli, "verify", *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def ue8m0_weight_error(w):
    """||dequant(quant(W)) - W|| / ||W|| with fp8proj's recipe, computed independently."""
    w = w.astype(np.float32)
    n, k = w.shape
    out = np.zeros_like(w)
    for i in range(0, n, 128):
        for j in range(0, k, 128):
            blk = w[i:i + 128, j:j + 128]
            s = 2.0 ** math.ceil(math.log2(max(float(np.abs(blk).max()), 1e-30) / 448.0))
            out[i:i + 128, j:j + 128] = (blk / s).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * s
    return float(np.linalg.norm(out - w) / np.linalg.norm(w))


def float_dequant(w):
    """dequant(quant(W)) with fp32 scales: fl32(max(amax, 1e-4) / 448), codes e4m3(fl32(w / s))."""
    w = w.astype(np.float32)
    n, k = w.shape
    out = np.zeros_like(w)
    for i in range(0, n, 128):
        for j in range(0, k, 128):
            blk = w[i:i + 128, j:j + 128]
            s = np.float32(max(np.abs(blk).max(), np.float32(1e-4))) / np.float32(448)
            q = np.clip((blk / s).astype(np.float32), -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
            out[i:i + 128, j:j + 128] = q * s
    return out


def ue8m0_dequant(w):
    w = w.astype(np.float32)
    n, k = w.shape
    out = np.zeros_like(w)
    for i in range(0, n, 128):
        for j in range(0, k, 128):
            blk = w[i:i + 128, j:j + 128]
            s = 2.0 ** math.ceil(math.log2(max(float(np.abs(blk).max()), 1e-4) / 448.0))
            out[i:i + 128, j:j + 128] = (blk / s).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * s
    return out


def stored_dequant(tensors, name):
    v = tensors[name].astype(np.float32)
    s = tensors[name + "_scale_inv"].astype(np.float32)
    return v * np.repeat(np.repeat(s, 128, 0), 128, 1)[:v.shape[0], :v.shape[1]]


DTYPES = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "BF16": ml_dtypes.bfloat16, "F32": np.float32,
          "F8_E8M0": ml_dtypes.float8_e8m0fnu}


def load_dir(path):
    """Every tensor of a checkpoint directory, read from the format directly (safetensors.numpy
    has no FP8 dtype): an 8-byte little-endian header size, the JSON header, the data."""
    t = {}
    for f in sorted(os.listdir(path)):
        if not f.endswith(".safetensors"):
            continue
        raw = open(os.path.join(path, f), "rb").read()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + n])
        for name, info in header.items():
            if name == "__metadata__":
                continue
            b, e = info["data_offsets"]
            t[name] = np.frombuffer(raw[8 + n + b:8 + n + e], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
    return t


def verify(cli, work, name, *extra):
    j = os.path.join(work, name + ".json")
    rc, out, err = run(cli, "--checkpoint", os.path.join(work, name), "--m", "48", "--json", j,
                       "--csv", os.path.join(work, name + ".csv"), *extra)
    check(rc == 0, f"{name}: exit status {rc}: {err.strip()}")
    print(out)
    if rc != 0:
        return None
    check("every FP8 GEMM meets the numerics contract" in out, f"{name}: no success line")
    return json.load(open(j))


def check_rows(name, res, layers, q_lora, fp8, tensors=None, dequant=ue8m0_dequant):
    rows = res["rows"]
    per_layer = ["q_a_proj", "q_b_proj"] if q_lora else ["q_proj"]
    per_layer += ["kv_a_proj_with_mqa", "kv_b_proj", "o_proj"]
    check([(r["layer"], r["projection"]) for r in rows] == [(l, p) for l in layers for p in per_layer],
          f"{name}: rows {[(r['layer'], r['projection']) for r in rows]}")
    tagged_bytes = 0
    for r in rows:
        what = f"{name}: layer {r['layer']} {r['projection']}"
        n, k = r["n"], r["k"]
        check(r["eligible"] == (n % 16 == 0 and k % 128 == 0), what + " eligibility")  # fp8_eligible (gemm.hpp)
        check(r["tagged"] == (r["projection"] in ("q_b_proj", "q_proj", "o_proj")), what + " tagging")
        copy = 0 if fp8 else n * k + 4 * (-(-n // 128)) * (-(-k // 128))  # a stored FP8 weight needs none
        check(r["fp8_copy_bytes"] == copy, what + f" FP8 copy bytes {r['fp8_copy_bytes']}")
        check(r["dtype"] == ("F8_E4M3" if fp8 else "BF16"), what + f" dtype {r['dtype']}")
        check(r["weight_source"] == ("fp8_checkpoint" if fp8 else "bf16_quantized"), what + " weight source")
        check(r["activation_scales"] == ("float" if fp8 else "ue8m0"), what + " activation scales")
        if fp8:
            check("weight_rel_err" not in r, what + " a stored FP8 weight has no quantization error of its own")
        else:
            check(0.005 < r["weight_rel_err"] < 0.06, what + f" weight error {r['weight_rel_err']}")
        if tensors is not None:
            # The operand the GEMM ran, told apart by its norm: the stored codes x scales, or this
            # file's independent quantizer of the bf16 weight.
            key = f"model.layers.{r['layer']}.self_attn.{r['projection']}.weight"
            mine = float(np.linalg.norm((stored_dequant(tensors, key) if fp8 else dequant(tensors[key])).astype(
                np.float64)))
            check(abs(mine - r["gemm_weight_norm"]) <= 1e-6 * mine,
                  what + f" GEMM operand norm {r['gemm_weight_norm']} vs {mine} from the file")
        check(0.005 < r["act_rel_err"] < 0.06, what + f" activation error {r['act_rel_err']}")
        check(any(g["backend"] == "cpu_reference" for g in r["gemm"]), what + " has no cpu_reference row")
        for g in r["gemm"]:
            check(g["pass"] and g["fp8_vs_dequant_rel_err"] <= 2e-3, what + f" {g['backend']} vs dequant {g}")
            # Quantizing both operands costs ~sqrt(2) x 2.7% (e4m3's 3 mantissa bits); bf16 ~1.6e-3. With
            # a stored FP8 weight only the activations are quantized: ~2.5%.
            lo, hi = (0.015, 0.04) if fp8 else (0.01, 0.1)
            check(lo < g["fp8_gemm_rel_err"] < hi, what + f" FP8 GEMM error {g['fp8_gemm_rel_err']}")
            check(g["bf16_gemm_rel_err"] < 3e-3, what + f" bf16 GEMM error {g['bf16_gemm_rel_err']}")
        if r["eligible"] and r["tagged"]:
            tagged_bytes += r["fp8_copy_bytes"]
    check(res["totals"]["tagged_fp8_bytes"] == tagged_bytes, f"{name}: tagged total")


def main(cli, work):
    fx.main(work)
    res = verify(cli, work, "mla_bf16")
    if res:
        check_rows("mla_bf16", res, [0, 1], True, False, load_dir(os.path.join(work, "mla_bf16")))
        # The weight error again, from the file, by an independent quantizer.
        t = load_file(os.path.join(work, "mla_bf16", "model.safetensors"))
        for r in res["rows"]:
            w = t[f"model.layers.{r['layer']}.self_attn.{r['projection']}.weight"].astype(np.float32)
            mine = ue8m0_weight_error(w)
            check(abs(mine - r["weight_rel_err"]) <= 1e-4 * mine,
                  f"mla_bf16 {r['projection']}: weight error {r['weight_rel_err']} vs numpy {mine}")
    res = verify(cli, work, "mla_fp8_sharded")
    if res:
        check_rows("mla_fp8_sharded", res, [0, 1], True, True, load_dir(os.path.join(work, "mla_fp8_sharded")))
    rc, out, err = run(cli, "--checkpoint", os.path.join(work, "mla_fp8_sharded"), "--m", "16")
    check(rc == 0 and "used as stored, no copy and no re-quantization" in out and
          "the kernel's error alone" in out and "as stored" in out, "FP8 checkpoint: the report says so")
    # UE8M0 scales stored as F8_E8M0 bytes: used as stored too.
    res = verify(cli, work, "mla_fp8_ue8m0")
    if res:
        check_rows("mla_fp8_ue8m0", res, [0], True, True, load_dir(os.path.join(work, "mla_fp8_ue8m0")))
        check(all(r["weight_scales"] == "stored F8_E8M0" for r in res["rows"]), "UE8M0 scales named as stored")
    # The private copy in fp32 scales: the operand is the float rule's, recomputed here.
    res = verify(cli, work, "mla_bf16", "--weight-scales", "float")
    if res:
        check(res["weight_scales"] == "float", "--weight-scales float is recorded")
        check_rows("mla_bf16 float", res, [0, 1], True, False, load_dir(os.path.join(work, "mla_bf16")),
                   dequant=float_dequant)
    rc, out, err = run(cli, "--checkpoint", os.path.join(work, "mla_bf16"), "--weight-scales", "ue8m0,float")
    check(rc != 0 and "takes one format" in err, f"--checkpoint with two formats: rc {rc}, {err.strip()}")
    res = verify(cli, work, "mla_no_qlora")
    if res:
        check_rows("mla_no_qlora", res, [0], False, False)
    res = verify(cli, work, "mla_bf16", "--layers", "1")
    if res:
        check([r["layer"] for r in res["rows"]] == [1] * 5, "--layers 1 selects layer 1 only")

    rc, out, err = run(cli, "--checkpoint", os.path.join(work, "mla_bad_config"))
    check(rc != 0 and "kv_lora_rank" in err and "kv_a_proj_with_mqa" in err,
          f"bad config: rc {rc}, message: {err.strip()}")
    os.makedirs(os.path.join(work, "no_config"), exist_ok=True)
    rc, out, err = run(cli, "--checkpoint", os.path.join(work, "no_config"))
    check(rc != 0 and "config.json" in err, f"no config.json: rc {rc}, message: {err.strip()}")
    rc, out, err = run(cli, "--checkpoint", os.path.join(work, "mla_bf16"), "--layers", "5")
    check(rc != 0 and "outside" in err, f"--layers 5: rc {rc}, message: {err.strip()}")

    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print("verify --checkpoint: all checks passed")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
