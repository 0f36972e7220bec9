#!/usr/bin/env python3
"""Where each microsecond of a small-M FP8 GEMM goes: one markdown table per shape and M, joining
`fp8proj floor --csv` (event-timed: the call eager and in graph replay, the empty kernel, the
weight read, the weight-byte floor) with Nsight Compute's per-kernel rows of
`fp8proj floor --launch-once` (kernel durations, DRAM bytes and bandwidth, CTAs).

  python3 scripts/floor_table.py --floor floor.csv --manifest launches.csv --ncu ncu.csv [--md FILE]

--floor     `fp8proj floor --csv` (one row per shape and M)
--manifest  `fp8proj floor --launch-once --csv` (the launches in order, with the kernel each runs)
--ncu       `ncu --import REPORT --csv --page raw` (one row per kernel, a units row under the
            header) or `--page details` (one row per kernel and metric); kernels the profiler
            did not match (a GEMM routed to cuBLASLt) leave their manifest entries empty.
Without --ncu (or --manifest) the profiler's columns are "-". docs/decode.md says how to read it.
"""
import argparse
import csv
import math
import re
import sys

TIME_NS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9, "s": 1e9}
BYTES = {"byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12, "kibyte": 1024.0,
         "mibyte": 1024.0**2, "gibyte": 1024.0**3}
METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
           "launch__grid_size", "launch__block_size", "sm__cycles_active.avg",
           "sm__throughput.avg.pct_of_peak_sustained_elapsed")


def number(text):
    return float(str(text).replace(",", "").strip())


def in_base(metric, value, unit):
    """The value in ns (times) or bytes (sizes); other metrics as given."""
    u = (unit or "").strip().lower()
    if metric == "gpu__time_duration.sum":
        return value * TIME_NS.get(u, 1.0)
    if metric == "dram__bytes_read.sum":
        return value * BYTES.get(u, 1.0)
    return value


def read_ncu(path):
    """Kernels in launch order: [{"id", "name", metric: value in base units}]."""
    rows = list(csv.reader(open(path, newline="")))
    # ncu may print "==PROF==" lines before the CSV: the header is the first row naming "ID".
    start = next((i for i, r in enumerate(rows) if r and r[0].strip() == "ID"), None)
    if start is None:
        raise SystemExit(f"{path}: no ncu CSV header (a row starting with \"ID\")")
    head = [h.strip() for h in rows[start]]
    col = {h: i for i, h in enumerate(head)}
    kernels = {}
    if "Metric Name" in col:  # --page details: one row per kernel and metric
        for r in rows[start + 1:]:
            if len(r) < len(head) or not r[col["ID"]].strip().isdigit():
                continue
            k = kernels.setdefault(int(r[col["ID"]]), {"id": int(r[col["ID"]]), "name": r[col["Kernel Name"]]})
            metric = r[col["Metric Name"]].strip()
            try:
                k[metric] = in_base(metric, number(r[col["Metric Value"]]), r[col.get("Metric Unit", -1)]
                                    if "Metric Unit" in col else "")
            except ValueError:
                pass
            for extra in ("Grid Size", "Block Size"):
                if extra in col:
                    k.setdefault(extra, r[col[extra]])
    else:  # --page raw: one row per kernel, the units in the row under the header
        units = {}
        body = rows[start + 1:]
        if body and not body[0][col["ID"]].strip().isdigit():
            units = {h: body[0][i] for i, h in enumerate(head) if i < len(body[0])}
            body = body[1:]
        for r in body:
            if len(r) < len(head) or not r[col["ID"]].strip().isdigit():
                continue
            k = {"id": int(r[col["ID"]]), "name": r[col["Kernel Name"]]}
            for metric in METRICS:
                if metric in col:
                    try:
                        k[metric] = in_base(metric, number(r[col[metric]]), units.get(metric, ""))
                    except ValueError:
                        pass
            kernels[k["id"]] = k
    return [kernels[i] for i in sorted(kernels)]


def pair(manifest, kernels):
    """Manifest entries -> the profiler's kernel of each: walk both in order; a kernel is the next
    launch whose expected name it contains (the profiler sees only the kernels it matched, so its
    rows are a subsequence of the manifest). Returns {(label-free key): kernel} keyed by
    (n, k, m, role), and the count of kernels left unpaired."""
    out, j = {}, 0
    for e in manifest:
        if j < len(kernels) and e["kernel"] in kernels[j]["name"]:
            out[(int(e["n"]), int(e["k"]), int(e["m"]), e["role"])] = kernels[j]
            j += 1
    return out, len(kernels) - j


def fmt(v, digits=2):
    if v is None or (isinstance(v, float) and (math.isnan(v) or v <= 0)):
        return "-"
    return f"{v:.{digits}f}"


def us(kernel):
    return kernel["gpu__time_duration.sum"] / 1e3 if kernel and "gpu__time_duration.sum" in kernel else None


