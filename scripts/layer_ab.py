#!/usr/bin/env python3
"""Summarize an A/B of two or more builds (or settings) of `fp8proj layer`, run interleaved.

`scripts/h200.sh layer_ab` writes, per round r and model m, one JSON per label (the binary that
made it: `base` for $LAYER_AB_BASE, `new` for this tree's):

  layer_<m>_<label>_r<r>.json     `fp8proj layer --json`: "decode" rows (model, tp, seqs, off_us,
                                  on_us, weight_scales, decode_quant; with --decode-layers N also
                                  decode_layers, layers_off_us, layers_on_us: a point of kind
                                  "decode xN" of its own) and "prefill" rows (off_us, on_us);
                                  "residual_input" at the top

Per point (kind, model, TP, C, and the flag-on variant), for each label: the median over rounds
of the flag-off and flag-on times, the median of the per-round flag speedups (off / on: the bar's
ratio, both blocks timed in the same run), and each time against the base label's median
(base / label: above 1 the label is faster). Labels are read from the file names; `--base` names
the one the others are set against.

  python3 scripts/layer_ab.py DIR [--base base] [--md FILE] [--csv FILE]
"""
import argparse
import csv
import glob
import json
import math
import os
import re
import statistics
import sys

NAME = re.compile(r"^layer_(?P<model>.+)_(?P<label>[A-Za-z0-9-]+)_r(?P<round>\d+)\.json$")


def geomean(xs):
    xs = [x for x in xs if x > 0 and math.isfinite(x)]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def collect(folder):
    """{(kind, model, tp, seqs, variant): {label: {"off": [...], "on": [...], "ratio": [...]}}}"""
    points = {}
    files = sorted(glob.glob(os.path.join(folder, "layer_*_r*.json")))
    for path in files:
        m = NAME.match(os.path.basename(path))
        if not m:
            continue
        with open(path) as f:
            j = json.load(f)
        residual = "residual" if j.get("residual_input") else ""
        for kind in ("decode", "prefill"):
            for row in j.get(kind) or []:
                variant = "+".join(v for v in (str(row.get("weight_scales", "")), str(row.get("decode_quant", "")),
                                               residual) if v)
                timed = [(kind, row.get("off_us", "nan"), row.get("on_us", "nan"))]
                layers = int(row.get("decode_layers", 1) or 1)
                if kind == "decode" and layers > 1:  # N layers back to back, per layer (no flush)
                    timed.append((f"decode x{layers}", row.get("layers_off_us", "nan"), row.get("layers_on_us", "nan")))
                for k, off, on in timed:
                    off, on = float(off), float(on)
                    if not (off > 0 and on > 0):
                        continue
                    key = (k, str(row.get("model", m.group("model"))), int(row["tp"]), int(row["seqs"]), variant)
                    cell = points.setdefault(key, {}).setdefault(m.group("label"), {"off": [], "on": [], "ratio": []})
                    cell["off"].append(off)
                    cell["on"].append(on)
                    cell["ratio"].append(off / on)
    return points


def summarize(points, base):
    rows = []
    for key in sorted(points):
        kind, model, tp, seqs, variant = key
        labels = points[key]
        ref = labels.get(base)
        for label in sorted(labels, key=lambda s: (s != base, s)):
            c = labels[label]
            off, on = statistics.median(c["off"]), statistics.median(c["on"])
            row = {"kind": kind, "model": model, "tp": tp, "seqs": seqs, "variant": variant, "label": label,
                   "rounds": len(c["on"]), "off_us": off, "on_us": on, "speedup": statistics.median(c["ratio"]),
                   "off_gain": float("nan"), "on_gain": float("nan")}
            if ref is not None and label != base:
                row["off_gain"] = statistics.median(ref["off"]) / off
                row["on_gain"] = statistics.median(ref["on"]) / on
            rows.append(row)
    return rows


def markdown(rows, base):
    out = [f"Medians over rounds; speedup = flag off / flag on (same run); gain = {base} time / this time "
           "(above 1: faster than the base).", "",
           "| kind | model | TP | C | variant | build | rounds | off us | on us | speedup | off gain | on gain |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        gain = lambda x: "-" if r["label"] == base or not math.isfinite(x) else f"{x:.3f}"  # noqa: E731
        out.append(f"| {r['kind']} | {r['model']} | {r['tp']} | {r['seqs']} | {r['variant']} | {r['label']} | "
                   f"{r['rounds']} | {r['off_us']:.1f} | {r['on_us']:.1f} | {r['speedup']:.3f} | "
                   f"{gain(r['off_gain'])} | {gain(r['on_gain'])} |")
    others = sorted({r["label"] for r in rows if r["label"] != base})
    if others:
        out.append("")
    for label in others:
        # One line per kind ("decode", "decode xN", "prefill": the same point timed two ways is not
        # counted twice), over the points that have a gain (the base timed them too).
        for kind in sorted({r["kind"] for r in rows if r["label"] == label}):
            mine = [r for r in rows if r["label"] == label and r["kind"] == kind and math.isfinite(r["off_gain"])
                    and math.isfinite(r["on_gain"])]
            if mine:
                out.append(f"- {label} against {base}, {kind}, geometric mean over {len(mine)} points: flag off "
                           f"{geomean([r['off_gain'] for r in mine]):.3f}, flag on "
                           f"{geomean([r['on_gain'] for r in mine]):.3f}")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--base", default="base", help="the label the others are set against (default: base)")
    ap.add_argument("--md", help="write the markdown table here (default: stdout)")
    ap.add_argument("--csv", help="also write the rows as CSV")
    a = ap.parse_args(argv)
    points = collect(a.folder)
    if not points:
        print(f"layer_ab.py: no layer_<model>_<label>_r<round>.json with timed rows in {a.folder}", file=sys.stderr)
        return 1
    rows = summarize(points, a.base)
    if not any(r["label"] == a.base for r in rows):
        print(f"layer_ab.py: no file of the base label '{a.base}' in {a.folder}", file=sys.stderr)
        return 1
    text = markdown(rows, a.base)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
