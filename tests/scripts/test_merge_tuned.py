#!/usr/bin/env python3
"""scripts/merge_tuned.py: rows of NEW replace BASE's rows of the same N x K and the others are
appended; the base rows and their buckets stay as they were; a table for another GPU is
refused; the merged table still loads in the C++ parser (fp8proj tune --from)."""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "..", "scripts", "merge_tuned.py")
STAMP = {"cublaslt": "13.1.0", "cuda_runtime": "13.0", "driver": "13.0", "fp8proj_version": "base",
         "gpu_name": "NVIDIA H200", "sm_count": 132}


def row(n, k, threshold, tag):
    return {"n": n, "k": k, "threshold": threshold,
            "buckets": [{"m_lo": 1, "m_hi": 16, "bf16_us": 10.0, "fp8_us": 8.0, "fp8_backend": "sm90_fp8_block",
                         "fp8_config": tag}]}


def table(rows, version):
    return {"format": "fp8proj-tune/1", "stamp": dict(STAMP, fp8proj_version=version), "shapes": rows}


def merge(tmp, base, new):
    return merge_args(tmp, base, new, [])


def merge_args(tmp, base, new, extra):
    paths = []
    for name, t in (("base.json", base), ("new.json", new)):
        p = os.path.join(tmp, name)
        with open(p, "w") as f:
            json.dump(t, f)
        paths.append(p)
    out = os.path.join(tmp, "out.json")
    r = subprocess.run([sys.executable, TOOL, *paths, "-o", out, *extra], capture_output=True, text=True)
    return r, out


def main() -> int:
    fp8proj = sys.argv[1] if len(sys.argv) > 1 else None
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        base = table([row(16384, 2048, 0, "m128n128_ws2_st5"), row(6144, 16384, 140, "m64n64_ws1_st12")], "base")
        new = table([row(6144, 16384, 0, "m128n192_ws2_st4"), row(2624, 6144, 77, "m64n64_ws1_st12")], "new")
        r, out = merge(tmp, base, new)
        if r.returncode != 0:
            failures.append(f"merge failed: {r.stderr}")
        else:
            got = json.load(open(out))
            shapes = [(s["n"], s["k"], s["threshold"], s["buckets"][0]["fp8_config"]) for s in got["shapes"]]
            want = [(16384, 2048, 0, "m128n128_ws2_st5"), (6144, 16384, 0, "m128n192_ws2_st4"),
                    (2624, 6144, 77, "m64n64_ws1_st12")]
            if shapes != want:
                failures.append(f"rows {shapes}, expected {want}")
            if got["stamp"]["gpu_name"] != "NVIDIA H200" or "new" not in got["stamp"]["fp8proj_version"]:
                failures.append(f"stamp {got['stamp']}")
            if fp8proj:
                c = subprocess.run([fp8proj, "tune", "--from", out, "--md", os.path.join(tmp, "out.md")],
                                   capture_output=True, text=True)
                if c.returncode != 0:
                    failures.append(f"fp8proj tune --from the merged table failed: {c.stdout}{c.stderr}")
        # --buckets-up-to: BASE's row keeps its threshold and its buckets above M.
        two = dict(row(6144, 16384, 140, "m64n64_ws1_st12"))
        two["buckets"] = two["buckets"] + [dict(two["buckets"][0], m_lo=17, m_hi=64, fp8_config="m64n128_ws1_st8")]
        base2 = table([two], "base")
        low = row(6144, 16384, 0, "swapab_m16n64_ws2_st14_sk3")
        low["buckets"] = [dict(low["buckets"][0], m_hi=4), dict(low["buckets"][0], m_lo=5, fp8_config="swapab_m16n64_ws2_st14")]
        r, out = merge_args(tmp, base2, table([low], "new"), ["--buckets-up-to", "16"])
        if r.returncode != 0:
            failures.append(f"--buckets-up-to merge failed: {r.stderr}")
        else:
            got = json.load(open(out))["shapes"][0]
            want = [(1, 4, "swapab_m16n64_ws2_st14_sk3"), (5, 16, "swapab_m16n64_ws2_st14"), (17, 64, "m64n128_ws1_st8")]
            if [(b["m_lo"], b["m_hi"], b["fp8_config"]) for b in got["buckets"]] != want or got["threshold"] != 140:
                failures.append(f"--buckets-up-to row {got}")
        gap = row(6144, 16384, 0, "x")
        gap["buckets"] = [dict(gap["buckets"][0], m_lo=2)]
        r, _ = merge_args(tmp, base2, table([gap], "new"), ["--buckets-up-to", "16"])
        if r.returncode == 0 or "cover" not in r.stderr:
            failures.append(f"buckets not covering 1..16 were not refused: {r.returncode} {r.stderr}")
        r, _ = merge_args(tmp, base2, table([row(2624, 6144, 0, "x")], "new"), ["--buckets-up-to", "16"])
        if r.returncode == 0 or "no row" not in r.stderr:
            failures.append(f"a row BASE lacks was not refused: {r.returncode} {r.stderr}")
        r, _ = merge_args(tmp, base2, table([low], "new"), ["--buckets-up-to", "8"])
        if r.returncode == 0:
            failures.append("--buckets-up-to 8 with NEW's buckets reaching 16 was not refused")
        other = table([row(2624, 6144, 77, "x")], "new")
        other["stamp"]["gpu_name"] = "NVIDIA B200"
        r, _ = merge(tmp, base, other)
        if r.returncode == 0 or "gpu_name" not in r.stderr:
            failures.append(f"a table for another GPU was not refused: rc {r.returncode}, {r.stderr}")
    for f in failures:
        print("FAIL", f)
    print("ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
