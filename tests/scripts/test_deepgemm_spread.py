#!/usr/bin/env python3
"""scripts/deepgemm_spread.py on synthetic comparison runs with known DeepGEMM and ours ratios:
the per-point spread, the counts and geometric means against each reference must come back
exactly; runs missing a point are left out of the pool and refused as runs to judge."""
import csv
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "..", "scripts", "deepgemm_spread.py")
FIELDS = ["shape", "n", "k", "m", "deepgemm_ratio", "ours_ratio", "design_deepgemm_ratio"]
# (n, k, m, the reference table's ratio); an off-table M (design "None") must be ignored.
POINTS = [(4096, 2048, 16, 1.34), (4096, 2048, 64, 1.30), (6144, 16384, 8192, 2.01)]
# DeepGEMM / the table per pooled run and point.
DG = [[0.90, 1.02, 0.95], [0.92, 0.98, 0.94], [0.88, 1.00, 0.93]]


def write(path, dg, ours, drop_last=False):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for (n, k, m, design), g, o in list(zip(POINTS, dg, ours))[: len(POINTS) - drop_last]:
            w.writerow(dict(shape=f"S{n}", n=n, k=k, m=m, deepgemm_ratio=g * design, ours_ratio=o * design,
                            design_deepgemm_ratio=design))
        w.writerow(dict(shape="S4096", n=4096, k=2048, m=300, deepgemm_ratio=1.0, ours_ratio=1.0,
                        design_deepgemm_ratio="None"))


def main():
    bad = 0

    def check(what, got, want):
        nonlocal bad
        if abs(got - want) > 1e-9:
            print(f"FAIL {what}: {got} (want {want})")
            bad += 1

    with tempfile.TemporaryDirectory() as tmp:
        for i, dg in enumerate(DG):
            write(os.path.join(tmp, "pool", f"r{i}", "compare_deepgemm.csv"), dg, [1.0] * 3)
        # A partial run (an A/B over a few points): not part of the pool.
        write(os.path.join(tmp, "pool", "partial", "compare_deepgemm.csv"), [0.5] * 3, [1.0] * 3, drop_last=True)
        # Ours, one run: over the table 0.99, 1.05, 0.96; its own DeepGEMM run 0.91, 1.00, 0.94.
        ours = [0.99, 1.05, 0.96]
        write(os.path.join(tmp, "ours", "run1", "compare_deepgemm.csv"), [0.91, 1.00, 0.94], ours)
        out_csv = os.path.join(tmp, "spread.csv")
        res = subprocess.run([sys.executable, TOOL, "--pool", os.path.join(tmp, "pool", "**", "compare_deepgemm.csv"),
                              "--ours", os.path.join(tmp, "ours"), "--csv", out_csv], capture_output=True, text=True)
        if res.returncode != 0:
            print(f"FAIL the tool exited {res.returncode}: {res.stderr.strip()}")
            return 1
        rows = list(csv.DictReader(open(out_csv)))
        check("points", len(rows), 3)
        for r, (n, k, m, design), col in zip(rows, POINTS, zip(*DG)):
            med = sorted(col)[1]
            check(f"M={m} runs", int(r["dg_runs"]), 3)
            check(f"M={m} min", float(r["dg_over_design_min"]), min(col))
            check(f"M={m} median", float(r["dg_over_design_median"]), med)
            check(f"M={m} max", float(r["dg_over_design_max"]), max(col))
            check(f"M={m} runs below", int(r["dg_runs_below_design"]), sum(x < 1 for x in col))
            i = [p[2] for p in POINTS].index(m)
            check(f"M={m} ours/median", float(r["ours_over_dg_median_min"]), ours[i] / med)
        text = res.stdout
        # Every run below at M = 16 and M = 8192; medians below at the same two.
        for want in ("Below its table entry in every run: 2 points", "its median below the entry: 2 points",
                     ">= the table at 1,", ">= DeepGEMM same run at 3,", ">= DeepGEMM's median at 3,"):
            if want not in text:
                print(f"FAIL report lacks {want!r}:\n{text}")
                bad += 1
        geo = math.exp(sum(math.log(x) for x in ours) / 3)
        if f"geomean {geo:.4f}; >= DeepGEMM same run" not in text:
            print(f"FAIL geometric mean over the table {geo:.4f} not in:\n{text}")
            bad += 1
        # A run to judge that lacks a point is refused, not silently judged on fewer points.
        write(os.path.join(tmp, "short", "run1", "compare_deepgemm.csv"), [1.0] * 3, [1.0] * 3, drop_last=True)
        short = subprocess.run([sys.executable, TOOL, "--pool", os.path.join(tmp, "pool", "**", "compare_deepgemm.csv"),
                                "--ours", os.path.join(tmp, "short")], capture_output=True, text=True)
        if short.returncode == 0 or "not every point" not in short.stderr:
            print(f"FAIL a run missing a point was judged: rc {short.returncode}, {short.stderr.strip()}")
            bad += 1
    print("deepgemm_spread: " + ("ok" if bad == 0 else f"{bad} failures"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
