#!/usr/bin/env python3
"""`fp8proj verify --checkpoint` on the tiny checkpoints of tests/fixtures/make_mla_checkpoints.py:
eligibility, tagging, FP8 copy bytes and the weight error recomputed here with numpy/ml_dtypes
(an independent quantizer: power-of-two scale at or above amax/448 per 128x128 block), GEMM rows
within the numerics contract, sharded FP8 input, no-q-LoRA layout, and clear errors for a config
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


def check_rows(name, res, layers, q_lora, fp8):
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
        check(r["fp8_copy_bytes"] == n * k + 4 * (-(-n // 128)) * (-(-k // 128)), what + " FP8 copy bytes")
        check(r["dtype"] == ("F8_E4M3" if fp8 else "BF16"), what + f" dtype {r['dtype']}")
        check(0.005 < r["weight_rel_err"] < 0.06, what + f" weight error {r['weight_rel_err']}")
        check(0.005 < r["act_rel_err"] < 0.06, what + f" activation error {r['act_rel_err']}")
        check(any(g["backend"] == "cpu_reference" for g in r["gemm"]), what + " has no cpu_reference row")
        for g in r["gemm"]:
            check(g["pass"] and g["fp8_vs_dequant_rel_err"] <= 2e-3, what + f" {g['backend']} vs dequant {g}")
            # Quantizing both operands costs ~sqrt(2) x 2.7% (e4m3's 3 mantissa bits); bf16 ~1.6e-3.
            check(0.01 < g["fp8_gemm_rel_err"] < 0.1, what + f" FP8 GEMM error {g['fp8_gemm_rel_err']}")
            check(g["bf16_gemm_rel_err"] < 3e-3, what + f" bf16 GEMM error {g['bf16_gemm_rel_err']}")
        if r["eligible"] and r["tagged"]:
            tagged_bytes += r["fp8_copy_bytes"]
    check(res["totals"]["tagged_fp8_bytes"] == tagged_bytes, f"{name}: tagged total")


def main(cli, work):
    fx.main(work)
    res = verify(cli, work, "mla_bf16")
    if res:
        check_rows("mla_bf16", res, [0, 1], True, False)
        # The weight error again, from the file, by an independent quantizer.
        t = load_file(os.path.join(work, "mla_bf16", "model.safetensors"))
        for r in res["rows"]:
            w = t[f"model.layers.{r['layer']}.self_attn.{r['projection']}.weight"].astype(np.float32)
            mine = ue8m0_weight_error(w)
            check(abs(mine - r["weight_rel_err"]) <= 1e-4 * mine,
                  f"mla_bf16 {r['projection']}: weight error {r['weight_rel_err']} vs numpy {mine}")
    res = verify(cli, work, "mla_fp8_sharded")
    if res:
        check_rows("mla_fp8_sharded", res, [0, 1], True, True)
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
