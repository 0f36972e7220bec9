#!/usr/bin/env python3
"""scripts/ab_both_ways.py on synthetic comparison runs whose two sides carry a known code
ratio and a known placement bias: the bias must cancel, the code ratio must come back, and
the two input layouts (marker files, two directories) must agree."""
import csv
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "..", "scripts", "ab_both_ways.py")
FIELDS = ["shape", "n", "k", "m", "ours_us", "b_us", "ours_config", "b_config"]
# Per point: X's time, the code ratio t_X / t_Y, the placement factor of whichever library
# sits in the --lib-b position.
POINTS = [("S1", 4096, 2048, 16, 10.0, 0.95, 1.03), ("S1", 4096, 2048, 64, 12.0, 1.00, 0.97),
          ("S2", 7168, 16384, 16, 40.0, 1.02, 1.00)]


def write_run(d, reversed_run, noise):
    os.makedirs(d)
    with open(os.path.join(d, "compare_deepgemm.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for shape, n, k, m, t_x, code, bias in POINTS:
            t_y = t_x / code
            a, b, ca, cb = (t_y, t_x * bias, "Y", "X") if reversed_run else (t_x, t_y * bias, "X", "Y")
            w.writerow(dict(shape=shape, n=n, k=k, m=m, ours_us=a * noise, b_us=b * noise, ours_config=ca, b_config=cb))
    if reversed_run:
        open(os.path.join(d, "swapped"), "w").close()


def run(args, csv_path):
    subprocess.run([sys.executable, TOOL, *args, "--csv", csv_path], check=True, stdout=subprocess.DEVNULL)
    return {(r["shape"], int(r["m"])): r for r in csv.DictReader(open(csv_path))}


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for i, (rev, noise) in enumerate([(False, 1.0), (True, 1.01), (False, 0.99), (True, 1.0)]):
            write_run(os.path.join(tmp, "mixed", f"run{i + 1}"), rev, noise)
            write_run(os.path.join(tmp, "rev" if rev else "fwd", f"run{i + 1}"), rev, noise)
        a = run([os.path.join(tmp, "mixed")], os.path.join(tmp, "a.csv"))
        b = run(["--forward", os.path.join(tmp, "fwd"), "--reversed", os.path.join(tmp, "rev")],
                os.path.join(tmp, "b.csv"))
        bad = 0
        for shape, n, k, m, t_x, code, bias in POINTS:
            for name, rows in (("marker layout", a), ("two directories", b)):
                r = rows[(shape, m)]
                got, spread = float(r["x_over_y"]), float(r["spread"])
                # forward reads code / bias, reversed code * bias: the bias cancels, and the
                # spread is 1 / bias^2.
                if abs(got - code) > 1e-9 or abs(spread - 1 / bias**2) > 1e-9 or r["x_config"] != "X":
                    print(f"FAIL {name} {shape} M={m}: x_over_y {got} (want {code}), spread {spread} "
                          f"(want {1 / bias**2}), x_config {r['x_config']}")
                    bad += 1
        # One-way input is refused, not silently combined.
        one_way = subprocess.run([sys.executable, TOOL, os.path.join(tmp, "fwd")], capture_output=True, text=True)
        if one_way.returncode == 0 or "both ways" not in one_way.stderr:
            print(f"FAIL a one-way A/B was accepted: rc {one_way.returncode}, {one_way.stderr.strip()}")
            bad += 1
    print("ok" if bad == 0 else f"{bad} failure(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
