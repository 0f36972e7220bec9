#!/usr/bin/env python3
"""Summarize the programmatic-dependent-launch A/B of `scripts/h200.sh pdl_ab`.

The step runs `fp8proj layer` (decode step, one CUDA-graph replay) and `fp8proj bench` (small M)
with FP8PROJ_PDL=0 and =1 interleaved, several rounds, into one folder:

  layer_<model>_pdl<0|1>_r<round>.csv   rows of kind "decode" (and "prefill"): model, tp, seqs, off_us, on_us
  bench_pdl<0|1>_r<round>.csv           model, gemm, tp, n, k, m, bf16_us, fp8_us, fp8_gemm_us

Per point, the median over rounds of each setting, and pdl_gain = time with PDL off / time with
it on (above 1: PDL is faster). Both decode columns change with PDL (the bf16 block's RMSNorm,
RoPE, attention and absorbed projections are fp8proj kernels too); bench's bf16_us (cuBLAS, never
launched with PDL) is the control: its gain should be 1 within noise. Columns are read by name,
so columns added to the CSVs later do not matter.

  python3 scripts/pdl_ab.py DIR [--md FILE] [--csv FILE]
"""
import argparse
import csv
import glob
import math
import os
import re
import statistics
import sys


def geomean(xs):
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def collect(paths, kind, key_fields, value_fields):
    """{key: {pdl: {field: [values over rounds]}}} from the CSVs whose name says pdl0/pdl1."""
    out = {}
    for path in paths:
        m = re.search(r"_pdl([01])_r\d+\.csv$", os.path.basename(path))
        if not m:
            continue
        pdl = int(m.group(1))
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if kind and row.get("kind") != kind:
                    continue
                key = tuple(row[k] for k in key_fields)
                slot = out.setdefault(key, {}).setdefault(pdl, {v: [] for v in value_fields})
                for v in value_fields:
                    if row.get(v):
                        slot[v].append(float(row[v]))
    return out


def summarize(points, key_fields, value_fields):
    rows = []
    for key, by_pdl in sorted(points.items(), key=lambda kv: [int(x) if x.isdigit() else x for x in kv[0]]):
        if 0 not in by_pdl or 1 not in by_pdl:
            continue
        row = dict(zip(key_fields, key))
        row["rounds"] = min(len(by_pdl[p][value_fields[0]]) for p in (0, 1))
        for v in value_fields:
            a, b = by_pdl[0][v], by_pdl[1][v]
            if not a or not b:
                continue
            row[f"{v}_pdl0"] = statistics.median(a)
            row[f"{v}_pdl1"] = statistics.median(b)
            row[f"{v}_gain"] = row[f"{v}_pdl0"] / row[f"{v}_pdl1"]
        rows.append(row)
    return rows


def table(rows, key_fields, value_fields):
    head = key_fields + [f"{v} {s}" for v in value_fields for s in ("PDL off", "PDL on", "gain")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r[k]) for k in key_fields]
        for v in value_fields:
            if f"{v}_gain" in r:
                cells += [f"{r[f'{v}_pdl0']:.2f}", f"{r[f'{v}_pdl1']:.2f}", f"{r[f'{v}_gain']:.3f}"]
            else:
                cells += ["-", "-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def geo_line(rows, value_fields, what):
    parts = []
    for v in value_fields:
        g = [r[f"{v}_gain"] for r in rows if f"{v}_gain" in r]
        if g:
            parts.append(f"{v} {geomean(g):.3f} (min {min(g):.3f}, max {max(g):.3f})")
    return f"{what}: geometric mean of the PDL gain over {len(rows)} points: " + "; ".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--md")
    ap.add_argument("--csv")
    a = ap.parse_args()

    dkeys, dvals = ["model", "tp", "seqs"], ["off_us", "on_us"]
    bkeys, bvals = ["model", "gemm", "tp", "n", "k", "m"], ["fp8_us", "fp8_gemm_us", "bf16_us"]
    drows = summarize(collect(sorted(glob.glob(os.path.join(a.dir, "layer_*_pdl*_r*.csv"))), "decode", dkeys, dvals),
                      dkeys, dvals)
    prows = summarize(collect(sorted(glob.glob(os.path.join(a.dir, "layer_*_pdl*_r*.csv"))), "prefill", dkeys, dvals),
                      dkeys, dvals)
    brows = summarize(collect(sorted(glob.glob(os.path.join(a.dir, "bench_pdl*_r*.csv"))), None, bkeys, bvals),
                      bkeys, bvals)
    if not drows and not brows:
        print(f"pdl_ab: no pair of PDL-off/on results under {a.dir}", file=sys.stderr)
        return 1

    md = ["# Programmatic dependent launch: FP8PROJ_PDL=0 vs 1", "",
          "Medians over rounds (interleaved A B A B); gain = time off / time on (> 1: PDL faster).", ""]
    if drows:
        md += ["## Decode step (`fp8proj layer`, one CUDA-graph replay, every dense GEMM on FP8, policy all)", "",
               "off_us: the flag-off (bf16) block; on_us: the flag-on (FP8) block.", ""]
        md += table(drows, dkeys, dvals)
        for r in drows:
            if "off_us_gain" in r and "on_us_gain" in r:
                r["fp8_vs_bf16_pdl0"] = r["off_us_pdl0"] / r["on_us_pdl0"]
                r["fp8_vs_bf16_pdl1"] = r["off_us_pdl1"] / r["on_us_pdl1"]
        md += ["", geo_line(drows, dvals, "decode"), "",
               "FP8 block vs bf16 block (flag off / flag on) with PDL off -> on: " +
               ", ".join(f"{r['model']} TP{r['tp']} C={r['seqs']}: {r['fp8_vs_bf16_pdl0']:.3f}x -> "
                         f"{r['fp8_vs_bf16_pdl1']:.3f}x" for r in drows if "fp8_vs_bf16_pdl0" in r), ""]
    if prows:
        md += ["## Prefill (the same `fp8proj layer` runs: C sequences of L tokens; PDL applies at every M)", ""]
        md += table(prows, dkeys, dvals)
        md += ["", geo_line(prows, dvals, "prefill"), ""]
    if brows:
        md += ["## GEMM at small M (`fp8proj bench`, L2 flushed)", "",
               "fp8_us: the full path (activation quantization + GEMM); fp8_gemm_us: the GEMM alone; bf16_us: "
               "cuBLAS, launched without PDL (the control).", ""]
        md += table(brows, bkeys, bvals)
        md += ["", geo_line(brows, bvals, "bench"), ""]
    text = "\n".join(md)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text)
    if a.csv:
        fields = ["what"] + sorted({k for r in drows + prows + brows for k in r}, key=lambda k: (k not in dkeys + bkeys, k))
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            for r in drows:
                w.writerow({"what": "decode", **r})
            for r in prows:
                w.writerow({"what": "prefill", **r})
            for r in brows:
                w.writerow({"what": "bench", **r})
    return 0


if __name__ == "__main__":
    sys.exit(main())
