#!/usr/bin/env python3
"""How DeepGEMM's own ratio moves between runs, against the reference table, and ours against it.

The reference table (docs/design.md) gives DeepGEMM's ratio (cuBLAS bf16 time / its time) at 66
points: one run, two digits. Every run of
scripts/compare_deepgemm.py measures DeepGEMM again in the same process; this tool pools those
measurements per point, says where DeepGEMM itself does not reach its table entry, and judges
our runs against three references: the table, DeepGEMM in the same run, and DeepGEMM's median
over all pooled runs.

  python3 scripts/deepgemm_spread.py --pool 'runs/**/compare_deepgemm.csv' \\
      --ours bench/results/deepgemm [--md FILE] [--csv FILE]

--pool: globs of compare_deepgemm.csv files (quote them; ** recurses); only runs with every
  point of the reference table count (A/B runs included: DeepGEMM is timed in each).
--ours: directories holding run*/compare_deepgemm.csv (or such files): the runs to judge.
"""
import argparse
import csv
import glob
import math
import os
import statistics
import sys


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def read(path):
    """Rows of one run with a reference-table entry: {(shape, n, k, m): row}."""
    out = {}
    for r in csv.DictReader(open(path)):
        if r.get("design_deepgemm_ratio") in (None, "", "None"):  # an M off the reference table
            continue
        key = (r["shape"], int(r["n"]), int(r["k"]), int(r["m"]))
        out[key] = dict(design=float(r["design_deepgemm_ratio"]), dg=float(r["deepgemm_ratio"]),
                        ours=float(r["ours_ratio"]))
    return out


def ours_files(paths):
    files = []
    for p in paths:
        if os.path.isfile(p):
            files.append(p)
        else:
            files += sorted(glob.glob(os.path.join(p, "run*", "compare_deepgemm.csv")))
    if not files:
        sys.exit(f"no compare_deepgemm.csv under {' '.join(paths)}")
    return files


def analyse(pool_files, our_files):
    runs = [read(f) for f in pool_files]
    points = max((set(r) for r in runs), key=len, default=set())
    full = [r for r in runs if set(r) == points and points]
    if not full:
        sys.exit("no run in the pool covers the reference table")
    ours = [read(f) for f in our_files]
    for f, r in zip(our_files, ours):
        if set(r) != points:
            sys.exit(f"{f}: not every point of the reference table ({len(r)} of {len(points)})")
    rows = []
    for key in sorted(points, key=lambda k: (k[1], k[2], k[3])):
        design = full[0][key]["design"]
        dg = [r[key]["dg"] / design for r in full]
        med = statistics.median(r[key]["dg"] for r in full)
        row = dict(shape=key[0], n=key[1], k=key[2], m=key[3], design=design, dg_runs=len(dg),
                   dg_over_design_min=min(dg), dg_over_design_median=statistics.median(dg),
                   dg_over_design_max=max(dg), dg_runs_below_design=sum(x < 1 - 1e-9 for x in dg),
                   dg_median_ratio=med)
        if ours:
            row.update(ours_over_design_min=min(o[key]["ours"] / design for o in ours),
                       ours_over_dg_same_run_min=min(o[key]["ours"] / o[key]["dg"] for o in ours),
                       ours_over_dg_median_min=min(o[key]["ours"] / med for o in ours))
        rows.append(row)
    summary = dict(pool_runs=len(full), points=len(points),
                   dg_below_design_every_run=sum(r["dg_runs_below_design"] == r["dg_runs"] for r in rows),
                   dg_below_design_median=sum(r["dg_over_design_median"] < 1 - 1e-9 for r in rows),
                   geomean_dg_median_over_design=geomean([r["dg_median_ratio"] / r["design"] for r in rows]))
    per_run = []
    for f, o in zip(our_files, ours):
        keys = [(r["shape"], r["n"], r["k"], r["m"]) for r in rows]
        med = {kk: r["dg_median_ratio"] for kk, r in zip(keys, rows)}
        per_run.append(dict(
            run=f,
            ge_design=sum(o[kk]["ours"] >= o[kk]["design"] - 1e-9 for kk in keys),
            geomean_over_design=geomean([o[kk]["ours"] / o[kk]["design"] for kk in keys]),
            ge_dg_same_run=sum(o[kk]["ours"] >= o[kk]["dg"] - 1e-9 for kk in keys),
            geomean_over_dg_same_run=geomean([o[kk]["ours"] / o[kk]["dg"] for kk in keys]),
            ge_dg_median=sum(o[kk]["ours"] >= med[kk] - 1e-9 for kk in keys),
            geomean_over_dg_median=geomean([o[kk]["ours"] / med[kk] for kk in keys])))
    return rows, summary, per_run


def markdown(rows, summary, per_run):
    s = summary
    out = [f"DeepGEMM measured in {s['pool_runs']} runs of scripts/compare_deepgemm.py covering the reference table's "
           f"{s['points']} points. Below its table entry in every run: {s['dg_below_design_every_run']} points; "
           f"its median below the entry: {s['dg_below_design_median']} points. Geometric mean of DeepGEMM's median ratio over "
           f"the table's: {s['geomean_dg_median_over_design']:.4f}.", ""]
    for r in per_run:
        out.append(f"- `{r['run']}`: >= the table at {r['ge_design']}, geomean {r['geomean_over_design']:.4f}; "
                   f">= DeepGEMM same run at {r['ge_dg_same_run']}, geomean {r['geomean_over_dg_same_run']:.4f}; "
                   f">= DeepGEMM's median at {r['ge_dg_median']}, geomean {r['geomean_over_dg_median']:.4f}")
    if per_run:
        out.append("")
    ours = bool(per_run)
    head = "| shape | N×K | M | table | DeepGEMM / table: min, median, max | runs below |"
    head += " ours / table (min) | ours / DeepGEMM same run (min) | ours / DeepGEMM median (min) |" if ours else ""
    out += [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        line = (f"| {r['shape']} | {r['n']}×{r['k']} | {r['m']} | {r['design']:.2f} | {r['dg_over_design_min']:.3f}, "
                f"{r['dg_over_design_median']:.3f}, {r['dg_over_design_max']:.3f} | "
                f"{r['dg_runs_below_design']} of {r['dg_runs']} |")
        if ours:
            line += (f" {r['ours_over_design_min']:.3f} | {r['ours_over_dg_same_run_min']:.3f} | "
                     f"{r['ours_over_dg_median_min']:.3f} |")
        out.append(line)
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool", nargs="+", required=True, help="globs of compare_deepgemm.csv files")
    ap.add_argument("--ours", nargs="*", default=[], help="run directories (run*/compare_deepgemm.csv) to judge")
    ap.add_argument("--md", help="write the markdown report here (default: stdout)")
    ap.add_argument("--csv", help="write the per-point table here")
    a = ap.parse_args()
    pool = sorted({f for g in a.pool for f in glob.glob(g, recursive=True)})
    if not pool:
        sys.exit(f"no file matches {' '.join(a.pool)}")
    rows, summary, per_run = analyse(pool, ours_files(a.ours) if a.ours else [])
    text = markdown(rows, summary, per_run)
    if a.md:
        open(a.md, "w").write(text)
    else:
        sys.stdout.write(text)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
