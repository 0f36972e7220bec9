#!/usr/bin/env python3
"""scripts/floor_table.py on a synthetic `fp8proj floor` CSV, launch manifest and Nsight Compute
CSV (both its raw page, units under the header, and its details page, one row per metric): every
profiled kernel lands on its launch (also when a launch was not profiled, as a GEMM routed to
cuBLASLt is not), units are converted (us, Mbyte), and the derived columns come back exactly."""
import csv
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOOL = os.path.join(HERE, "..", "..", "scripts", "floor_table.py")
FLOOR_FIELDS = ["label", "model", "gemm", "tp", "n", "k", "m", "weight_bytes", "copies", "calls_per_graph",
                "rotation_l2_ratio", "floor_us", "empty_eager_us", "empty_graph_us", "read_eager_us", "read_graph_us",
                "call_eager_us", "call_graph_us", "eager_gbps", "graph_gbps", "eager_floor_ratio", "graph_floor_ratio",
                "fixed_us", "k128_graph_us", "k128_copies", "config", "ctas", "sms_busy", "sm_count", "gate_path"]
# Two shapes x two M. Shape A: 1536 x 1536 (2.36 MB + scales), B: 3072 x 1536.
SHAPES = [("dsv3 A", 1536, 1536, 2368512, 0.5), ("dsv3 B", 3072, 1536, 4737024, 1.0)]
MS = [1, 16]


def write_floor(path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FLOOR_FIELDS)
        w.writeheader()
        for label, n, k, wb, floor in SHAPES:
            for m in MS:
                graph = 7.0 + m / 16
                w.writerow(dict(label=label, model="deepseek-v3", gemm="q_b_proj", tp=8, n=n, k=k, m=m,
                                weight_bytes=wb, copies=76, calls_per_graph=76, rotation_l2_ratio=3.0,
                                floor_us=floor, empty_eager_us=2.5, empty_graph_us=1.2, read_eager_us=3.5,
                                read_graph_us=2.0, call_eager_us=9.0, call_graph_us=graph, eager_gbps=1, graph_gbps=1,
                                eager_floor_ratio=9.0 / floor, graph_floor_ratio=graph / floor,
                                fixed_us=graph - floor, k128_graph_us=5.5, k128_copies=64,
                                config="swapab_m16n128_ws2_st11_sk4", ctas=n // 128 * 4, sms_busy=0, sm_count=132,
                                gate_path="fp8"))


def manifest():
    rows, seq = [], 0
    for label, n, k, _, _ in SHAPES:
        for role, kern, m, kk in [("read", "floor_read_kernel", 0, k), ("empty", "floor_empty_kernel", 0, k)]:
            rows.append(dict(seq=seq, label=label, n=n, k=kk, m=m, role=role, kernel=kern)); seq += 1
        for m in MS:
            for role, kern, kk in [("quant", "activation_quant", k), ("gemm", "sm90_fp8_gemm", k),
                                   ("quant_k128", "activation_quant", 128), ("gemm_k128", "sm90_fp8_gemm", 128)]:
                rows.append(dict(seq=seq, label=label, n=n, k=kk, m=m, role=role, kernel=kern)); seq += 1
    return rows


def kernel_name(kernel):
    return {"floor_read_kernel": "floor_read_kernel", "floor_empty_kernel": "floor_empty_kernel",
            "activation_quant": "activation_quant_kernel", "sm90_fp8_gemm": "sm90_fp8_gemm_swapab_kernel"}[kernel]


def profiled(rows):
    """The kernels ncu saw: all but shape B's M=16 GEMM (say it ran on cuBLASLt). Duration of each
    in us = 1 + seq / 10; DRAM bytes read in MB = 2 x seq; grid = 100 + seq."""
    out = []
    for r in rows:
        if r["label"] == "dsv3 B" and r["m"] == 16 and r["role"] == "gemm":
            continue
        out.append((r["seq"], kernel_name(r["kernel"]), 1 + r["seq"] / 10, 2.0 * r["seq"], 100 + r["seq"]))
    return out


def write_ncu_raw(path, kernels):
    with open(path, "w", newline="") as f:
        f.write("==PROF== Disconnected from process 1\n")
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(["ID", "Process ID", "Kernel Name", "gpu__time_duration.sum", "dram__bytes_read.sum",
                    "dram__throughput.avg.pct_of_peak_sustained_elapsed", "launch__grid_size"])
        w.writerow(["", "", "", "usecond", "Mbyte", "%", ""])
        for i, (_, name, t, mb, grid) in enumerate(kernels):
            w.writerow([i, 7, name, f"{t:.2f}", f"{mb:,.2f}", "50", grid])


