#!/usr/bin/env python3
"""Combine an A/B of scripts/compare_deepgemm.py run both ways round.

Each library in an A/B holds its own copy of the weights, and at memory-bound points where
that copy lies moved one side by 1-4% with byte-identical SASS (docs/kernels.md):
a one-way A/B measures the placement along with the code. Run it both ways (X as --lib and Y
as --lib-b, then the two swapped) and give each orientation equal weight:

  x_over_y = sqrt(geomean over forward runs of t_X / t_Y  *  geomean over reversed runs of t_X / t_Y)

Below 1: X is faster. `spread` = forward / reversed geomean: how much the placement alone moved.

  python3 scripts/ab_both_ways.py OUT                 run*/ dirs; a reversed run holds a file `swapped`
  python3 scripts/ab_both_ways.py --forward D1 --reversed D2   (run*/ dirs under each)
  [--csv FILE]
"""
import argparse
import csv
import glob
import math
import os
import sys


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def runs_under(d):
    return sorted(p for p in glob.glob(os.path.join(d, "run*")) if os.path.isfile(os.path.join(p, "compare_deepgemm.csv")))


def read_run(path, reversed_run):
    """Per point (shape, m): t_X / t_Y, X's and Y's configurations."""
    out = {}
    for r in csv.DictReader(open(os.path.join(path, "compare_deepgemm.csv"))):
        if not r.get("b_us"):
            sys.exit(f"{path}: no B column (not an A/B run)")
        t_a, t_b = float(r["ours_us"]), float(r["b_us"])
        cfg_a, cfg_b = r["ours_config"], r["b_config"]
        key = (r["shape"], int(r["n"]), int(r["k"]), int(r["m"]))
        out[key] = (t_b / t_a, cfg_b, cfg_a) if reversed_run else (t_a / t_b, cfg_a, cfg_b)
    return out


def combine(forward, reversed_):
    if not forward or not reversed_:
        sys.exit(f"need runs both ways round: {len(forward)} forward, {len(reversed_)} reversed")
    keys = [k for k in forward[0] if all(k in run for run in forward + reversed_)]
    rows = []
    for k in keys:
        fw = geomean([run[k][0] for run in forward])
        rv = geomean([run[k][0] for run in reversed_])
        rows.append(dict(shape=k[0], n=k[1], k=k[2], m=k[3], x_over_y=math.sqrt(fw * rv), forward=fw, reversed=rv,
                         spread=fw / rv, x_config=forward[0][k][1], y_config=forward[0][k][2]))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", help="a directory of run*/ dirs, reversed runs marked by a file `swapped`")
    ap.add_argument("--forward", help="a directory of forward run*/ dirs")
    ap.add_argument("--reversed", help="a directory of reversed run*/ dirs")
    ap.add_argument("--csv", help="also write the table as CSV")
    a = ap.parse_args()
    if a.out:
        runs = runs_under(a.out)
        forward = [read_run(p, False) for p in runs if not os.path.exists(os.path.join(p, "swapped"))]
        reversed_ = [read_run(p, True) for p in runs if os.path.exists(os.path.join(p, "swapped"))]
    elif a.forward and a.reversed:
        forward = [read_run(p, False) for p in runs_under(a.forward)]
        reversed_ = [read_run(p, True) for p in runs_under(a.reversed)]
    else:
        sys.exit(__doc__)
    rows = combine(forward, reversed_)
    print(f"A/B both ways round: {len(forward)} forward, {len(reversed_)} reversed run(s); "
          f"time X / time Y (below 1: X faster), each orientation weighted equally\n")
    print("| shape | M | X / Y | forward | reversed | spread | X config | Y config |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['m']} | {r['x_over_y']:.4f} | {r['forward']:.4f} | {r['reversed']:.4f} | "
              f"{r['spread']:.3f} | {r['x_config']} | {r['y_config']} |")
    print(f"\nGeometric mean X / Y over {len(rows)} points: {geomean([r['x_over_y'] for r in rows]):.4f}; "
          f"placement spread (forward / reversed) {min(r['spread'] for r in rows):.3f}-{max(r['spread'] for r in rows):.3f}")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
