#!/usr/bin/env python3
"""compute-sanitizer over every GPU kernel configuration, one configuration at a time.

For each configuration of the sm90 GEMM family (`sm90_fp8_gemm_harness --list-configs`) and each
tool, one harness process forces that configuration (`--config`) on problems chosen for it: a
full last tile, a partial last tile in M together with an N tail (N = 2624: a partial last
128-row weight block), K = 512; the kernels compiled for one K also at K = 1536 / 2048 / 4096;
2-CTA clusters with an odd tile count (a spare tile); the carrying (_c) kernels with >= 2 tiles
per CTA (their grid sized for 4 SMs, so that small problems, which racecheck can finish, do it); the swap-AB kernels with split-K, the 64-row tile also at K = 8192 (its stage ring wrapped several
times, where the warpgroups' alternating K blocks meet). The other kernels (quantizers, attention, MLA
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

# Past --print-limit the tool adds a second line, "ERROR SUMMARY: N errors were not printed": a
# part of the first line's count, not more errors.
SUMMARY_RE = re.compile(r"(ERROR SUMMARY: (\d+) error(?!s? were not printed)|RACECHECK SUMMARY: (\d+) hazard)")


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
        if bn == 64:  # K split between the warpgroups: 64 K blocks wrap the stage ring several times
            runs[0][1].append((bm, 1024, 8192))
        if bn == 128:  # split-K of the 128-row weight tiles: 3 and 4 splits, tails in M and N
            runs.append((name + "_sk4", [(max(1, bm - 3), 2624, 1024), (2 * bm, 1024, 1024)]))
            runs.append((name + "_sk3", [(2 * bm - 1, 2112, 768)]))
        else:  # the 64-row tile (one token tile): 2 and 3 splits, an N tail, odd K blocks per split
            runs.append((name + "_sk2", [(max(1, bm - 3), 2624, 1024), (bm, 1024, 1536)]))
            runs.append((name + "_sk3", [(bm, 2112, 1152)]))
        return runs
    if f["carry"]:  # >= 2 tiles per CTA on CARRY_SMS SMs (extra_args), so epilogues carry a K block
        probs = [(257, 512, 512), (257, 2624, 512), (513, 512, 128)]
    elif f["cluster_m"]:  # odd M-tile count: the last pair's second tile lies past M
        probs = [(4 * bm, 8 * bn, 512), (3 * bm - 1, 2624, 512)]
    elif f["cluster_n"]:  # odd N-tile count: a spare tile past N
        probs = [(2 * bm, 4 * bn, 512), (bm + 7, 3 * bn, 512), (bm + 7, 2624, 512)]
    else:
        probs = [(2 * bm, 8 * bn, 512), (2 * bm - 3, 2624, 512)]
    if name in PER_K:
        probs += [(bm + 5, 1024, 1536), (bm + 5, 1024, 2048), (bm + 5, 1024, 4096)]
    return [(name, probs)]


# The carrying kernels need several tiles per CTA. With the device's 132 SMs that took 600+ tiles
# (2305 x 4096), which racecheck did not finish in 540 s; sized for 4 SMs (harness --sms), 8-63
# tiles give every CTA 2-16 tiles, a partial last tile in M and an N tail.
CARRY_SMS = 4


def extra_args(base):
    """Harness arguments the runs of a family member (a --list-configs name) add to --config and --mnk."""
    return ["--sms", str(CARRY_SMS)] if parse_name(base)["carry"] else []


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


def select_only(jobs, only):
    """The jobs whose row label is one of `only`'s semicolon-separated names (all where it is empty).
    Semicolons, because family labels hold commas. A name that matches nothing is an error, so that
    a mistyped --only does not pass as an empty, clean matrix."""
    if not only:
        return jobs
    keep = [k.strip() for k in only.split(";") if k.strip()]
    labels = {j[0] for j in jobs}
    missing = [k for k in keep if k not in labels]
    if missing:
        raise SystemExit(f"--only: no configuration or family named {missing}; families: "
                         + "; ".join(label for label, _ in TEST_FAMILIES))
    return [j for j in jobs if j[0] in keep]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--harness", required=True)
    ap.add_argument("--gpu-tests", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tools", default="racecheck,synccheck,initcheck,memcheck")
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--timeout", type=int, default=240, help="seconds per sanitizer run")
    ap.add_argument("--only", default="",
                    help="semicolon list: restrict to these configurations / families (tests); a family's label "
                         "holds commas, e.g. 'MLA kernels (rope/cache, head GEMM, weight layout);m128n128_ws2_st5'")
    ap.add_argument("--resume", action="store_true",
                    help="skip every (configuration, tool) whose log in --out already ends with the tool's "
                         "summary (a matrix cut short, its logs unpacked into --out): only the rest run, "
                         "the cells never started first")
    ap.add_argument("--from-logs", action="store_true",
                    help="write the matrix from the logs already in --out (a run cut short), running nothing")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    tools = [t for t in a.tools.split(",") if t]
    env = dict(os.environ)
    env["FP8PROJ_WATCHDOG_MS"] = "0"  # the tools stretch barrier waits far past any watchdog bound

    if a.from_logs:
        planned = []
        if os.access(a.harness, os.X_OK):  # every configuration gets a row, run or not
            out = subprocess.run([a.harness, "--list-configs"], stdout=subprocess.PIPE, text=True, check=True).stdout
            planned = [name for base in out.split() for name, _ in problems_for(base)]
        return write_from_logs(a.out, tools, planned)
    family = subprocess.run([a.harness, "--list-configs"], stdout=subprocess.PIPE, text=True, check=True).stdout.split()
    jobs = []  # (row label, problems, tool, cmd, log): the GPU-test families first, the longest runs
    gemm_jobs = []
    for base in family:
        for name, probs in problems_for(base):
            mnk = [x for p in probs for x in ("--mnk", ",".join(map(str, p)))]
            for tool in tools:
                log = os.path.join(a.out, f"{tool}__{name}.log")
                cmd = ["compute-sanitizer", "--tool", tool, "--print-limit", "200", "--error-exitcode", "9",
                       a.harness, "--no-timing", "--config", name] + mnk + extra_args(base)
                where = f" (grid for {CARRY_SMS} SMs)" if extra_args(base) else ""
                gemm_jobs.append((name, "; ".join("x".join(map(str, p)) for p in probs) + where, tool, cmd, log))
    for label, filt in TEST_FAMILIES:
        for tool in tools:
            safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", label)
            log = os.path.join(a.out, f"{tool}__tests_{safe}.log")
            cmd = ["compute-sanitizer", "--tool", tool, "--print-limit", "200", "--error-exitcode", "9",
                   a.gpu_tests, f"--gtest_filter={filt}-*Speed*:*Bandwidth*:*HardwareCvt*"]
            jobs.append((label, "GPU tests: " + filt, tool, cmd, log))
    jobs += gemm_jobs
    jobs = select_only(jobs, a.only)
    if a.resume:
        jobs = resume_jobs(jobs)
        print(f"resume: {len(jobs)} runs without a finished log in {a.out} "
              f"({sum(not os.path.exists(j[4]) for j in jobs)} never started)", flush=True)

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
            # After every run, so that a run cut short by its limit leaves the matrix so far.
            write_matrix(a.out, [label for label, *_ in jobs], tools, results, len(jobs))
    return finish(a.out, [label for label, *_ in jobs], tools, results, len(jobs), time.time() - t0)


def resume_jobs(jobs):
    """The jobs (log path last) whose log has no summary yet; those never started before those that
    ran out of time once, so that a short run fills the matrix's empty cells first."""
    return sorted((j for j in jobs if not finished_log(j[-1])), key=lambda j: os.path.exists(j[-1]))


