#!/usr/bin/env python3
"""Speedup of the FP8 path over bf16 against M, one panel per shape, threshold marked.

Reads the CSV that `fp8proj tune` writes (every measurement) or the one `fp8proj bench --csv`
writes (per M: bf16, FP8 path, FP8 GEMM alone, gated call), recognised by their columns, and
draws a PNG (or SVG/PDF: the extension of -o decides).

  tune CSV   thick line: the FP8 candidate the table chose for each measured M (quantization
             included); thin lines: the best configuration of each FP8 backend there; green
             bands: the buckets where policy `all` runs FP8.
  bench CSV  the FP8 path (quantization included), the FP8 GEMM alone, and the gated call.
  compare CSV (scripts/compare_deepgemm.py) GEMM only: ours and DeepGEMM in the same run, and
             DeepGEMM's ratio in the reference table (docs/design.md); no threshold (the GEMM has none).

Marked in every panel: speedup 1 (grey), the 3% margin (dotted), the reference design's fixed
M > 512 (dashed), and the tuned threshold (red; from the tune CSV, from --table, or, for a bench
CSV without --table, where the gate's path switches to FP8 for good).

Usage (matplotlib is a tool dependency, not a test one: `pip install matplotlib`):
  python3 scripts/plot_speedup.py tune.csv -o tune-speedup.png
  python3 scripts/plot_speedup.py bench/results/gemm-vs-cublas/bench.csv --table configs/nvidia-h200.json \
      -o bench/results/gemm-vs-cublas/bench-speedup.png
  python3 scripts/plot_speedup.py bench/results/deepgemm/run1/compare_deepgemm.csv -o speedup-vs-deepgemm.png
"""
import argparse
import csv
import json
import math
import sys
from collections import defaultdict

NEVER = 2**63 - 1
REFERENCE = 512
MARGIN = 1.03


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def parse_threshold(text):
    return NEVER if text in ("never", str(NEVER)) else int(text)


def table_thresholds(path):
    """(n, k) -> threshold from a tuned table (fp8proj-tune/1)."""
    with open(path) as f:
        t = json.load(f)
    return {(s["n"], s["k"]): int(s["threshold"]) for s in t["shapes"]}


def series_from_tune(rows):
    """Per shape: {'lines': {name: [(m, speedup)]}, 'threshold': t, 'n', 'k'}."""
    shapes = {}
    for r in rows:
        if r["status"] != "ok" or float(r["median_us"]) <= 0:
            continue
        key = r["label"]
        s = shapes.setdefault(key, {"n": int(r["n"]), "k": int(r["k"]), "threshold": parse_threshold(r["threshold"]),
                                    "best": defaultdict(dict), "chosen": {}, "buckets": defaultdict(list)})
        if r["kind"] != "fp8" or float(r["speedup"]) <= 0:
            continue
        m, sp = int(r["m"]), float(r["speedup"])
        best = s["best"][r["backend"]]
        best[m] = max(best.get(m, 0.0), sp)
        if r["chosen"] == "1":
            s["chosen"][m] = sp
            s["buckets"][(int(r["bucket_lo"]), int(r["bucket_hi"]))].append(sp)
    out = {}
    for label, s in shapes.items():
        lines = {f"best {b}": sorted(v.items()) for b, v in sorted(s["best"].items())}
        lines["chosen (table)"] = sorted(s["chosen"].items())
        # The bucket verdict policy `all` follows: FP8 when the geometric mean of its points' speedups > 1.
        fp8_spans = [b for b, sp in s["buckets"].items() if math.exp(sum(map(math.log, sp)) / len(sp)) > 1]
        out[label] = {"n": s["n"], "k": s["k"], "threshold": s["threshold"], "lines": lines, "main": "chosen (table)",
                      "fp8_spans": fp8_spans}
    return out


def series_from_bench(rows):
    shapes = {}
    for r in rows:
        label = f'{r["model"]} {r["gemm"]} TP{r["tp"]} {r["n"]}x{r["k"]}'
        s = shapes.setdefault(label, {"n": int(r["n"]), "k": int(r["k"]), "fp8": [], "gemm": [], "gated": [],
                                      "path": []})
        m, bf16 = int(r["m"]), float(r["bf16_us"])
        if float(r["speedup"]) > 0:
            s["fp8"].append((m, float(r["speedup"])))
        if float(r["gemm_speedup"]) > 0:
            s["gemm"].append((m, float(r["gemm_speedup"])))
        if float(r["gated_us"]) > 0:
            s["gated"].append((m, bf16 / float(r["gated_us"])))
        s["path"].append((m, r["path"]))
    out = {}
    for label, s in shapes.items():
        # The gate's switch point: the largest M it keeps on bf16 below its final FP8 run.
        path = sorted(s["path"])
        t = NEVER
        if path and path[-1][1] == "fp8":
            i = len(path)
            while i > 0 and path[i - 1][1] == "fp8":
                i -= 1
            t = path[i - 1][0] if i > 0 else 0
        out[label] = {"n": s["n"], "k": s["k"], "threshold": t, "threshold_inferred": True, "main": "FP8 path",
                      "lines": {"FP8 path": sorted(s["fp8"]), "FP8 GEMM only": sorted(s["gemm"]),
                                "gated call": sorted(s["gated"])}}
    return out


