#!/usr/bin/env python3
"""compute-sanitizer over every GPU kernel configuration, one configuration at a time.

For each configuration of the sm90 GEMM family (`sm90_fp8_gemm_harness --list-configs`) and each
tool, one harness process forces that configuration (`--config`) on problems chosen for it: a
full last tile, a partial last tile in M together with an N tail (N = 2624: a partial last
128-row weight block), K = 512; the kernels compiled for one K also at K = 1536 / 2048 / 4096;
2-CTA clusters with an odd tile count (a spare tile); the carrying (_c) kernels with >= 2 tiles
per CTA; the swap-AB kernels with split-K. The other kernels (quantizers, attention, MLA
helpers) run through their GPU tests, one filter per family. Every row ends in the tool's own
summary line and the program's verdict; the matrix is written as CSV and markdown.

    python3 scripts/sanitize_matrix.py --harness BIN/sm90_fp8_gemm_harness \
        --gpu-tests BIN/fp8proj_gpu_tests --out DIR [--tools racecheck,synccheck,initcheck,memcheck] [--jobs 12]

Runs on the GPU machine (scripts/h200.sh sanitize_matrix). Exit 0 when every cell is clean.
"""
import argparse
import concurrent.futures as cf
import csv
import os
import re
import subprocess
import sys
import time

# Families of the non-GEMM kernels and the GPU tests that launch them (gtest filters). Timing
# loops and the exhaustive 2^32-input conversions are left out: they repeat what these check.
TEST_FAMILIES = [
    ("activation_quant", "ActivationQuantGpu*:*/ActivationQuantGpu.*:DeviceQuantOpsArgs.*"),
    ("rmsnorm / rmsnorm_quant", "*/RmsNormGpu.*:*/RmsNormQuantGpu.*"),
    ("weight_quant", "*/WeightQuantGpu.*"),
    ("prefill_attention", "*/PrefillAttentionGpu.*:*/PrefillAttentionFp8OutGpu.*:PrefillAttentionGpuArgs.*"),
    ("decode_attention", "*/DecodeAttentionGpu.*:DecodeAttentionGpuGraph.*"),
    ("sm90 attention blocks", "Sm90AttentionBlocks.*"),
    ("MLA kernels (rope/cache, head GEMM, weight layout)", "MlaKernelsGpu.*"),
    ("MLA block (all kernels chained)", "*/MlaBlockGpu.*"),
    ("projection layer in CUDA graphs", "ProjectionGraphGpu.*:*/GraphCaptureGpu.*"),
]

SUMMARY_RE = re.compile(r"(ERROR SUMMARY: (\d+) error|RACECHECK SUMMARY: (\d+) hazard)")


def parse_name(name):
    """Fields of an sm90 configuration name ([swapab_]m<BM>n<BN>_ws<W>_st<S>[_mc<C>|_mcn<C>][_c])."""
    m = re.fullmatch(r"(swapab_)?m(\d+)n(\d+)_ws(\d+)_st(\d+)(_mcn?\d+)?(_c)?", name)
    if not m:
        raise ValueError(f"unexpected configuration name {name!r}")
    return {
        "swapab": bool(m.group(1)),
        "bm": int(m.group(2)),
        "bn": int(m.group(3)),
        "cluster_m": bool(m.group(6)) and not m.group(6).startswith("_mcn"),
        "cluster_n": bool(m.group(6)) and m.group(6).startswith("_mcn"),
        "carry": bool(m.group(7)),
    }


# The configurations compiled once per K of the target shapes (sm90_fp8_gemm.cu, kCompiledPerK).
PER_K = {"m256n128_ws2_st3", "m128n192_ws2_st4", "m128n192_ws2_st4_c"}


def problems_for(name):
    """[(config name, [(M, N, K), ...])]: the forced runs of one family member."""
    f = parse_name(name)
    bm, bn = f["bm"], f["bn"]
    if f["swapab"]:
        runs = [(name, [(2 * bm, 1024, 512), (max(1, bm - 5), 2624, 512), (2 * bm - 3, 2624, 512)])]
        if bn == 128:  # split-K exists for the 128-row weight tiles: 3 and 4 splits, tails in M and N
            runs.append((name + "_sk4", [(max(1, bm - 3), 2624, 1024), (2 * bm, 1024, 1024)]))
            runs.append((name + "_sk3", [(2 * bm - 1, 2112, 768)]))
        return runs
    if f["carry"]:  # >= 2 tiles per CTA (132 CTAs), so every epilogue carries a K block
        probs = [(2305, 4096, 512), (2305, 2624, 512), (2304, 4096, 128)]
    elif f["cluster_m"]:  # odd M-tile count: the last pair's second tile lies past M
        probs = [(4 * bm, 8 * bn, 512), (3 * bm - 1, 2624, 512)]
    elif f["cluster_n"]:  # odd N-tile count: a spare tile past N
        probs = [(2 * bm, 4 * bn, 512), (bm + 7, 3 * bn, 512), (bm + 7, 2624, 512)]
    else:
        probs = [(2 * bm, 8 * bn, 512), (2 * bm - 3, 2624, 512)]
    if name in PER_K:
        probs += [(bm + 5, 1024, 1536), (bm + 5, 1024, 2048), (bm + 5, 1024, 4096)]
    return [(name, probs)]


