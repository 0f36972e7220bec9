#!/usr/bin/env python3
"""Session 13 experiment: why does our small-M GEMM time 1.3 us longer in compare_deepgemm.py's
regime than in the harness's? Same operands, same kernel (the C API, tuned table), cuBLAS bf16
alongside; the timing regime varied one knob at a time."""
import os, sys, statistics, ctypes
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../scripts"))
from compare_deepgemm import Fp8Proj, quantize_blocks, quantize_activation  # noqa: E402

lib = sys.argv[1]
reps = int(sys.argv[2]) if len(sys.argv) > 2 else 41
dev = torch.device("cuda")
torch.backends.cuda.matmul.allow_tf32 = False
ours = Fp8Proj(lib)
L2 = torch.cuda.get_device_properties(0).L2_cache_size
buf120 = torch.empty(2 * max(L2, 50 << 20), dtype=torch.uint8, device=dev)
buf256 = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
cudart = None
for cand in ("libcudart.so.13", "libcudart.so", "/usr/local/cuda/lib64/libcudart.so"):
    try:
        cudart = ctypes.CDLL(cand)
        break
    except OSError:
        pass
assert cudart is not None, "no libcudart"


def memset(buf, v):
    cudart.cudaMemsetAsync(ctypes.c_void_p(buf.data_ptr()), ctypes.c_int(v), ctypes.c_size_t(buf.numel()),
                           ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))


def timed(fns, flush, sleep=True, sync_each=False, pre=None):
    for _ in range(5):
        for f in fns:
            f()
    torch.cuda.synchronize()
    ev = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in fns] for _ in range(reps)]
    for r in range(reps):
        if sleep:
            torch.cuda._sleep(1_000_000)
        for i, f in enumerate(fns):
            e0, e1 = ev[r][i]
            flush(r)
            if pre:
                pre()
            e0.record()
            f()
            e1.record()
            if sync_each:
                torch.cuda.synchronize()
    torch.cuda.synchronize()
    return [statistics.median(ev[r][i][0].elapsed_time(ev[r][i][1]) * 1000 for r in range(reps)) for i in range(len(fns))]


variants = {
    "compare (fill_ 120MB, sleep)": dict(flush=lambda r: buf120.fill_(0x5A)),
    "fill_ 120MB, sync each": dict(flush=lambda r: buf120.fill_(0x5A), sleep=False, sync_each=True),
    "memset 120MB, sleep": dict(flush=lambda r: memset(buf120, r & 0xFF)),
    "memset 256MB, sleep": dict(flush=lambda r: memset(buf256, r & 0xFF)),
    "memset 256MB, sync each (harness)": dict(flush=lambda r: memset(buf256, r & 0xFF), sleep=False, sync_each=True),
    "fill_ 120MB, sleep, +empty op": dict(flush=lambda r: buf120.fill_(0x5A), pre=lambda: torch.cuda._sleep(1)),
}
problems = [(4096, 2048, 16), (4096, 2048, 64), (4096, 2048, 128), (16384, 2048, 16), (6144, 4096, 16),
            (7168, 16384, 16), (16384, 2048, 4096)]
print(f"reps {reps}; lib {ours.version}")
for (n, k, m) in problems:
    g = torch.Generator(device=dev)
    g.manual_seed(n * 7 + k)
    w = (torch.randn(n, k, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    x = torch.randn(m, k, device=dev, generator=g).to(torch.bfloat16)
    wq, ws = quantize_blocks(w, 128)
    h = ours.plan(wq, ws, max(m, 16))
    xq, xs_buf, xs_view, ld = quantize_activation(x)
    yb = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
    yo = torch.empty_like(yb)
    wt = w.t()
    fns = [lambda: torch.matmul(x, wt, out=yb), lambda: ours.run(h, xq, xs_buf, ld, m, yo)]
    for name, kw in variants.items():
        tb, to = timed(fns, **kw)
        print(f"{n}x{k} M={m:<5} {name:38s} bf16 {tb:8.2f} us  ours {to:8.2f} us  ratio {tb / to:.3f}", flush=True)
    ours.lib.fp8proj_fp8_gemm_destroy(h)