def dram_gbps(kernel):
    if not kernel or "dram__bytes_read.sum" not in kernel or not kernel.get("gpu__time_duration.sum"):
        return None
    return kernel["dram__bytes_read.sum"] / kernel["gpu__time_duration.sum"]  # B/ns = GB/s


def grid(kernel):
    if not kernel:
        return None
    if "launch__grid_size" in kernel:
        return int(kernel["launch__grid_size"])
    m = re.match(r"\(?\s*(\d+)", str(kernel.get("Grid Size", "")))
    return int(m.group(1)) if m else None


def table(floor_rows, paired):
    lines = []
    shapes = []
    for r in floor_rows:
        key = (r["label"], int(r["n"]), int(r["k"]))
        if key not in shapes:
            shapes.append(key)
    for label, n, k in shapes:
        rows = [r for r in floor_rows if (r["label"], int(r["n"]), int(r["k"])) == (label, n, k)]
        r0 = rows[0]
        wb = float(r0["weight_bytes"])
        floor_us = float(r0["floor_us"])
        read_k = paired.get((n, k, 0, "read"))
        empty_k = paired.get((n, k, 0, "empty"))
        lines.append(f"\n### {label} ({n}x{k}), FP8 weight {wb / 1e6:.2f} MB\n")
        lines.append(
            f"Weight-byte floor {floor_us:.2f} µs ({wb / floor_us / 1e3:.0f} GB/s measured read bandwidth); "
            f"weight read kernel: eager {float(r0['read_eager_us']):.2f} µs, graph {float(r0['read_graph_us']):.2f} µs"
            f", ncu {fmt(us(read_k))} µs at {fmt(dram_gbps(read_k), 0)} GB/s DRAM; empty kernel: eager "
            f"{float(r0['empty_eager_us']):.2f} µs, graph {float(r0['empty_graph_us']):.2f} µs, ncu "
            f"{fmt(us(empty_k))} µs. Rotation: {r0['copies']} copies ({float(r0['rotation_l2_ratio']):.1f} x L2).\n")
        lines.append("| M | config | CTAs | SMs busy | eager call µs | graph call µs | ncu quant µs | ncu GEMM µs | "
                     "GEMM DRAM GB/s | DRAM % peak | floor µs | graph / floor | fixed µs | K=128 graph µs | "
                     "K=128 ncu GEMM µs |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            m = int(r["m"])
            q, g = paired.get((n, k, m, "quant")), paired.get((n, k, m, "gemm"))
            g128 = paired.get((n, 128, m, "gemm_k128"))
            ctas = grid(g) or (int(r["ctas"]) if r["ctas"] not in ("", "0") else None)
            pct = g.get("dram__throughput.avg.pct_of_peak_sustained_elapsed") if g else None
            lines.append(
                f"| {m} | {r['config'] or '-'} | {ctas or '-'} | {min(ctas, int(r['sm_count'])) if ctas else '-'} | "
                f"{float(r['call_eager_us']):.2f} | {float(r['call_graph_us']):.2f} | {fmt(us(q))} | {fmt(us(g))} | "
                f"{fmt(dram_gbps(g), 0)} | {fmt(pct, 0)} | {floor_us:.2f} | {float(r['graph_floor_ratio']):.2f} | "
                f"{float(r['fixed_us']):.2f} | {fmt(float(r['k128_graph_us']))} | {fmt(us(g128))} |")
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--floor", required=True)
    ap.add_argument("--manifest")
    ap.add_argument("--ncu")
    ap.add_argument("--md", help="write the markdown here (default: stdout)")
    a = ap.parse_args(argv)
    floor_rows = list(csv.DictReader(open(a.floor, newline="")))
    if not floor_rows:
        raise SystemExit(f"{a.floor}: no rows")
    paired, unpaired = {}, 0
    if a.ncu and a.manifest:
        manifest = list(csv.DictReader(open(a.manifest, newline="")))
        kernels = read_ncu(a.ncu)
        paired, unpaired = pair(manifest, kernels)
        if unpaired:
            print(f"warning: {unpaired} of {len(kernels)} profiled kernels matched no launch of the manifest",
                  file=sys.stderr)
    out = ["# Where each microsecond goes: small-M FP8 GEMM", "",
           "Event-timed (`fp8proj floor`): the call (activation quantization + GEMM) eager with L2 flushed, and in "
           "CUDA-graph replay over weight copies that L2 cannot hold; floor = FP8 weight bytes / measured read "
           "bandwidth; fixed = graph call - floor; K=128 = the same GEMM at K = 128 in graph replay (prologue + "
           "epilogue estimate). ncu columns: Nsight Compute over `fp8proj floor --launch-once` (one launch per "
           "kernel, caches flushed before each, clocks not locked)."]
    if a.ncu and a.manifest:
        out.append(f"\n{len(paired)} launches paired with profiled kernels ({unpaired} profiled kernels unpaired).")
    out += table(floor_rows, paired)
    text = "\n".join(out) + "\n"
    if a.md:
        open(a.md, "w").write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
