#!/usr/bin/env python3
"""fp8proj layer's stage tables on the CPU reference: every prefill and decode row of the JSON
carries per-stage times for both blocks, the decode rows the absorbed stages (absorb_q,
attention, absorb_v) and neither kv_b_proj nor kv_norm (decode_rope normalizes the latent), each time finite and >= 0; with one timed run per stage
the stages add up to the total (they are the differences between consecutive events); and the
printed decode-stage table has one flag-off and one flag-on line per C.

Usage: test_layer_stages.py FP8PROJ_BINARY
"""
import json
import math
import os
import subprocess
import sys
import tempfile

DECODE = ["qkv_a", "q_proj", "rope_cache", "absorb_q", "attention", "absorb_v", "o_proj"]
PREFILL = ["qkv_a", "q_proj", "kv_norm", "kv_b_proj", "rope_cache", "attention", "o_proj"]
SEQS = [1, 2]


def main():
    binary = os.path.abspath(sys.argv[1])
    bad = []

    def check(what, ok):
        if not ok:
            bad.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        out_json = os.path.join(tmp, "layer.json")
        p = subprocess.run([binary, "layer", "--cpu", "--model", "deepseek-v2-lite", "--tp", "1", "--seqs",
                            ",".join(map(str, SEQS)), "--seqlen", "32", "--reps", "1", "--json", out_json],
                           capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            print(p.stdout[-2000:], p.stderr[-2000:])
            return 1
        j = json.load(open(out_json))
    for kind, names, forbidden in (("prefill", PREFILL, ["absorb_q", "absorb_v"]), ("decode", DECODE, ["kv_b_proj", "kv_norm"])):
        rows = j.get(kind, [])
        check(f"{kind}: {len(rows)} rows, expected {len(SEQS)}", len(rows) == len(SEQS))
        for r in rows:
            for side in ("stages_off_us", "stages_on_us"):
                st = r.get(side)
                where = f"{kind} C={r.get('seqs')} {side}"
                if not isinstance(st, dict):
                    check(f"{where}: missing", False)
                    continue
                for name in names + ["total"]:
                    v = st.get(name)
                    check(f"{where}: {name} = {v}", isinstance(v, (int, float)) and math.isfinite(v) and v >= 0)
                for name in forbidden:
                    check(f"{where}: has {name}", name not in st)
                total = st.get("total", 0)
                parts = sum(v for k, v in st.items() if k != "total")
                check(f"{where}: stages add up to {parts:.1f}, total {total:.1f}",
                      total > 0 and abs(parts - total) <= 1e-3 * total + 0.01)
    lines = p.stdout.splitlines()
    try:
        at = next(i for i, l in enumerate(lines) if l.startswith("decode stages"))
    except StopIteration:
        at = None
    check("the decode-stage table is printed", at is not None)
    if at is not None:
        head = lines[at + 1].split()
        check(f"decode-stage header {head}", head[:2] == ["C", "flag"] and head[2:2 + len(DECODE)] == DECODE and
              head[-1] == "total")
        body = [l.split() for l in lines[at + 2:at + 2 + 2 * len(SEQS)]]
        flags = [(int(b[0]), b[1]) for b in body if b]
        check(f"decode-stage lines {flags}", flags == [(c, f) for c in SEQS for f in ("off", "on")])
    for b in bad:
        print("FAIL:", b)
    print(f"{'FAILED' if bad else 'ok'}: {len(SEQS)} prefill and {len(SEQS)} decode rows checked")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
