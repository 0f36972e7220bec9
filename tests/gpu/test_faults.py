#!/usr/bin/env python3
"""The library on a GPU under faults (docs/robustness.md), each scenario in a fresh process.

Tuned-table faults: a corrupt table, one without a stamp, a directory, a FIFO, a missing file, a
table stamped for another GPU, and an unsupported GPU (on an sm_90 GPU the layer probe reports
itself as sm_80; the C ABI probe needs a real non-sm_90 GPU). The layer and the C ABI must work
with the defaults and exactly one log line about the table.

Sticky CUDA faults: a test kernel stores to an unmapped address (or traps), the caller's own wait
sees it, then every surface of the library -- C++ (ProjectionLayer on each backend, quantizers,
ShardedProjection, MlaBlock prefill / decode / graph replay, constructors), the C ABI, and the
torch ops where torch and the fp8proj package import -- must fail within 2 s with the fault's
text; none may return normally. Each case puts another surface first (the one that meets the
fault unannounced).

Hang: the real sm90 1d2d GEMM kernel launched so that a pipeline barrier never completes, with
FP8PROJ_WATCHDOG_MS=200: the process must end with an error naming the kernel configuration and
"watchdog" within 5 s of the launch. The same launch with FP8PROJ_WATCHDOG_MS=0 hangs by design;
it is listed as skipped, and runs (expecting the hang, killed after 20 s) only with
FAULT_PROBE_RUN_UNBOUNDED=1.

Usage: test_faults.py FAULT_PROBE_LAYER FAULT_PROBE_CAPI [LIBFP8PROJ_FAULT_INJECT]
Exit 77 (skipped) when the probes skip (no sm_90 GPU), with their reason.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

STAMP = {"gpu_name": "NVIDIA B200", "sm_count": 148, "driver": "", "cuda_runtime": "", "cublaslt": "",
         "fp8proj_version": ""}
HANG_LIMIT_MS = 5000  # launch to error, with a 200 ms watchdog
LATCHED = "unusable after an earlier error"


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


def run(probe, env, timeout=300):
    e = {k: v for k, v in os.environ.items() if not k.startswith("FP8PROJ_")}
    e.update(env)
    t0 = time.monotonic()
    try:
        p = subprocess.run([probe], env=e, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as x:
        out = x.stdout.decode(errors="replace") if isinstance(x.stdout, bytes) else (x.stdout or "")
        return None, out, "", time.monotonic() - t0
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t0


class Report:
    def __init__(self):
        self.failures, self.skipped, self.ran = [], [], 0

    def skip(self, label, why):
        self.skipped.append(f"{label}: {why}")

    def result(self, label, problems, summary, details=""):
        self.ran += 1
        print(f"{'ok  ' if not problems else 'FAIL'} {label:<48} {summary[:160]}")
        if problems:
            self.failures.append(f"{label}: {'; '.join(problems)}\n{details}")


def table_cases(report, probes, tmp):
    cases = [(name, {"FP8PROJ_TUNE_FILE": path}, why) for name, path, why in scenarios(tmp)]
    cases.append(("unsupported_gpu", {"FAULT_PROBE_EXPECT_UNSUPPORTED": "1"}, None))
    for probe in probes:
        for name, env, why in cases:
            rc, out, err, _ = run(probe, env)
            label = f"{os.path.basename(probe)}/{name}"
            if rc == 77:
                report.skip(label, out.strip())
                continue
            table_lines = [l for l in err.splitlines() if "tuned table" in l or "using defaults" in l]
            problems = []
            if rc != 0:
                problems.append(f"exit {rc}")
            if why is not None and (len(table_lines) != 1 or why not in table_lines[0]):
                problems.append(f"{len(table_lines)} table log lines (expected one naming {why!r})")
            if "probe ok" not in out:
                problems.append("no 'probe ok'")
            report.result(label, problems, out.strip(), f"{out}\n{err}")
            for l in table_lines:
                print(f"       log: {l[:200]}")


def sticky_cases(report, layer_probe, capi_probe):
    cases = [(layer_probe, first, fault) for first, fault in
             [("sm90 FP8", "0"), ("bf16, cuBLASLt", "0"), ("cuBLASLt FP8", "0"), ("MlaBlock.prefill", "0"),
              ("MlaDecodeGraph.replay", "0"), ("Buffer (allocate)", "0"), ("sm90 FP8", "1")]]
    cases += [(capi_probe, first, "0") for first in
              ["fp8proj_fp8_gemm_run", "fp8proj_projection_forward (bf16)", "fp8proj_quantize_activation",
               "fp8proj_fp8_gemm_create"]]
    for probe, first, fault in cases:
        env = {"FAULT_PROBE_SCENARIO": "sticky", "FAULT_PROBE_FIRST": first, "FAULT_PROBE_FAULT": fault}
        rc, out, err, secs = run(probe, env, timeout=120)
        label = f"{os.path.basename(probe)}/sticky[{first}{', trap' if fault == '1' else ''}]"
        if rc == 77:
            report.skip(label, out.strip())
            continue
        problems = []
        if rc is None:
            problems.append("hung (killed after 120 s)")
        elif rc != 0:
            problems.append(f"exit {rc}")
        if "probe ok" not in out:
            problems.append("no 'probe ok'")
        summary = next((l for l in out.splitlines() if l.startswith("probe")), out.strip()[-160:])
        report.result(label, problems, f"{secs:.1f} s; {summary}", f"{out}\n{err}")
        if problems:
            for l in out.splitlines():
                if l.startswith("FAIL"):
                    print(f"       {l[:220]}")


def hang_cases(report, layer_probe):
    label = f"{os.path.basename(layer_probe)}/hang[FP8PROJ_WATCHDOG_MS=200]"
    rc, out, err, secs = run(layer_probe, {"FAULT_PROBE_SCENARIO": "hang", "FP8PROJ_WATCHDOG_MS": "200"}, timeout=60)
    if rc == 77:
        report.skip(label, out.strip())
    else:
        problems = []
        ended = next((l for l in out.splitlines() if l.startswith("hang ended")), "")
        after = next((l for l in out.splitlines() if l.startswith("after the hang")), "")
        m = re.search(r"after (\d+) ms", ended)
        if rc is None:
            problems.append("the process hung (killed after 60 s)")
        elif rc == 0:
            problems.append("exit 0 (the process must end with an error)")
        if not m or int(m.group(1)) > HANG_LIMIT_MS:
            problems.append(f"no error within {HANG_LIMIT_MS} ms of the launch")
        for want in ("watchdog: sm90_fp8_gemm m128n128_ws2_st5 (M=128 N=128 K=128) block 0",
                     "next: full[0] parity 0", "FP8PROJ_WATCHDOG_MS=200", "a sticky error"):
            if want not in ended:
                problems.append(f"the error does not say {want!r}")
        if LATCHED not in after or "watchdog:" not in after:
            problems.append("a call after the hang did not fail with the latched watchdog text")
        logged = [l for l in err.splitlines() if "watchdog:" in l]
        if len(logged) != 1:
            problems.append(f"{len(logged)} log lines with the watchdog report (expected one)")
        report.result(label, problems, f"exit {rc}, {secs:.1f} s; {ended[:150]}", f"{out}\n{err}")
    label = f"{os.path.basename(layer_probe)}/hang[FP8PROJ_WATCHDOG_MS=0]"
    if os.environ.get("FAULT_PROBE_RUN_UNBOUNDED") != "1":
        report.skip(label, "not run: with the watchdog off the kernel hangs by design (FAULT_PROBE_RUN_UNBOUNDED=1 "
                           "runs it, expecting a hang that is killed after 20 s)")
        return
    rc, out, err, secs = run(layer_probe, {"FAULT_PROBE_SCENARIO": "hang", "FP8PROJ_WATCHDOG_MS": "0"}, timeout=20)
    problems = [] if rc is None else [f"exit {rc}: the unbounded wait ended"]
    report.result(label, problems, f"{'hung as expected' if rc is None else 'ended'} after {secs:.0f} s",
                  f"{out}\n{err}")


TORCH_SCRIPT = r'''
import ctypes, os, sys, time
import torch
from fp8proj import ops
from fp8proj.torch import Fp8ProjLinear

inject = ctypes.CDLL(sys.argv[1])
dev = torch.device("cuda")
x = torch.randn(64, 256, device=dev, dtype=torch.bfloat16)
w = torch.randn(256, 256, device=dev, dtype=torch.bfloat16) * 0.02
nw = torch.ones(256, device=dev, dtype=torch.bfloat16)
lin = torch.nn.Linear(256, 256, bias=False, device=dev, dtype=torch.bfloat16)
make = lambda: Fp8ProjLinear.from_linear(lin, name="probe", enabled=True, policy="all", threshold=0)
mod = make()
xv, xs = ops.quantize_activation(x)
wv, ws = ops.quantize_weight(w)
ops.fp8_gemm(xv, xs, wv, ws)
ops.rmsnorm_quantize(x, nw, 1e-6)
mod(x)
torch.cuda.synchronize()
print("kernels:", "C++ (libfp8proj_torch)" if ops.CPP_OPS else "Python (ctypes)", "; module FP8:", mod.uses_fp8(64))
assert inject.fp8proj_test_inject_fault(0) == 0
try:
    torch.cuda.synchronize()
    print("FAIL no fault happened")
    os._exit(1)
except RuntimeError as e:
    print("fault seen by torch:", str(e).splitlines()[0])
calls = [("torch.ops.fp8proj.quantize_activation", lambda: ops.quantize_activation(x)),
         ("torch.ops.fp8proj.rmsnorm_quantize", lambda: ops.rmsnorm_quantize(x, nw, 1e-6)),
         ("torch.ops.fp8proj.quantize_weight", lambda: ops.quantize_weight(w)),
         ("torch.ops.fp8proj.fp8_gemm", lambda: ops.fp8_gemm(xv, xs, wv, ws)),
         ("Fp8ProjLinear.forward", lambda: mod(x)),
         ("Fp8ProjLinear (construct)", make)]
bad, latched = 0, 0
for name, fn in calls:
    t0 = time.monotonic()
    try:
        fn()
        problem, msg = "returned without an error", ""
    except RuntimeError as e:
        msg = str(e)
        problem = None if "illegal memory access" in msg else "the error does not name the fault"
    ms = (time.monotonic() - t0) * 1e3
    if problem is None and ms > 2000:
        problem = f"took {ms:.0f} ms"
    latched += "unusable after an earlier error" in msg
    bad += problem is not None
    print(f"{'ok  ' if problem is None else 'FAIL'} {name:<40} {ms:7.2f} ms  {problem + ': ' if problem else ''}"
          f"{msg.splitlines()[0][:200] if msg else ''}")
if latched == 0:
    print("FAIL no call carried the library's latched text")
    bad += 1
print("probe ok" if bad == 0 else f"probe FAILED: {bad}")
sys.stdout.flush()
os._exit(0 if bad == 0 else 1)  # no interpreter teardown on a dead context
'''


def torch_envs(inject):
    """The environments to try the torch case in: the installed package, then this source tree's
    python/ over the libfp8proj_c.so next to the probes (its ops then run their Python
    implementations: libfp8proj_torch.so is built by the package build only)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("FP8PROJ_") or k == "FP8PROJ_PYTHON_LIB"}
    envs = [("installed package", base)]
    here = os.path.dirname(os.path.abspath(inject))
    for lib in (os.path.join(here, "libfp8proj_c.so"), os.path.join(here, "..", "..", "src", "libfp8proj_c.so")):
        if os.path.exists(lib):
            src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
            path = os.pathsep.join(p for p in (os.path.normpath(src), base.get("PYTHONPATH", "")) if p)
            envs.append((f"python/ over {os.path.normpath(lib)}", dict(base, PYTHONPATH=path, FP8PROJ_PYTHON_LIB=lib)))
            break
    return envs