def write_ncu_details(path, kernels):
    with open(path, "w", newline="") as f:
        w = csv.writer(f, quoting=csv.QUOTE_ALL)
        w.writerow(["ID", "Kernel Name", "Grid Size", "Block Size", "Section Name", "Metric Name", "Metric Unit",
                    "Metric Value"])
        for i, (_, name, t, mb, grid) in enumerate(kernels):
            w.writerow([i, name, f"({grid}, 1, 1)", "(384, 1, 1)", "Command line profiler metrics",
                        "gpu__time_duration.sum", "nsecond", f"{t * 1000:.0f}"])
            w.writerow([i, name, f"({grid}, 1, 1)", "(384, 1, 1)", "Command line profiler metrics",
                        "dram__bytes_read.sum", "byte", f"{mb * 1e6:.0f}"])


def main():
    bad = 0

    def check(what, ok, detail=""):
        nonlocal bad
        if not ok:
            print(f"FAIL {what} {detail}")
            bad += 1

    rows = manifest()
    kernels = profiled(rows)
    seq_of = {(r["n"], r["k"], r["m"], r["role"]): r["seq"] for r in rows}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {x: os.path.join(tmp, x) for x in ("floor.csv", "launches.csv", "raw.csv", "details.csv")}
        write_floor(paths["floor.csv"])
        with open(paths["launches.csv"], "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["seq", "label", "n", "k", "m", "role", "kernel"])
            w.writeheader()
            w.writerows(rows)
        write_ncu_raw(paths["raw.csv"], kernels)
        write_ncu_details(paths["details.csv"], kernels)
        for page in ("raw.csv", "details.csv"):
            md = os.path.join(tmp, page + ".md")
            res = subprocess.run([sys.executable, TOOL, "--floor", paths["floor.csv"], "--manifest",
                                  paths["launches.csv"], "--ncu", paths[page], "--md", md], capture_output=True,
                                 text=True)
            check(f"{page}: exit", res.returncode == 0, res.stderr)
            if res.returncode:
                continue
            check(f"{page}: no unpaired kernels", "warning" not in res.stderr, res.stderr)
            text = open(md).read()
            table_rows = [l for l in text.splitlines() if l.startswith("| 1 |") or l.startswith("| 16 |")]
            check(f"{page}: one table row per shape and M", len(table_rows) == 4, str(len(table_rows)))
            cells = [[c.strip() for c in l.strip("|").split("|")] for l in table_rows]
            for (label, n, k, wb, floor), m_rows in zip(SHAPES, (cells[0:2], cells[2:4])):
                for m, c in zip(MS, m_rows):
                    q, g, g128 = seq_of[(n, k, m, "quant")], seq_of[(n, k, m, "gemm")], seq_of[(n, 128, m, "gemm_k128")]
                    check(f"{page} {label} M={m}: quant us", c[6] == f"{1 + q / 10:.2f}", c[6])
                    if label == "dsv3 B" and m == 16:  # not profiled: empty, and the CTAs from the floor CSV
                        check(f"{page} {label} M={m}: unprofiled GEMM", c[7] == "-" and c[8] == "-", str(c))
                        check(f"{page} {label} M={m}: CTAs from the floor CSV", c[2] == str(n // 128 * 4), c[2])
                    else:
                        check(f"{page} {label} M={m}: GEMM us", c[7] == f"{1 + g / 10:.2f}", c[7])
                        # DRAM GB/s = bytes / ns: 2 x seq MB / (1 + seq/10) us.
                        check(f"{page} {label} M={m}: DRAM GB/s", c[8] == f"{2e6 * g / ((1 + g / 10) * 1e3):.0f}", c[8])
                        check(f"{page} {label} M={m}: CTAs", c[2] == str(100 + g), c[2])
                        check(f"{page} {label} M={m}: SMs busy", c[3] == str(min(100 + g, 132)), c[3])
                    check(f"{page} {label} M={m}: fixed", c[12] == f"{7.0 + m / 16 - floor:.2f}", c[12])
                    check(f"{page} {label} M={m}: graph/floor", c[11] == f"{(7.0 + m / 16) / floor:.2f}", c[11])
                    check(f"{page} {label} M={m}: K=128 GEMM us", c[14] == f"{1 + g128 / 10:.2f}", c[14])
            read_a = seq_of[(1536, 1536, 0, "read")]
            check(f"{page}: read kernel line", f"ncu {1 + read_a / 10:.2f} µs" in text, "")
        # Without the profiler's files the table still comes out, its ncu columns "-".
        res = subprocess.run([sys.executable, TOOL, "--floor", paths["floor.csv"]], capture_output=True, text=True)
        check("floor only: exit", res.returncode == 0, res.stderr)
        check("floor only: 4 rows", res.stdout.count("| swapab_m16n128_ws2_st11_sk4 |") == 4, res.stdout[-500:])
    print("ok" if not bad else f"{bad} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