def series_from_compare(rows):
    shapes = {}
    for r in rows:
        label = f'{r["shape"]} {r["n"]}x{r["k"]}'
        s = shapes.setdefault(label, {"n": int(r["n"]), "k": int(r["k"]), "threshold": None, "main": "ours",
                                      "lines": {"ours": [], "DeepGEMM (same run)": [], "DeepGEMM (reference table)": []}})
        m = int(r["m"])
        s["lines"]["ours"].append((m, float(r["ours_ratio"])))
        s["lines"]["DeepGEMM (same run)"].append((m, float(r["deepgemm_ratio"])))
        s["lines"]["DeepGEMM (reference table)"].append((m, float(r["design_deepgemm_ratio"])))
    for s in shapes.values():
        for name in s["lines"]:
            s["lines"][name].sort()
    return shapes


def plot(shapes, out, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(shapes)
    cols = min(4, len(labels))
    rows = math.ceil(len(labels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax in axes.flat[len(labels):]:
        ax.set_visible(False)
    for ax, label in zip(axes.flat, labels):
        s = shapes[label]
        for name, pts in s["lines"].items():
            if not pts:
                continue
            xs, ys = zip(*pts)
            main = name == s["main"]
            ax.plot(xs, ys, marker="o" if main else None, markersize=3, linewidth=2.0 if main else 0.9,
                    alpha=1.0 if main else 0.7, label=name, zorder=3 if main else 2)
        for i, (lo, hi) in enumerate(sorted(s.get("fp8_spans", []))):
            ax.axvspan(lo, hi, color="green", alpha=0.08, linewidth=0, label="policy all: FP8" if i == 0 else None)
        ax.set_xscale("log", base=2)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.axhline(MARGIN, color="grey", linewidth=0.6, linestyle=":")
        t = s["threshold"]
        if t is None:  # a GEMM comparison: no gate, no threshold
            ax.set_title(label, fontsize=8)
            ax.set_xlabel("M (tokens)", fontsize=8)
            ax.set_ylabel("cuBLAS bf16 time / FP8 time", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(True, which="major", alpha=0.3)
            continue
        ax.axvline(REFERENCE, color="black", linewidth=0.8, linestyle="--", label=f"reference M > {REFERENCE}")
        if t == NEVER:
            tl = "threshold: never"
        else:
            ax.axvline(max(t, 1), color="red", linewidth=1.2, label=f"threshold M > {t}")
            tl = f"threshold {t}"
        if s.get("threshold_inferred"):
            tl += " (gate switch)"
        ax.set_title(f"{label}\n{tl}", fontsize=8)
        ax.set_xlabel("M (tokens)", fontsize=8)
        ax.set_ylabel("bf16 time / FP8 time", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, which="major", alpha=0.3)
    handles, names = [], []
    for ax in axes.flat:
        for h, n in zip(*ax.get_legend_handles_labels()):
            if n not in names:
                handles.append(h)
                names.append(n)
    fig.legend(handles, names, loc="lower center", ncol=min(6, len(names)), fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    fig.savefig(out, dpi=130)
    print(f"wrote {out} ({len(labels)} shapes)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="CSV from `fp8proj tune`, `fp8proj bench --csv` or scripts/compare_deepgemm.py")
    ap.add_argument("--table", help="tuned table (JSON) whose thresholds to mark")
    ap.add_argument("-o", "--out", default="speedup.png", help="output image (.png, .svg, .pdf)")
    ap.add_argument("--title", default="", help="figure title")
    a = ap.parse_args()

    rows = read_csv(a.csv)
    if not rows:
        sys.exit(f"{a.csv}: no rows")
    cols = set(rows[0])
    if {"kind", "chosen", "threshold", "speedup"} <= cols:
        shapes, what = series_from_tune(rows), "fp8proj tune"
    elif {"bf16_us", "fp8_us", "gated_us", "path"} <= cols:
        shapes, what = series_from_bench(rows), "fp8proj bench"
    elif {"ours_ratio", "deepgemm_ratio", "design_deepgemm_ratio"} <= cols:
        shapes, what = series_from_compare(rows), "scripts/compare_deepgemm.py"
    else:
        sys.exit(f"{a.csv}: neither a tune, a bench nor a DeepGEMM comparison CSV (columns: {', '.join(sorted(cols))})")
    if a.table:
        thr = table_thresholds(a.table)
        for s in shapes.values():
            if (s["n"], s["k"]) in thr:
                s["threshold"] = thr[(s["n"], s["k"])]
                s.pop("threshold_inferred", None)
    plot(shapes, a.out, a.title or f"Speedup over cuBLAS bf16 ({what}: {a.csv})")


if __name__ == "__main__":
    main()