def torch_cases(report, inject):
    env, why = None, ""
    for name, candidate in torch_envs(inject):
        check = subprocess.run([sys.executable, "-c", "import torch, fp8proj.ops, fp8proj.torch, sys; "
                                "ok = torch.cuda.is_available() and fp8proj.cuda_status()[0]; "
                                "print(fp8proj.cuda_status()[1]); sys.exit(0 if ok else 3)"],
                               env=candidate, capture_output=True, text=True, timeout=300)
        if check.returncode == 0:
            env = candidate
            print(f"       torch case: {name}")
            break
        last = (check.stderr.strip().splitlines() or check.stdout.strip().splitlines() or ["?"])[-1]
        why += f"{name}: {'no sm_90 GPU for torch (' + last + ')' if check.returncode == 3 else last}; "
    if env is None:
        report.skip("torch/sticky", f"torch and the fp8proj package do not run here ({why.rstrip('; ')[:300]})")
        return
    for kernels in ("1", "0"):
        label = f"torch/sticky[FP8PROJ_TORCH_KERNELS={kernels}]"
        t0 = time.monotonic()
        try:
            p = subprocess.run([sys.executable, "-c", TORCH_SCRIPT, inject], env=dict(env, FP8PROJ_TORCH_KERNELS=kernels),
                               capture_output=True, text=True, timeout=300)
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired:
            rc, out, err = None, "", ""
        problems = []
        if rc is None:
            problems.append("hung (killed after 300 s)")
        elif rc != 0:
            problems.append(f"exit {rc}")
        if "probe ok" not in out:
            problems.append("no 'probe ok'")
        head = next((l for l in out.splitlines() if l.startswith("kernels")), "")
        report.result(label, problems, f"{time.monotonic() - t0:.1f} s; {head}", f"{out}\n{err[-3000:]}")
        for l in out.splitlines():
            if l.startswith(("ok", "FAIL")):
                print(f"       {l[:200]}")


def main():
    probes = sys.argv[1:3]
    inject = sys.argv[3] if len(sys.argv) > 3 else None
    report = Report()
    with tempfile.TemporaryDirectory() as tmp:
        table_cases(report, probes, tmp)
    if inject is None or not os.path.exists(inject):
        report.skip("sticky, hang, torch", f"no fault-injection library given ({inject})")
    else:
        sticky_cases(report, *probes)
        hang_cases(report, probes[0])
        torch_cases(report, inject)
    for s in report.skipped:
        print("SKIPPED", s)
    for f in report.failures:
        print("FAIL", f)
    if report.ran == 0:
        return 77
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
