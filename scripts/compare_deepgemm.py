#!/usr/bin/env python3
"""Our FP8 GEMM, DeepGEMM and cuBLAS bf16 in one process, on the same operands (H200).

  compare_deepgemm.py --lib build/src/libfp8proj_c.so [--out DIR] [--reps 45] [--m 16,64,...]
  compare_deepgemm.py --prewarm I/N     # only JIT-compile DeepGEMM's kernels for shard I of N
  compare_deepgemm.py --lib A.so --lib-b B.so ...  # also a second build of ours (an A/B)

A ratio measured in another run is a guide, not a bar (two runs differ by 1-10% at a point).
This puts all three in one run: for each shape of the reference table (docs/design.md) and each M, one random bf16
activation and weight are quantized once (1x128 / 128x128 blocks, power-of-two scales), and
the very same e4m3 values and fp32 scales feed DeepGEMM (`deep_gemm.fp8_gemm_nt`, its own
heuristic and JIT) and ours (libfp8proj_c.so: the tuned configuration per M, as `fp8proj
bench` times it). bf16 is torch.matmul on the unquantized operands (cuBLAS). Timing: device
events around each call, L2 flushed (a write of twice its size) before every timed call, the
three interleaved call by call after a GPU-side delay that lets the host enqueue a whole
round ahead (so no host overhead is timed), median of --reps rounds. Both FP8 outputs are
checked against the fp32 product of the dequantized operands (relative Frobenius error).
With --lib-b, a second build of our library runs as a fourth call in every round (same
operands, same tuned table): an A/B of two builds in this very regime, immune to the drift
between separate runs (columns b_us, b_over_ours, b_over_deepgemm; its own summary lines).

Writes compare_deepgemm.{csv,json,md} under --out; prints the table last.
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_reference import DEEPGEMM, MS, NAMES, gmean  # noqa: E402  (the reference table)

E4M3_MAX = 448.0


def quantize_blocks(t, rows_per_block):
    """e4m3 values and power-of-two fp32 scales of t [R, K], one scale per (rows_per_block x 128); a
    partial last row block (R % rows_per_block != 0) is scaled over the rows that exist."""
    r, k = t.shape
    rb = rows_per_block
    if r % rb:
        pad = torch.zeros(rb - r % rb, k, dtype=t.dtype, device=t.device)  # zeros leave the block amax alone
        q, scale = quantize_blocks(torch.cat([t, pad]), rb)
        return q[:r], scale
    blocks = t.float().reshape(r // rb, rb, k // 128, 128)
    amax = blocks.abs().amax(dim=(1, 3)).clamp_min(1e-30)                   # [R/rb, K/128]
    scale = torch.exp2(torch.ceil(torch.log2(amax / E4M3_MAX)))            # UE8M0: 2^e >= amax/448
    q = (blocks / scale[:, None, :, None]).reshape(r, k).to(torch.float8_e4m3fn)
    return q, scale


def quantize_activation(x):
    """[M, K] -> e4m3 [M, K], scales as a [M, K/128] view of a [K/128, align(M, 4)] buffer."""
    m, k = x.shape
    q, s = quantize_blocks(x, 1)                                            # s: [M, K/128]
    ld = (m + 3) // 4 * 4
    buf = torch.zeros(k // 128, ld, dtype=torch.float32, device=x.device)
    buf[:, :m] = s.t()
    return q, buf, buf[:, :m].t(), ld                                       # DeepGEMM: MN-major, TMA-aligned


def dequantize(q, scale_rows, scales_mk):
    """fp32 of e4m3 q [R, K] with scales_mk [R/scale_rows, K/128]."""
    s = scales_mk.repeat_interleave(scale_rows, 0).repeat_interleave(128, 1)
    return q.float() * s[: q.shape[0]]


class Fp8Proj:
    """libfp8proj_c.so through ctypes (include/fp8proj/c_api.h)."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        L, vp, i64 = self.lib, ctypes.c_void_p, ctypes.c_int64
        L.fp8proj_fp8_gemm_create.argtypes = [vp, vp, i64, i64, i64, ctypes.c_char_p, ctypes.POINTER(vp)]
        L.fp8proj_fp8_gemm_run.argtypes = [vp, vp, vp, i64, i64, vp, vp]
        L.fp8proj_fp8_gemm_describe.argtypes = [vp, i64, ctypes.c_char_p, ctypes.c_size_t]
        L.fp8proj_fp8_gemm_destroy.argtypes = [vp]
        L.fp8proj_last_error.restype = ctypes.c_char_p
        L.fp8proj_version_string.restype = ctypes.c_char_p
        self.version = L.fp8proj_version_string().decode()

    def check(self, rc):
        if rc != 0:
            raise RuntimeError("fp8proj: " + self.lib.fp8proj_last_error().decode())

    def plan(self, wq, ws, max_m):
        h = ctypes.c_void_p()
        n, k = wq.shape
        self.check(self.lib.fp8proj_fp8_gemm_create(wq.data_ptr(), ws.data_ptr(), n, k, max_m, b"sm90_fp8_block",
                                                    ctypes.byref(h)))
        return h

    def describe(self, h, m):
        buf = ctypes.create_string_buffer(128)
        self.check(self.lib.fp8proj_fp8_gemm_describe(h, m, buf, 128))
        return buf.value.decode()

    def run(self, h, xq, xs_buf, ld, m, y):
        self.check(self.lib.fp8proj_fp8_gemm_run(h, xq.data_ptr(), xs_buf.data_ptr(), ld, m, y.data_ptr(),
                                                 torch.cuda.current_stream().cuda_stream))


