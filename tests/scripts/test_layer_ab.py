#!/usr/bin/env python3
"""scripts/layer_ab.py on synthetic `fp8proj layer --json` files of two builds with a known effect:
`new` takes 0.95x the base's flag-off time and 0.90x its flag-on time at every point, over three
rounds whose times differ (the medians are taken per label), plus one prefill row, one decode row
with --decode-layers' per-layer times (a "decode x4" point of its own) and one file with another
name that must be ignored. Checks the per-point medians, speedups and gains, the
geometric-mean line, the CSV, and the refusals (no files; no base label)."""
import csv
import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "layer_ab.py")


def layer_json(model, scale_off, scale_on, jitter):
    decode = []
    for tp in (1, 8):
        for seqs in (16, 64):
            off = 100.0 * tp ** -0.5 + seqs + jitter
            decode.append({"model": model, "tp": tp, "seqs": seqs, "off_us": off * scale_off,
                           "on_us": 0.75 * off * scale_on, "weight_scales": "ue8m0", "decode_quant": "fused"})
            if tp == 1 and seqs == 64:
                decode[-1].update({"decode_layers": 4, "layers_off_us": 0.8 * off * scale_off,
                                   "layers_on_us": 0.55 * off * scale_on})
    prefill = [{"model": model, "tp": 1, "seqs": 16, "off_us": 9000.0 + jitter, "on_us": 6000.0 + jitter}]
    return {"decode": decode, "prefill": prefill, "residual_input": False}


def run(args):
    return subprocess.run([sys.executable, SCRIPT] + args, capture_output=True, text=True, timeout=60)


def main():
    bad = []

    def check(what, ok):
        if not ok:
            bad.append(what)

    with tempfile.TemporaryDirectory() as d:
        p = run([d])
        check(f"an empty folder is refused (rc {p.returncode}, {p.stderr.strip()})", p.returncode == 1 and "no layer_" in p.stderr)
        for r, jitter in ((1, 0.0), (2, 3.0), (3, -1.0)):
            for label, so, sn in (("base", 1.0, 1.0), ("new", 0.95, 0.90)):
                with open(os.path.join(d, f"layer_deepseek-v3_{label}_r{r}.json"), "w") as f:
                    json.dump(layer_json("deepseek-v3", so, sn, jitter), f)
        with open(os.path.join(d, "layer_notes.json"), "w") as f:  # not layer_<model>_<label>_r<N>.json
            json.dump({"decode": [{"tp": 1, "seqs": 1, "off_us": 1, "on_us": 1}]}, f)
        md, out_csv = os.path.join(d, "ab.md"), os.path.join(d, "ab.csv")
        p = run([d, "--md", md, "--csv", out_csv])
        check(f"summary rc {p.returncode}: {p.stderr.strip()}", p.returncode == 0)
        text = open(md).read() if os.path.exists(md) else ""
        rows = list(csv.DictReader(open(out_csv))) if os.path.exists(out_csv) else []
        check(f"{len(rows)} rows, expected 2 labels x (4 decode + 1 decode x4 + 1 prefill) points", len(rows) == 12)
        check("the decode x4 point", sum(r["kind"] == "decode x4" for r in rows) == 2)
        for row in rows:
            where = f"{row['kind']} tp {row['tp']} C {row['seqs']} {row['label']}"
            check(f"{where}: rounds {row['rounds']}", row["rounds"] == "3")
            speed = float(row["speedup"])
            if row["kind"] == "decode x4":
                want = (0.8 / 0.55) * (0.95 / 0.90 if row["label"] == "new" else 1.0)
                check(f"{where}: speedup {speed:.4f}, expected {want:.4f}", abs(speed - want) < 1e-9)
            if row["kind"] == "decode":
                want = (1 / 0.75) * (0.95 / 0.90 if row["label"] == "new" else 1.0)
                check(f"{where}: speedup {speed:.4f}, expected {want:.4f}", abs(speed - want) < 1e-9)
                off = 100.0 * int(row["tp"]) ** -0.5 + int(row["seqs"])  # the median round has jitter 0
                want_off = off * (0.95 if row["label"] == "new" else 1.0)
                check(f"{where}: off_us {row['off_us']}, expected {want_off}", abs(float(row["off_us"]) - want_off) < 1e-9)
            if row["label"] == "new":
                og, ng = float(row["off_gain"]), float(row["on_gain"])
                want_og, want_ng = (1 / 0.95, 1 / 0.90) if row["kind"].startswith("decode") else (1.0, 1.0)
                check(f"{where}: gains {og:.4f} / {ng:.4f}", abs(og - want_og) < 1e-9 and abs(ng - want_ng) < 1e-9)
            else:
                check(f"{where}: the base has no gain of its own", math.isnan(float(row["off_gain"])))
        for kind, n in (("decode", 4), ("decode x4", 1), ("prefill", 1)):
            check(f"the {kind} geometric-mean line", f"new against base, {kind}, geometric mean over {n} points" in text)
        check("variant column", "| ue8m0+fused | new |" in text)
        p = run([d, "--base", "old"])
        check(f"a missing base label is refused (rc {p.returncode})", p.returncode == 1 and "'old'" in p.stderr)
    for b in bad:
        print("FAIL:", b)
    print("FAILED" if bad else "ok: layer_ab.py summary, gains, CSV and refusals")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
