#!/usr/bin/env python3
"""`fp8proj soak` can fail (docs/robustness.md, "The soak"): on the CPU reference, an output the
soak corrupts on purpose after the calls (--inject-fault guard|value|unwritten, a test seam in
its own check path) must end the run with status 1, the seed, the iteration and the replay
command; that command must reproduce the failure alone; and the same run without the seam passes.
Also: the same seed draws the same work twice, and bad options are refused before any work.

Usage: test_soak.py FP8PROJ_BINARY
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

SEED, ITER = 7, 17
BASE = ["soak", "--cpu", "--iterations", "40", "--seed", str(SEED), "--m", "33"]


def run(binary, args, timeout=120):
    p = subprocess.run([binary] + args, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def main():
    binary = sys.argv[1]
    failures = []

    def expect(cond, what, out=""):
        if not cond:
            failures.append(what)
            print(f"FAIL {what}\n{out[-3000:]}")
        else:
            print(f"ok   {what}")

    rc, out = run(binary, BASE)
    expect(rc == 0 and "0 failures, 0 guard writes, 0 wrong outputs" in out, "the run without the seam passes", out)

    checks = {"guard": "guard region written: 0 bytes before the output, 1 after it",
              "value": "wrong values: relative Frobenius error",
              "unwritten": "never written"}
    for kind, text in checks.items():
        with tempfile.TemporaryDirectory() as tmp:
            report = os.path.join(tmp, "soak.json")
            rc, out = run(binary, BASE + ["--inject-fault", f"{kind}:{ITER}", "--json", report])
            expect(rc == 1, f"{kind}: exit status 1", out)
            expect(f"FAILED at seed {SEED} iteration {ITER}" in out and text in out,
                   f"{kind}: the seed, the iteration and the problem are printed", out)
            m = re.search(r"replay this iteration alone: (fp8proj soak --replay \S+.*)", out)
            expect(m is not None and f"--replay {SEED}:{ITER}" in m.group(1), f"{kind}: the replay command", out)
            with open(report) as f:
                j = json.load(f)
            r = j["failure_reports"][0] if j.get("failure_reports") else {}
            expect(j.get("failures") == 1 and r.get("seed") == SEED and r.get("iteration") == ITER
                   and r.get("launch_count", 0) > 0 and r.get("last_launches"),
                   f"{kind}: the JSON report names the failing iteration and the launches", json.dumps(j)[:3000])
            if m:
                argv = shlex.split(m.group(1))[1:]  # drop the program name
                rc2, out2 = run(binary, argv)
                expect(rc2 == 1 and text in out2 and f"seed {SEED} iteration {ITER}: FAILED" in out2,
                       f"{kind}: --replay reproduces the failure alone", out2)

    # The same seed draws the same work (the per-iteration log is the draw and its verdict).
    with tempfile.TemporaryDirectory() as tmp:
        logs = []
        for i in range(2):
            path = os.path.join(tmp, f"run{i}.log")
            rc, out = run(binary, ["soak", "--cpu", "--iterations", "60", "--seed", "11", "--log", path])
            expect(rc == 0, f"seeded run {i} passes", out)
            with open(path) as f:
                logs.append(f.read())
        expect(logs[0] == logs[1] and logs[0].count("\n") == 60, "the same seed draws the same 60 iterations")

    # Refused before any work, naming the option.
    for args, text in [(["soak", "--cpu"], "--minutes or --iterations"),
                       (["soak", "--cpu", "--minutes", "0"], "--minutes"),
                       (["soak", "--cpu", "--minutes", "nan"], "--minutes"),
                       (["soak", "--cpu", "--iterations", "5", "--seed", "-1"], "--seed"),
                       (["soak", "--cpu", "--iterations", "5", "--seed", "18446744073709551616"], "--seed"),
                       (["soak", "--cpu", "--iterations", "5", "--shapes", "100x100"], "not a multiple of 128"),
                       (["soak", "--cpu", "--iterations", "5", "--paths", "fp9"], "--paths"),
                       # the MLA block's iterations are the GPU's (the host block is their reference)
                       (["soak", "--cpu", "--iterations", "5", "--paths", "mla"], "nothing left to run"),
                       (["soak", "--cpu", "--iterations", "5", "--m", "100000"], "65536"),
                       (["soak", "--cpu", "--iterations", "5", "--configs", "m128n192_ws2_st4"], "sm_90"),
                       (["soak", "--cpu", "--replay", "7"], "SEED:ITERATION"),
                       (["soak", "--cpu", "--replay", "7:3", "--iterations", "5"], "one iteration"),
                       (["soak", "--cpu", "--iterations", "5", "--inject-fault", "bogus:1"], "--inject-fault")]:
        rc, out = run(binary, args)
        expect(rc != 0 and text in out and "launches (" not in out, f"refused: {' '.join(args[1:])}", out)

    print(f"\n{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
