#!/usr/bin/env python3
"""Our FP8 GEMM against the reference table (docs/design.md) and cuBLASLt, from one run's files.

  compare_reference.py BENCH_CSV TUNE_CSV [-o OUT.md]

1. GEMM-only ratio (cuBLAS bf16 time / our FP8 GEMM time, same run, L2 flushed) from
   `fp8proj bench --csv`, next to DeepGEMM's ratio at the same shape and M as the reference
   table gives it (those are reference numbers measured elsewhere, not in this run), with the
   geometric mean over the table.
2. sm90_fp8_block against cuBLASLt's blockwise FP8 path, both measured in the same
   `fp8proj tune` run at the same M (activation quantization included in both; it is the same
   kernel for both, so the difference is the GEMM's): the best sm90 configuration vs cuBLASLt.
"""
import argparse
import csv
import math
from collections import defaultdict

# The reference table (docs/design.md): DeepGEMM 2.6.1 / cuBLAS bf16 on an H200, L2 flushed,
# first measured 2026-11-30. Another run's numbers: a guide, never a bar.
DEEPGEMM = {
    (16384, 2048): [1.55, 1.58, 1.57, 1.43, 1.49, 1.73, 1.75, 1.83, 1.81, 1.88, 1.86],
    (4096, 2048): [1.34, 1.30, 1.32, 1.33, 1.36, 1.47, 1.53, 1.71, 1.70, 1.80, 1.87],
    (6144, 16384): [1.63, 1.76, 1.75, 1.78, 1.91, 1.89, 1.90, 1.90, 2.01, 1.76, 1.93],
    (6144, 4096): [1.52, 1.57, 1.56, 1.61, 1.59, 1.69, 1.74, 1.76, 1.86, 1.82, 1.84],
    (24576, 1536): [1.52, 1.58, 1.58, 1.39, 1.54, 1.70, 1.72, 1.71, 1.80, 1.69, 1.78],
    (7168, 16384): [1.81, 1.66, 1.64, 1.52, 1.36, 1.70, 1.48, 1.82, 1.79, 1.63, 1.86],
}
MS = [16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
NAMES = {(16384, 2048): "GLM-5 q_b TP1", (4096, 2048): "GLM-5 q_b TP4", (6144, 16384): "GLM-5 o TP1",
         (6144, 4096): "GLM-5 o TP4", (24576, 1536): "DSV3 q_b TP1", (7168, 16384): "DSV3 o TP1"}


def gmean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench_csv")
    ap.add_argument("tune_csv")
    ap.add_argument("-o", "--out")
    a = ap.parse_args()

    ours = {}
    for r in csv.DictReader(open(a.bench_csv)):
        ours[(int(r["n"]), int(r["k"]), int(r["m"]))] = float(r["gemm_speedup"])
    lines = ["## GEMM-only: ours vs DeepGEMM (ratio to cuBLAS bf16)", "",
             "Ours: measured in this run. DeepGEMM: the reference table (another run). Cell: ours / DeepGEMM.",
             "", "| shape (N×K) | " + " | ".join(f"M={m}" for m in MS) + " | ours ≥ DeepGEMM |",
             "|---|" + "---|" * (len(MS) + 1)]
    ratios, wins, total = [], 0, 0
    for nk, ref in DEEPGEMM.items():
        cells = []
        for m, d in zip(MS, ref):
            o = ours.get((nk[0], nk[1], m))
            if o is None:
                cells.append("–")
                continue
            ratios.append(o / d)
            total += 1
            wins += o >= d
            cells.append(f"{o:.2f} / {d:.2f}" + (" ✓" if o >= d else ""))
        lines.append(f"| {NAMES[nk]} {nk[0]}×{nk[1]} | " + " | ".join(cells) + f" | {sum(c.endswith('✓') for c in cells)}/{len(cells)} |")
    lines += ["", f"Points at or above DeepGEMM: {wins} of {total}. Geometric mean of ours / DeepGEMM: "
                  f"{gmean(ratios):.3f} (a guide: the bar is 1.05 against DeepGEMM in the same run).", ""]

    best = defaultdict(lambda: defaultdict(lambda: float("inf")))
    for r in csv.DictReader(open(a.tune_csv)):
        if r["kind"] != "fp8" or r["status"] != "ok":
            continue
        key = (r["label"], int(r["m"]))
        best[key][r["backend"]] = min(best[key][r["backend"]], float(r["median_us"]))
    per_shape = defaultdict(list)
    for (label, m), b in best.items():
        if "sm90_fp8_block" in b and "cublaslt_fp8_block" in b:
            per_shape[label].append((m, b["cublaslt_fp8_block"] / b["sm90_fp8_block"]))
    lines += ["## sm90_fp8_block vs cuBLASLt blockwise FP8 (same tune run, quantization included in both)", "",
              "| shape | points | sm90 faster at | min | geo-mean | max | slowest M |", "|---|---|---|---|---|---|---|"]
    all_r = []
    for label in sorted(per_shape):
        pts = sorted(per_shape[label])
        rs = [x for _, x in pts]
        all_r += rs
        worst = min(pts, key=lambda p: p[1])
        lines.append(f"| {label} | {len(rs)} | {sum(x > 1 for x in rs)} | {min(rs):.2f} | {gmean(rs):.2f} | "
                     f"{max(rs):.2f} | M={worst[0]} |")
    lines += ["", f"All shapes: sm90 faster at {sum(x > 1 for x in all_r)} of {len(all_r)} measured M; "
                  f"geometric mean cuBLASLt time / sm90 time = {gmean(all_r):.3f}.", ""]
    text = "\n".join(lines)
    if a.out:
        open(a.out, "w").write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