def finished_log(path):
    """True when `path` holds a compute-sanitizer run that reached its summary line."""
    try:
        with open(path, errors="replace") as fh:
            return bool(SUMMARY_RE.search(fh.read()))
    except OSError:
        return False


def write_from_logs(out, tools, planned):
    """The matrix of the logs in `out` (TOOL__NAME.log, first line the command): cells never run
    stay empty."""
    safe_labels = {re.sub(r"[^A-Za-z0-9_.-]+", "_", label): label for label, _ in TEST_FAMILIES}
    results, labels = {}, []
    for f in sorted(os.listdir(out)):
        m = re.fullmatch(r"([a-z]+)__(.+)\.log", f)
        if not m or m.group(1) not in tools:
            continue
        tool, name = m.groups()
        with open(os.path.join(out, f), errors="replace") as fh:
            cmd = fh.readline()
            text = fh.read()
        if name.startswith("tests_"):
            label = safe_labels.get(name[len("tests_"):], name)
            probs = "GPU tests: " + (re.search(r"--gtest_filter=(\S+)", cmd) or [None, "?"])[1]
        else:
            label = name
            probs = "; ".join(p.replace(",", "x") for p in re.findall(r"--mnk (\S+)", cmd))
            sms = re.search(r"--sms (\d+)", cmd)
            if sms:
                probs += f" (grid for {sms.group(1)} SMs)"
        rc = 0 if re.search(r"(\d+) passed, 0 failed|\[  PASSED  \] \d+ test", text) and \
            not re.search(r"ERROR SUMMARY: [1-9]|RACECHECK SUMMARY: [1-9]", text) else 1
        clean, vtext = verdict(tool, text, rc)
        if not SUMMARY_RE.search(text):  # a log without the tool's summary: the run was stopped
            vtext = "stopped by its time limit before the tool's summary"
        results[(label, tool)] = (clean, vtext, 0.0, probs)
        labels.append(label)
    gemm = list(planned) + sorted(set(labels) - {l for l, _ in TEST_FAMILIES} - set(planned))
    labels = [l for l, _ in TEST_FAMILIES] + gemm
    for label in labels:  # rows never run: their problems from the plan
        if not any(k[0] == label for k in results) and label in planned:
            base = re.sub(r"_sk\d+$", "", label)
            probs = next(p for n, p in problems_for(base) if n == label)
            results_probs = "; ".join("x".join(map(str, q)) for q in probs)
            results[(label, "_plan")] = (True, "", 0.0, results_probs)
    n_cells = len(labels) * len(tools)
    results = {k: v for k, v in results.items()}
    plan_rows = {k[0]: v[3] for k, v in results.items() if k[1] == "_plan"}
    results = {k: v for k, v in results.items() if k[1] != "_plan"}
    bad = write_matrix(out, labels, tools, results, n_cells, plan_rows)
    print(f"sanitize matrix from logs: {len(results) - len(bad)} of {len(results)} cells run are clean, "
          f"{n_cells - len(results)} not run")
    for k in bad:
        print("  not clean:", k[1], k[0], "-", results[k][1])
    return 0 if not bad and len(results) == n_cells else 1


