#!/usr/bin/env python3
"""fp8proj floor end to end on the GPU (two small shapes, M 1 and 16): the table, the CSV and the
JSON agree with the floor arithmetic (weight bytes, floor = bytes / measured bandwidth, the
rotation covering 3 x L2, whole rotations per graph, ratios, fixed cost, SMs busy), every time is
positive, and `--launch-once` writes one manifest entry per launch that scripts/floor_table.py
reads back. Exit 77 (skipped, with the reason) without an sm_90 GPU.

Usage: test_floor_cli.py FP8PROJ_BINARY
"""
import csv
import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TABLE = os.path.join(HERE, "..", "..", "scripts", "floor_table.py")
SHAPES = [(2048, 2048), (576, 512)]
MS = [1, 16]


def main():
    binary = os.path.abspath(sys.argv[1])
    bad = []

    def check(what, ok):
        if not ok:
            bad.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        out_csv, out_json, manifest = (os.path.join(tmp, f) for f in ("floor.csv", "floor.json", "launches.csv"))
        shapes = ",".join(f"{n}x{k}" for n, k in SHAPES)
        p = subprocess.run([binary, "floor", "--shape", shapes, "--m", "1,16", "--reps", "5", "--csv", out_csv,
                            "--json", out_json], capture_output=True, text=True, timeout=600)
        if p.returncode != 0 and ("there is none" in p.stderr or "this GPU is" in p.stderr):
            print("skipped:", p.stderr.strip())
            return 77
        if p.returncode != 0:
            print(f"FAIL floor exited {p.returncode}:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
            return 1
        check("summary line", "summary:" in p.stdout)
        j = json.load(open(out_json))
        bw, l2 = j["read_bandwidth"]["bytes_per_s"], j["l2_bytes"]
        check(f"read bandwidth plausible ({bw:.3g} B/s)", 1e11 < bw < 1e13)
        rows = list(csv.DictReader(open(out_csv)))
        check(f"{len(rows)} rows, expected {len(SHAPES) * len(MS)}", len(rows) == len(SHAPES) * len(MS))
        check("JSON rows match CSV rows", len(j["rows"]) == len(rows))
        for r in rows:
            n, k, m = int(r["n"]), int(r["k"]), int(r["m"])
            tag = f"{n}x{k} M={m}"
            f = {c: float(r[c]) for c in ("floor_us", "call_eager_us", "call_graph_us", "empty_eager_us",
                                          "empty_graph_us", "read_eager_us", "read_graph_us", "k128_graph_us",
                                          "graph_floor_ratio", "eager_floor_ratio", "fixed_us", "graph_gbps")}
            wb, copies, calls = int(r["weight_bytes"]), int(r["copies"]), int(r["calls_per_graph"])
            check(f"{tag}: weight bytes", wb == n * k + math.ceil(n / 128) * math.ceil(k / 128) * 4)
            check(f"{tag}: floor = bytes / bandwidth", abs(f["floor_us"] - wb / bw * 1e6) <= 1e-3 * f["floor_us"] + 1e-4)
            check(f"{tag}: rotation covers 3 x L2", copies * wb >= 3 * l2 or copies == 256)
            check(f"{tag}: rotation is minimal", copies == 1 or (copies - 1) * wb < 3 * l2)
            check(f"{tag}: whole rotations per graph", calls % copies == 0 and calls >= 32)
            check(f"{tag}: every time positive", all(f[c] > 0 for c in f if c.endswith("_us") and c != "fixed_us"))
            check(f"{tag}: graph ratio", abs(f["graph_floor_ratio"] - f["call_graph_us"] / f["floor_us"]) < 1e-3 *
                  f["graph_floor_ratio"] + 1e-3)
            check(f"{tag}: fixed = graph - floor", abs(f["fixed_us"] - (f["call_graph_us"] - f["floor_us"])) < 1e-3)
            check(f"{tag}: bandwidth = bytes / graph time", abs(f["graph_gbps"] - wb / f["call_graph_us"] / 1e3) <
                  1e-3 * f["graph_gbps"] + 1e-3)
            ctas, busy, sms = int(r["ctas"]), int(r["sms_busy"]), int(r["sm_count"])
            check(f"{tag}: CTAs ({ctas}) and SMs busy ({busy})", ctas > 0 and busy == min(ctas, sms))
            check(f"{tag}: a configuration name", r["config"] != "")
            check(f"{tag}: gate path", r["gate_path"] in ("fp8", "bf16"))
            # A kernel cannot beat an empty one in the same replay, nor the GEMM the pure read of its bytes by much.
            check(f"{tag}: graph call above the replayed empty kernel", f["call_graph_us"] > f["empty_graph_us"])
        # --launch-once: per shape read + empty, per M quant + GEMM and (first time per N) their K = 128 pair.
        p = subprocess.run([binary, "floor", "--launch-once", "--shape", shapes, "--m", "1,16", "--csv", manifest],
                           capture_output=True, text=True, timeout=600)
        check(f"launch-once exit {p.returncode}: {p.stderr[-500:]}", p.returncode == 0)
        if p.returncode == 0:
            launches = list(csv.DictReader(open(manifest)))
            want = len(SHAPES) * (2 + 4 * len(MS))
            check(f"{len(launches)} manifest entries, expected {want}", len(launches) == want)
            check("manifest in order", [int(e["seq"]) for e in launches] == list(range(len(launches))))
        t = subprocess.run([sys.executable, TABLE, "--floor", out_csv], capture_output=True, text=True)
        check(f"floor_table.py on the run: {t.stderr[-300:]}", t.returncode == 0 and t.stdout.count("\n| 1 |") == 2)
    for b in bad:
        print("FAIL", b)
    print("ok" if not bad else f"{len(bad)} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
