#!/usr/bin/env python3
"""Add the rows of one tuned table to another: rows of NEW replace BASE's rows of the same
(N, K), the others are appended. Both tables must be for the same GPU (gpu_name, sm_count);
the result keeps BASE's stamp with NEW's library version noted beside it.

  merge_tuned.py BASE.json NEW.json -o OUT.json
"""
import argparse
import json
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    base, new = (json.load(open(p)) for p in (a.base, a.new))
    for key in ("format",):
        if base.get(key) != new.get(key):
            sys.exit(f"merge_tuned: {key} differs: {base.get(key)!r} vs {new.get(key)!r}")
    for key in ("gpu_name", "sm_count"):
        if base["stamp"].get(key) != new["stamp"].get(key):
            sys.exit(f"merge_tuned: stamp.{key} differs: {base['stamp'].get(key)!r} vs {new['stamp'].get(key)!r}")
    rows = {(r["n"], r["k"]): r for r in new["shapes"]}
    merged = [rows.pop((r["n"], r["k"]), r) for r in base["shapes"]]
    added = sorted(rows.values(), key=lambda r: (r["n"], r["k"]))
    merged += added
    out = dict(base, shapes=merged)
    out["stamp"] = dict(base["stamp"])
    out["stamp"]["fp8proj_version"] = (f"{base['stamp']['fp8proj_version']}; rows "
                                       + ", ".join(f"{r['n']}x{r['k']}" for r in new["shapes"])
                                       + f" from {new['stamp']['fp8proj_version']}")
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"merge_tuned: {len(base['shapes'])} base rows, {len(new['shapes'])} new "
          f"({len(new['shapes']) - len(added)} replaced, {len(added)} added) -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
