#!/usr/bin/env python3
"""Compare harness logs written by scripts/ab.sh: per problem, the best time over all
configurations (min over rounds of each configuration's median), for each build, and the
ratio to the first build.

  python3 scripts/ab_compare.py DIR [--base BUILD] [--config NAME]
"""
import collections
import glob
import math
import os
import re
import sys

LINE = re.compile(r"^M=(\d+)\s+N=(\d+)\s+K=(\d+)\s+(\S+)\s+\*?\s*err=\S+ det=(\S+)\s+([\d.]+) us")


def load(path):
    out = {}
    for line in open(path, errors="replace"):
        m = LINE.match(line)
        if m:
            key = (int(m[1]), int(m[2]), int(m[3]))
            out.setdefault(key, {})[m[4]] = float(m[6])
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    d = sys.argv[1]
    opts = dict(zip(sys.argv[2::2], sys.argv[3::2]))
    only = opts.get("--config")
    runs = collections.defaultdict(list)  # build -> [parsed round]
    for f in sorted(glob.glob(os.path.join(d, "*.r*.log"))):
        build = os.path.basename(f).rsplit(".r", 1)[0]
        runs[build].append(load(f))
    builds = sorted(runs, key=lambda b: b != opts.get("--base", "prev"))
    best = {}  # build -> problem -> (us, config)
    for b in builds:
        merged = collections.defaultdict(dict)
        for r in runs[b]:
            for p, cfgs in r.items():
                for c, us in cfgs.items():
                    if only and c != only:
                        continue
                    merged[p][c] = min(us, merged[p].get(c, math.inf))
        best[b] = {p: min((us, c) for c, us in cfgs.items()) for p, cfgs in merged.items() if cfgs}
    problems = sorted(set.intersection(*(set(best[b]) for b in builds)), key=lambda p: (p[1], p[2], p[0]))
    print("problem".ljust(24) + "".join(f"{b:>34}" for b in builds))
    logs = collections.defaultdict(float)
    for p in problems:
        base = best[builds[0]][p][0]
        cells = []
        for b in builds:
            us, c = best[b][p]
            cells.append(f"{us:9.2f} {base / us:5.3f} {c[:18]:>18}")
            logs[b] += math.log(base / us)
        print(f"M={p[0]:<6} {p[1]}x{p[2]:<10}".ljust(24) + "".join(f"{x:>34}" for x in cells))
    print("geo-mean speedup vs " + builds[0] + ": " +
          ", ".join(f"{b} {math.exp(logs[b] / len(problems)):.4f}" for b in builds))


if __name__ == "__main__":
    main()
