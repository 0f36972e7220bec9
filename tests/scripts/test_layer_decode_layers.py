#!/usr/bin/env python3
"""fp8proj layer --decode-layers N on the CPU reference: every decode row of the JSON and the CSV
carries the per-layer time of N layers' steps back to back (decode_layers = N, layers_off_us and
layers_on_us finite and > 0), every CSV row has the header's column count, the printed table is
there, and the flushed single-layer step is still reported and still bit-identical under policy
prefill; N outside 1..16 is refused.

Usage: test_layer_decode_layers.py FP8PROJ_BINARY
"""
import csv
import json
import math
import os
import subprocess
import sys
import tempfile

SEQS = [1, 2]
LAYERS = 3


def main():
    binary = os.path.abspath(sys.argv[1])
    bad = []

    def check(what, ok):
        if not ok:
            bad.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        out_json, out_csv = os.path.join(tmp, "layer.json"), os.path.join(tmp, "layer.csv")
        cmd = [binary, "layer", "--cpu", "--model", "deepseek-v2-lite", "--tp", "1", "--seqs", ",".join(map(str, SEQS)),
               "--seqlen", "16", "--reps", "1", "--no-prefill", "--policy", "prefill", "--decode-layers", str(LAYERS),
               "--json", out_json, "--csv", out_csv]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            print(p.stdout[-2000:], p.stderr[-2000:])
            return 1
        j = json.load(open(out_json))
        rows = list(csv.reader(open(out_csv)))
    decode = j.get("decode", [])
    check(f"{len(decode)} decode rows, expected {len(SEQS)}", len(decode) == len(SEQS))
    for r in decode:
        where = f"C={r.get('seqs')}"
        check(f"{where}: decode_layers {r.get('decode_layers')}", r.get("decode_layers") == LAYERS)
        for key in ("layers_off_us", "layers_on_us", "off_us", "on_us"):
            v = r.get(key)
            check(f"{where}: {key} = {v}", isinstance(v, (int, float)) and math.isfinite(v) and v > 0)
        check(f"{where}: flag-on step bit-identical under policy prefill", r.get("bit_identical") is True)
    head = rows[0]
    check(f"CSV header ends with the layer columns: {head[-3:]}", head[-3:] == ["decode_layers", "layers_off_us",
                                                                              "layers_on_us"])
    for r in rows[1:]:
        check(f"CSV row of {len(r)} columns, header {len(head)}", len(r) == len(head))
        if r and r[0] == "decode":
            check(f"CSV decode_layers {r[-3]}", r[-3] == str(LAYERS))
    check("the per-layer table is printed", f"decode step over {LAYERS} layers back to back, time per layer" in p.stdout)
    for n in ("0", "17"):
        q = subprocess.run([binary, "layer", "--cpu", "--decode-layers", n], capture_output=True, text=True, timeout=60)
        check(f"--decode-layers {n} refused (rc {q.returncode})", q.returncode != 0)
    for b in bad:
        print("FAIL:", b)
    print(f"{'FAILED' if bad else 'ok'}: {len(decode)} decode rows over {LAYERS} layers checked")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