def run(cmd, log_path, timeout, env):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout, env=env, text=True)
        out, rc = p.stdout, p.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), 124
    with open(log_path, "w") as fh:
        fh.write(" ".join(cmd) + "\n" + out)
    return out, rc, time.time() - t0


def verdict(tool, out, rc):
    """(clean, text): the tool's summary count and the program's own result."""
    sums = SUMMARY_RE.findall(out)
    if not sums:
        return False, f"no {tool} summary (rc {rc})"
    count = sum(int(a or b or 0) for _, a, b in sums)
    what = "hazards" if tool == "racecheck" else "errors"
    prog_ok = rc == 0
    m = re.search(r"(\d+) passed, (\d+) failed", out) or re.search(r"\[  PASSED  \] (\d+) test", out)
    prog = m.group(0) if m else f"rc {rc}"
    return count == 0 and prog_ok, f"{count} {what}; {prog}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--harness", required=True)
    ap.add_argument("--gpu-tests", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tools", default="racecheck,synccheck,initcheck,memcheck")
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--timeout", type=int, default=240, help="seconds per sanitizer run")
    ap.add_argument("--only", default="", help="comma list: restrict to these configurations / families (tests)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    tools = [t for t in a.tools.split(",") if t]
    env = dict(os.environ)
    env["FP8PROJ_WATCHDOG_MS"] = "0"  # the tools stretch barrier waits far past any watchdog bound

    family = subprocess.run([a.harness, "--list-configs"], stdout=subprocess.PIPE, text=True, check=True).stdout.split()
    jobs = []  # (row label, problems, tool, cmd, log): the GPU-test families first, the longest runs
    gemm_jobs = []
    for base in family:
        for name, probs in problems_for(base):
            mnk = [x for p in probs for x in ("--mnk", ",".join(map(str, p)))]
            for tool in tools:
                log = os.path.join(a.out, f"{tool}__{name}.log")
                cmd = ["compute-sanitizer", "--tool", tool, "--print-limit", "200", "--error-exitcode", "9",
                       a.harness, "--no-timing", "--config", name] + mnk
                gemm_jobs.append((name, "; ".join("x".join(map(str, p)) for p in probs), tool, cmd, log))
    for label, filt in TEST_FAMILIES:
        for tool in tools:
            safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", label)
            log = os.path.join(a.out, f"{tool}__tests_{safe}.log")
            cmd = ["compute-sanitizer", "--tool", tool, "--print-limit", "200", "--error-exitcode", "9",
                   a.gpu_tests, f"--gtest_filter={filt}-*Speed*:*Bandwidth*:*HardwareCvt*"]
            jobs.append((label, "GPU tests: " + filt, tool, cmd, log))
    jobs += gemm_jobs
    if a.only:
        keep = set(a.only.split(","))
        jobs = [j for j in jobs if j[0] in keep]

    results = {}
    t0 = time.time()
    with cf.ThreadPoolExecutor(a.jobs) as pool:
        futs = {pool.submit(run, cmd, log, a.timeout, env): (label, probs, tool, log) for label, probs, tool, cmd, log in jobs}
        for i, fut in enumerate(cf.as_completed(futs), 1):
            label, probs, tool, log = futs[fut]
            out, rc, secs = fut.result()
            clean, text = verdict(tool, out, rc)
            results[(label, tool)] = (clean, text, secs, probs)
            print(f"[{i}/{len(jobs)} {time.time() - t0:.0f}s] {tool:9s} {label}: {'clean' if clean else 'NOT CLEAN'} ({text})",
                  flush=True)

    labels = list(dict.fromkeys(label for label, *_ in jobs))
    with open(os.path.join(a.out, "matrix.csv"), "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["kernel_or_config", "problems", "tool", "clean", "result", "seconds"])
        for label in labels:
            for tool in tools:
                if (label, tool) in results:
                    clean, text, secs, probs = results[(label, tool)]
                    w.writerow([label, probs, tool, int(clean), text, f"{secs:.1f}"])
    bad = [k for k, v in results.items() if not v[0]]
    with open(os.path.join(a.out, "matrix.md"), "w") as fh:
        fh.write("| kernel / configuration | problems (M x N x K) | " + " | ".join(tools) + " |\n")
        fh.write("|---|---|" + "---|" * len(tools) + "\n")
        for label in labels:
            probs = next(v[3] for k, v in results.items() if k[0] == label)
            cells = []
            for tool in tools:
                r = results.get((label, tool))
                cells.append("" if r is None else ("clean" if r[0] else "**" + r[1] + "**") + f" ({r[2]:.0f} s)")
            fh.write(f"| `{label}` | {probs} | " + " | ".join(cells) + " |\n")
        fh.write(f"\n{len(results) - len(bad)} of {len(results)} cells clean.\n")
    print(f"sanitize matrix: {len(results) - len(bad)} of {len(results)} cells clean ({time.time() - t0:.0f} s)")
    for k in bad:
        print("  not clean:", k[1], k[0], "-", results[k][1])
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