def write_matrix(out, labels, tools, results, planned, plan_rows=None):
    labels = list(dict.fromkeys(labels))
    with open(os.path.join(out, "matrix.csv"), "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["kernel_or_config", "problems", "tool", "clean", "result", "seconds"])
        for label in labels:
            for tool in tools:
                if (label, tool) in results:
                    clean, text, secs, probs = results[(label, tool)]
                    w.writerow([label, probs, tool, int(clean), text, f"{secs:.1f}"])
    bad = [k for k, v in results.items() if not v[0]]
    with open(os.path.join(out, "matrix.md"), "w") as fh:
        fh.write("| kernel / configuration | problems (M x N x K) | " + " | ".join(tools) + " |\n")
        fh.write("|---|---|" + "---|" * len(tools) + "\n")
        for label in labels:
            probs = next((v[3] for k, v in results.items() if k[0] == label), (plan_rows or {}).get(label, ""))
            cells = []
            for tool in tools:
                r = results.get((label, tool))
                if r is None:
                    cells.append("not run")
                    continue
                cell = "clean" if r[0] else "**" + r[1] + "**"
                cells.append(cell + (f" ({r[2]:.0f} s)" if r[2] else ""))
            fh.write(f"| `{label}` | {probs} | " + " | ".join(cells) + " |\n")
        of = f" ({planned} planned)" if planned else ""
        fh.write(f"\n{len(results) - len(bad)} of {len(results)} cells run{of} are clean.\n")
    return bad


def finish(out, labels, tools, results, planned, secs):
    bad = write_matrix(out, labels, tools, results, planned)
    took = f" ({secs:.0f} s)" if secs else ""
    print(f"sanitize matrix: {len(results) - len(bad)} of {len(results)} cells clean{took}")
    for k in bad:
        print("  not clean:", k[1], k[0], "-", results[k][1])
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