def rel_err(y, ref):
    return (torch.linalg.vector_norm((y.float() - ref).double()) / torch.linalg.vector_norm(ref.double())).item()


def time_interleaved(fns, reps, warmup, flush, alternate_last_two=False):
    """Median device time (us) per fn, interleaved call by call, L2 flushed before each.
    alternate_last_two: every other round runs the last two fns in swapped order (an A/B
    whose two builds then share any bias of the position in the round)."""
    for _ in range(warmup):
        for f in fns:
            f()
    torch.cuda.synchronize()
    ev = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in fns]
          for _ in range(reps)]
    for r in range(reps):
        torch.cuda._sleep(1_000_000)  # ~0.5 ms on the GPU: the host enqueues the round meanwhile
        order = list(range(len(fns)))
        if alternate_last_two and r % 2 == 1:
            order[-2:] = order[-1:-3:-1]
        for i in order:
            e0, e1 = ev[r][i]
            flush.fill_(0x5A)
            e0.record()
            fns[i]()
            e1.record()
    torch.cuda.synchronize()
    return [statistics.median(ev[r][i][0].elapsed_time(ev[r][i][1]) * 1000 for r in range(reps))
            for i in range(len(fns))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", help="libfp8proj_c.so")
    ap.add_argument("--lib-b", help="a second libfp8proj_c.so, timed interleaved with the first (A/B)")
    ap.add_argument("--tune-file-b", help="the tuned table library B reads (default: A's, FP8PROJ_TUNE_FILE); "
                    "a table A/B with the same library for both")
    ap.add_argument("--out", default=".")
    ap.add_argument("--reps", type=int, default=45)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--m", default=",".join(map(str, MS)))
    ap.add_argument("--only", help="N,K: only this shape of the table")
    ap.add_argument("--shapes", help="'N,K;N,K...' instead of the reference table (docs/design.md), e.g. fused_qkv_a '2624,6144;2112,7168' "
                    "(N %% 128 != 0: the last 128-row weight block is partial; DeepGEMM takes N %% 64 == 0)")
    ap.add_argument("--prewarm", help="I/N: call DeepGEMM once per problem of shard I of N (JIT only), then exit")
    a = ap.parse_args()

    import deep_gemm
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    ms = [int(v) for v in a.m.split(",")]
    shapes = list(DEEPGEMM)
    if a.shapes:
        shapes = [tuple(int(v) for v in p.split(",")) for p in a.shapes.split(";") if p]
    if a.only:
        shapes = [tuple(int(v) for v in a.only.split(","))]
        if shapes[0] not in DEEPGEMM:
            ap.error(f"--only {a.only}: not a shape of the reference table {list(DEEPGEMM)}")
    todo = [(n, k, m) for (n, k) in shapes for m in ms]
    if a.prewarm:
        i, n_shards = map(int, a.prewarm.split("/"))
        for idx, (n, k, m) in enumerate(todo):
            if idx % n_shards == i:
                xq = torch.zeros(m, k, device=dev).to(torch.float8_e4m3fn)
                wq = torch.zeros(n, k, device=dev).to(torch.float8_e4m3fn)
                _, _, xs, _ = quantize_activation(torch.ones(m, k, device=dev))
                ws = torch.ones((n + 127) // 128, k // 128, device=dev)
                deep_gemm.fp8_gemm_nt((xq, xs), (wq, ws), torch.empty(m, n, device=dev, dtype=torch.bfloat16))
        torch.cuda.synchronize()
        return

    ours = Fp8Proj(a.lib)
    ours_b = None
    if a.lib_b:
        # A copy under another name: the dynamic loader would otherwise hand back the first.
        b_path = os.path.join(a.out, "libfp8proj_c_b.so")
        os.makedirs(a.out, exist_ok=True)
        subprocess.run(["cp", a.lib_b, b_path], check=True)
        ours_b = Fp8Proj(b_path)
    props = torch.cuda.get_device_properties(0)
    flush = torch.empty(2 * max(props.L2_cache_size, 50 << 20), dtype=torch.uint8, device=dev)
    gen = torch.Generator(device=dev)
    rows = []
    t_start = time.time()
    for (n, k) in shapes:
        max_m = max(ms)
        gen.manual_seed(n * 7 + k)
        w = (torch.randn(n, k, device=dev, generator=gen) * 0.02).to(torch.bfloat16)
        x_all = torch.randn(max_m, k, device=dev, generator=gen).to(torch.bfloat16)
        wq, ws = quantize_blocks(w, 128)
        w_deq = dequantize(wq, 128, ws)
        h = ours.plan(wq, ws, max_m)
        h_b = None
        if ours_b:
            # Each library copy reads its table once, at its first plan: B's first plan sees B's.
            saved = os.environ.get("FP8PROJ_TUNE_FILE")
            if a.tune_file_b:
                os.environ["FP8PROJ_TUNE_FILE"] = a.tune_file_b
            h_b = ours_b.plan(wq, ws, max_m)
            if saved is None:
                os.environ.pop("FP8PROJ_TUNE_FILE", None)
            else:
                os.environ["FP8PROJ_TUNE_FILE"] = saved
        y_bf16 = torch.empty(max_m, n, device=dev, dtype=torch.bfloat16)
        y_dg = torch.empty_like(y_bf16)
        y_ours = torch.empty_like(y_bf16)
        y_b = torch.empty_like(y_bf16) if ours_b else None
        for m in ms:
            x = x_all[:m]
            xq, xs_buf, xs_view, ld = quantize_activation(x)
            yb, yd, yo = y_bf16[:m], y_dg[:m], y_ours[:m]
            wt = w.t()
            fns = [lambda: torch.matmul(x, wt, out=yb),
                   lambda: deep_gemm.fp8_gemm_nt((xq, xs_view), (wq, ws), yd),
                   lambda: ours.run(h, xq, xs_buf, ld, m, yo)]
            yd.fill_(float("nan"))
            yo.fill_(float("nan"))
            fns[1]()
            fns[2]()
            if ours_b:
                ybm = y_b[:m]
                fns.append(lambda: ours_b.run(h_b, xq, xs_buf, ld, m, ybm))
                ybm.fill_(float("nan"))
                fns[3]()
            ref = dequantize(xq, 1, xs_view) @ w_deq.t()
            err_dg, err_ours = rel_err(yd, ref), rel_err(yo, ref)
            finite_dg, finite_ours = bool(torch.isfinite(yd).all()), bool(torch.isfinite(yo).all())
            b_same = bool(torch.equal(ybm, yo)) if ours_b else None  # bitwise, or says so
            del ref
            times = time_interleaved(fns, a.reps, a.warmup, flush, alternate_last_two=ours_b is not None)
            t_bf16, t_dg, t_ours = times[:3]
            flop = 2.0 * m * n * k
            r = dict(shape=NAMES.get((n, k), f"{n}x{k}"), n=n, k=k, m=m, bf16_us=t_bf16, deepgemm_us=t_dg, ours_us=t_ours,
                     deepgemm_ratio=t_bf16 / t_dg, ours_ratio=t_bf16 / t_ours, ours_over_deepgemm=t_dg / t_ours,
                     design_deepgemm_ratio=DEEPGEMM[(n, k)][MS.index(m)] if (n, k) in DEEPGEMM and m in MS else None,
                     deepgemm_tflops=flop / t_dg / 1e6, ours_tflops=flop / t_ours / 1e6,
                     bf16_tflops=flop / t_bf16 / 1e6, deepgemm_err=err_dg, ours_err=err_ours,
                     deepgemm_finite=finite_dg, ours_finite=finite_ours, ours_config=ours.describe(h, m))
            if ours_b:
                r.update(b_us=times[3], b_over_ours=t_ours / times[3], b_over_deepgemm=t_dg / times[3],
                         b_ratio=t_bf16 / times[3], b_bitwise_equal=b_same, b_config=ours_b.describe(h_b, m))
            rows.append(r)
            print(f"{r['shape']:>14} M={m:>6}: bf16 {t_bf16:9.1f} us  DeepGEMM {t_dg:9.1f} us ({r['deepgemm_ratio']:.2f}x)"
                  f"  ours {t_ours:9.1f} us ({r['ours_ratio']:.2f}x)  ours/DeepGEMM {r['ours_over_deepgemm']:.3f}"
                  f"  err {err_dg:.1e}/{err_ours:.1e}  [{r['ours_config']}]"
                  + (f"  B {r['b_us']:9.1f} us B/ours {r['b_over_ours']:.3f} bitwise {b_same}" if ours_b else ""),
                  flush=True)
        ours.lib.fp8proj_fp8_gemm_destroy(h)
        if ours_b:
            ours_b.lib.fp8proj_fp8_gemm_destroy(h_b)

    write_results(a, rows, time.time() - t_start, props, ours.version + (f" | B {ours_b.version}" if ours_b else ""))


def write_results(a, rows, seconds, props, fp8proj_version):
    import deep_gemm
    os.makedirs(a.out, exist_ok=True)
    keys = list(rows[0].keys())
    with open(os.path.join(a.out, "compare_deepgemm.csv"), "w") as f:
        f.write(",".join(keys) + "\n")
        for r in rows:
            f.write(",".join(f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c]) for c in keys) + "\n")

    def smi(q):
        try:
            return subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                                  text=True, timeout=20).stdout.strip()
        except Exception as e:  # noqa: BLE001
            return f"unavailable ({e})"

    stamp = dict(gpu=props.name, sms=props.multi_processor_count, l2_bytes=props.L2_cache_size,
                 driver=smi("driver_version"), clocks_after=smi("clocks.sm,clocks.mem,power.draw,temperature.gpu"),
                 torch=torch.__version__, torch_cuda=torch.version.cuda,
                 deep_gemm=getattr(deep_gemm, "__version__", "?"), deep_gemm_commit=os.environ.get("DG_COMMIT", "?"),
                 fp8proj=fp8proj_version, date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                 seconds=round(seconds, 1), reps=a.reps, warmup=a.warmup, l2_flush="2 x L2 written before every timed call",
                 statistic="median", interleave="call by call")
    design = [r for r in rows if r["design_deepgemm_ratio"]]  # empty for --shapes (gmean gives NaN)
    summary = dict(
        points=len(rows),
        ours_ge_deepgemm_same_run=sum(r["ours_over_deepgemm"] >= 1 for r in rows),
        geomean_ours_over_deepgemm_same_run=gmean([r["ours_over_deepgemm"] for r in rows]),
        min_ours_over_deepgemm_same_run=min(r["ours_over_deepgemm"] for r in rows),
        ours_ge_design_table=sum(r["ours_ratio"] >= r["design_deepgemm_ratio"] - 1e-9 for r in design),
        geomean_ours_over_design_table=gmean([r["ours_ratio"] / r["design_deepgemm_ratio"] for r in design]),
        geomean_deepgemm_same_run_over_design_table=gmean([r["deepgemm_ratio"] / r["design_deepgemm_ratio"]
                                                           for r in design]),
        max_err_deepgemm=max(r["deepgemm_err"] for r in rows), max_err_ours=max(r["ours_err"] for r in rows),
        all_finite=all(r["deepgemm_finite"] and r["ours_finite"] for r in rows))
    if "b_us" in rows[0]:
        summary.update(
            geomean_b_over_ours=gmean([r["b_over_ours"] for r in rows]),
            b_ge_deepgemm_same_run=sum(r["b_over_deepgemm"] >= 1 for r in rows),
            geomean_b_over_deepgemm_same_run=gmean([r["b_over_deepgemm"] for r in rows]),
            b_ge_design_table=sum(r["b_ratio"] >= r["design_deepgemm_ratio"] - 1e-9 for r in design),
            geomean_b_over_design_table=gmean([r["b_ratio"] / r["design_deepgemm_ratio"] for r in design]),
            b_bitwise_equal_all=all(r["b_bitwise_equal"] for r in rows))
    with open(os.path.join(a.out, "compare_deepgemm.json"), "w") as f:
        json.dump(dict(stamp=stamp, summary=summary, rows=rows), f, indent=1)

    ms = sorted({r["m"] for r in rows})
    by = {(r["n"], r["k"], r["m"]): r for r in rows}
    md = ["## Ours vs DeepGEMM, same process, same operands (ratio to cuBLAS bf16 in this run)", "",
          f"{stamp['gpu']}, driver {stamp['driver']}, torch {stamp['torch']} (CUDA {stamp['torch_cuda']}), "
          f"DeepGEMM {stamp['deep_gemm']} ({stamp['deep_gemm_commit']}), fp8proj {stamp['fp8proj']}, "
          f"{stamp['date']}; median of {a.reps} interleaved calls, L2 flushed before each.", "",
          "Cell: ours / DeepGEMM (ratio to bf16); ✓ where ours ≥ DeepGEMM.", "",
          "| shape (N×K) | " + " | ".join(f"M={m}" for m in ms) + " |", "|---|" + "---|" * len(ms)]
    for (n, k) in sorted({(r["n"], r["k"]) for r in rows}, key=[(r["n"], r["k"]) for r in rows].index):
        cells = []
        for m in ms:
            r = by.get((n, k, m))
            cells.append("–" if r is None else
                         f"{r['ours_ratio']:.2f} / {r['deepgemm_ratio']:.2f}{' ✓' if r['ours_over_deepgemm'] >= 1 else ''}")
        md.append(f"| {NAMES.get((n, k), 'N tail' if n % 128 else '')} {n}×{k} | " + " | ".join(cells) + " |")
    s = summary
    md += ["", f"Same run: ours ≥ DeepGEMM at {s['ours_ge_deepgemm_same_run']} of {s['points']} points; geometric mean "
           f"of DeepGEMM time / our time {s['geomean_ours_over_deepgemm_same_run']:.3f}, lowest point "
           f"{s['min_ours_over_deepgemm_same_run']:.3f}."]
    if design:  # shapes of the reference table (docs/design.md) only
        md += [f"Against the reference table (another run): ours ≥ at {s['ours_ge_design_table']} of {len(design)}; "
               f"geometric mean {s['geomean_ours_over_design_table']:.3f}. DeepGEMM in this run / the table's DeepGEMM: "
               f"geometric mean {s['geomean_deepgemm_same_run_over_design_table']:.3f}."]
    md += [f"Largest relative Frobenius error against the fp32 product of the dequantized operands: DeepGEMM "
           f"{s['max_err_deepgemm']:.2e}, ours {s['max_err_ours']:.2e}; every element finite: {s['all_finite']}."]
    if "geomean_b_over_ours" in s:
        md += ["", f"Build B (--lib-b, interleaved): time A / time B geometric mean {s['geomean_b_over_ours']:.4f}; "
               f"B ≥ DeepGEMM at {s['b_ge_deepgemm_same_run']} of {s['points']}, geometric mean "
               f"{s['geomean_b_over_deepgemm_same_run']:.3f}; against the reference table ≥ at {s['b_ge_design_table']} of "
               f"{len(design)}, geometric mean {s['geomean_b_over_design_table']:.3f}; output bitwise equal to A at "
               f"every point: {s['b_bitwise_equal_all']}."]
    with open(os.path.join(a.out, "compare_deepgemm.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
