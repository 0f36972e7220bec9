#!/usr/bin/env python3
"""scripts/pdl_ab.py on synthetic `h200.sh pdl_ab` results with a known PDL gain: medians over
rounds, gain = off / on per point, columns read by name (an extra column is ignored, prefill rows
are summarized apart from the decode rows), a point with only one setting left out, and no results -> exit 1."""
import csv
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "..", "scripts", "pdl_ab.py")
LAYER = ["kind", "model", "tp", "seqs", "seqlen", "tokens", "off_us", "on_us", "speedup", "extra_col"]
BENCH = ["model", "gemm", "tp", "n", "k", "m", "bf16_us", "fp8_us", "fp8_gemm_us", "speedup", "floor_us"]


def write(path, fields, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow(r)


def main():
    d = tempfile.mkdtemp()
    # Decode: PDL on takes 0.8x the time on both blocks; round noise 1.0 / 1.02 / 0.98 (median 1.0).
    for rnd, noise in ((1, 1.0), (2, 1.02), (3, 0.98)):
        for pdl in (0, 1):
            f = 1.0 if pdl == 0 else 0.8
            rows = [{"kind": "prefill", "model": "deepseek-v3", "tp": 1, "seqs": 16, "off_us": 999, "on_us": 999}]
            rows += [{"kind": "decode", "model": "deepseek-v3", "tp": tp, "seqs": c, "off_us": 100 * tp * f * noise,
                      "on_us": 80 * tp * f * noise, "extra_col": "x"} for tp in (1, 8) for c in (16, 64)]
            write(os.path.join(d, f"layer_deepseek-v3_pdl{pdl}_r{rnd}.csv"), LAYER, rows)
            brow = [{"model": "glm5", "gemm": "q_b_proj", "tp": 8, "n": 2048, "k": 2048, "m": m, "bf16_us": 10 * noise,
                     "fp8_us": 9 * (1.0 if pdl == 0 else 0.9) * noise, "fp8_gemm_us": 7 * noise, "floor_us": 1}
                    for m in (1, 16)]
            write(os.path.join(d, f"bench_pdl{pdl}_r{rnd}.csv"), BENCH, brow)
    # A point measured with PDL off only: left out.
    write(os.path.join(d, "layer_glm5_pdl0_r1.csv"), LAYER,
          [{"kind": "decode", "model": "glm5", "tp": 1, "seqs": 16, "off_us": 1, "on_us": 1}])
    out_csv, out_md = os.path.join(d, "summary.csv"), os.path.join(d, "summary.md")
    r = subprocess.run([sys.executable, TOOL, d, "--csv", out_csv, "--md", out_md], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(open(out_csv)))
    dec = [x for x in rows if x["what"] == "decode"]
    pre = [x for x in rows if x["what"] == "prefill"]
    assert len(pre) == 1 and abs(float(pre[0]["off_us_gain"]) - 1.0) < 1e-9, pre  # 999 us both ways
    ben = [x for x in rows if x["what"] == "bench"]
    assert len(dec) == 4, dec  # deepseek-v3 x TP 1, 8 x C 16, 64; glm5 has no PDL-on run
    assert len(ben) == 2, ben
    for x in dec:
        assert x["rounds"] == "3", x
        assert abs(float(x["off_us_gain"]) - 1.25) < 1e-9, x
        assert abs(float(x["on_us_gain"]) - 1.25) < 1e-9, x
        assert abs(float(x["off_us_pdl0"]) - 100 * int(x["tp"])) < 1e-9, x  # the median round
    for x in ben:
        assert abs(float(x["fp8_us_gain"]) - 1 / 0.9) < 1e-9, x
        assert abs(float(x["bf16_us_gain"]) - 1.0) < 1e-9, x
    md = open(out_md).read()
    assert "geometric mean of the PDL gain over 4 points: off_us 1.250" in md, md
    empty = tempfile.mkdtemp()
    r = subprocess.run([sys.executable, TOOL, empty], capture_output=True, text=True)
    assert r.returncode == 1 and "no pair" in r.stderr, (r.returncode, r.stderr)
    print("OK")


if __name__ == "__main__":
    main()
