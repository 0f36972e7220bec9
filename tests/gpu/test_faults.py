#!/usr/bin/env python3
"""The layer and the C ABI on a GPU under tuned-table faults (docs/robustness.md): a corrupt
table, one without a stamp, a directory, a FIFO, a missing file, a table stamped for another
GPU, and an unsupported GPU (on an sm_90 GPU the layer probe reports itself as sm_80;
the C ABI probe needs a real non-sm_90 GPU). Each scenario runs the probe in
a fresh process and must work with the defaults and exactly one log line about the table.

Usage: test_faults.py FAULT_PROBE_LAYER FAULT_PROBE_CAPI
Exit 77 (skipped) when the probes skip (no sm_90 GPU), with their reason.
"""
import json
import os
import subprocess
import sys
import tempfile

STAMP = {"gpu_name": "NVIDIA B200", "sm_count": 148, "driver": "", "cuda_runtime": "", "cublaslt": "",
         "fp8proj_version": ""}


def scenarios(tmp):
    def write(name, text):
        p = os.path.join(tmp, name)
        with open(p, "w") as f:
            f.write(text)
        return p
    fifo = os.path.join(tmp, "fifo.json")
    os.mkfifo(fifo)
    return [
        ("corrupt", write("corrupt.json", '{"format": "fp8proj-tune/1", "stamp": '), "not valid JSON"),
        ("missing_stamp", write("nostamp.json", '{"format": "fp8proj-tune/1", "shapes": []}'), "missing field 'stamp'"),
        ("wrong_types", write("types.json", json.dumps({"format": "fp8proj-tune/1", "stamp": dict(STAMP, sm_count=True),
                                                         "shapes": []})), "sm_count"),
        ("directory", tmp, "not a regular file"),
        ("fifo", fifo, "named pipe"),
        ("missing", os.path.join(tmp, "absent.json"), "cannot open"),
        ("other_gpu", write("b200.json", json.dumps({"format": "fp8proj-tune/1", "stamp": STAMP, "shapes": []})),
         "NVIDIA B200"),
    ]


def run(probe, env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("FP8PROJ_")}
    e.update(env)
    p = subprocess.run([probe], env=e, capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def main():
    probes = sys.argv[1:3]
    failures, skipped, ran = [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        cases = [(name, {"FP8PROJ_TUNE_FILE": path}, why) for name, path, why in scenarios(tmp)]
        cases.append(("unsupported_gpu", {"FAULT_PROBE_EXPECT_UNSUPPORTED": "1"}, None))
        for probe in probes:
            for name, env, why in cases:
                rc, out, err = run(probe, env)
                label = f"{os.path.basename(probe)}/{name}"
                if rc == 77:
                    skipped.append(f"{label}: {out.strip()}")
                    continue
                ran += 1
                table_lines = [l for l in err.splitlines() if "tuned table" in l or "using defaults" in l]
                problems = []
                if rc != 0:
                    problems.append(f"exit {rc}")
                if why is not None and (len(table_lines) != 1 or why not in table_lines[0]):
                    problems.append(f"{len(table_lines)} table log lines (expected one naming {why!r})")
                if "probe ok" not in out:
                    problems.append("no 'probe ok'")
                print(f"{'ok  ' if not problems else 'FAIL'} {label:<40} {out.strip()[:160]}")
                for l in table_lines:
                    print(f"       log: {l[:200]}")
                if problems:
                    failures.append(f"{label}: {'; '.join(problems)}\n{out}\n{err}")
    for s in skipped:
        print("SKIPPED", s)
    for f in failures:
        print("FAIL", f)
    if ran == 0:
        return 77
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
