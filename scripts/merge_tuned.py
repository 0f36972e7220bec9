#!/usr/bin/env python3
"""Add the rows of one tuned table to another: rows of NEW replace BASE's rows of the same
(N, K), the others are appended. Both tables must be for the same GPU (gpu_name, sm_count);
the result keeps BASE's stamp with NEW's library version noted beside it.

  merge_tuned.py BASE.json NEW.json -o OUT.json
  merge_tuned.py BASE.json NEW.json -o OUT.json --buckets-up-to 16

--buckets-up-to M takes only NEW's buckets at M <= M (a table tuned with `fp8proj tune --max-m M`):
for each of NEW's rows, BASE's row of the same N x K keeps its threshold and its buckets above M,
and its buckets up to M are replaced by NEW's. BASE must have a bucket ending at M and NEW's
buckets must cover exactly 1..M; rows BASE lacks are refused (a row needs all its buckets).
"""
import argparse
import json
import sys


def low_buckets(base: dict, new_row: dict, up_to: int) -> dict:
    """BASE's row of new_row's N x K with its buckets at M <= up_to replaced by new_row's."""
    key = (new_row["n"], new_row["k"])
    old = next((r for r in base["shapes"] if (r["n"], r["k"]) == key), None)
    if old is None:
        sys.exit(f"merge_tuned: --buckets-up-to {up_to}: BASE has no row {key[0]}x{key[1]} to take buckets into")
    low = sorted(new_row["buckets"], key=lambda b: b["m_lo"])
    edges = [(b["m_lo"], b["m_hi"]) for b in low]
    covers = low and low[0]["m_lo"] == 1 and low[-1]["m_hi"] == up_to and all(
        edges[i][1] + 1 == edges[i + 1][0] for i in range(len(edges) - 1))
    if not covers:
        sys.exit(f"merge_tuned: NEW's buckets of {key[0]}x{key[1]} {edges} do not cover exactly 1..{up_to}")
    if not any(b["m_hi"] == up_to for b in old["buckets"]):
        sys.exit(f"merge_tuned: BASE's row {key[0]}x{key[1]} has no bucket ending at {up_to}: "
                 f"{[(b['m_lo'], b['m_hi']) for b in old['buckets']]}")
    return dict(old, buckets=low + [b for b in old["buckets"] if b["m_lo"] > up_to])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--buckets-up-to", type=int, default=0, metavar="M",
                    help="replace only the buckets at M <= this in BASE's rows (see above)")
    a = ap.parse_args()
    base, new = (json.load(open(p)) for p in (a.base, a.new))
    for key in ("format",):
        if base.get(key) != new.get(key):
            sys.exit(f"merge_tuned: {key} differs: {base.get(key)!r} vs {new.get(key)!r}")
    for key in ("gpu_name", "sm_count"):
        if base["stamp"].get(key) != new["stamp"].get(key):
            sys.exit(f"merge_tuned: stamp.{key} differs: {base['stamp'].get(key)!r} vs {new['stamp'].get(key)!r}")
    rows = {(r["n"], r["k"]): r for r in new["shapes"]}
    if a.buckets_up_to > 0:
        rows = {key: low_buckets(base, r, a.buckets_up_to) for key, r in rows.items()}
    merged = [rows.pop((r["n"], r["k"]), r) for r in base["shapes"]]
    added = sorted(rows.values(), key=lambda r: (r["n"], r["k"]))
    merged += added
    out = dict(base, shapes=merged)
    out["stamp"] = dict(base["stamp"])
    what = f"buckets 1-{a.buckets_up_to} of rows " if a.buckets_up_to > 0 else "rows "
    out["stamp"]["fp8proj_version"] = (f"{base['stamp']['fp8proj_version']}; {what}"
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
