"""GPU benchmark of the Python package (python -m fp8proj.bench --out DIR), on a Hopper GPU.

(a) overhead: per-call cost of each op over the C ABI call it wraps, same process, eager, at
    M = 1 and M = 4096. Host time per call is measured with the GPU held busy by a sleep kernel
    (so the launch queue never fills and the host never waits for the device); device time per
    call from CUDA events around back-to-back calls; the variants' batches alternate, so that
    clock drift hits them alike. Rows: "c" (ctypes call into
    libfp8proj_c, outputs preallocated), "op" (torch.ops.fp8proj.*, through the dispatcher,
    outputs allocated), "module" (Fp8ProjLinear / Fp8ProjRMSNormLinear eager, which calls the
    C ABI directly).
(b) model: transformers DeepseekV3ForCausalLM with GLM-5 and DeepSeek-V3 attention dimensions,
    2 dense layers, random init, bf16, prefill of C x 1024 tokens for C in {4, 16, 64}: the
    original model ("off") and the patched one ("on", fp8proj.integrations.transformers.patch)
    in the same process, interleaved run by run (the order alternates), after warm-up; CUDA
    events time the attention modules (hooks) and the whole forward; medians. Logits' relative
    error of "on" against "off" (Frobenius norm, fp32).

(c) fp8ckpt: FP8 checkpoints as users load them (transformers FP8Linear), against the same
    checkpoint loaded with dequantize=True (bf16) and against DeepGEMM through the same module
    interface where deep_gemm imports: per projection, whole-model prefill and decode step,
    weight memory (fp8proj/bench_fp8ckpt.py says how).

(d) decode: the transformers decode step (StaticCache, context 1024, C sequences) captured as a
    CUDA graph, bf16 against patch(policy="all", targets=ALL_TARGETS) on the same model and cache;
    the attention's share from graphs with every self_attn stubbed out (fp8proj/bench_decode.py
    says how).

(e) fp8ckpt_norm: q_a_layernorm + an FP8-checkpoint q_b_proj at M = --norm-m, the norm fused into the
    module (one rmsnorm_quantize pass with fp32 scales) against the norm module then the module, and
    against bf16 (fp8proj/bench_fp8ckpt.py: norm_fold).

Writes overhead.csv, model.csv, fp8ckpt_proj.csv, fp8ckpt_model.csv, fp8ckpt_norm.csv, decode.csv, results.json and
results.md to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

BF16, E4M3, F32 = torch.bfloat16, torch.float8_e4m3fn, torch.float32

# name: (hidden, heads, q_lora, kv_lora, nope, rope, v, intermediate)
MODELS = {
    "glm5": (6144, 64, 2048, 512, 192, 64, 256, 12288),
    "deepseek-v3": (7168, 128, 1536, 512, 128, 64, 128, 18432),
}


def model_config(name: str, layers: int = 2, vocab: int = 16384):
    """A DeepseekV3Config with `name`'s attention dimensions, `layers` dense layers (no MoE)."""
    from transformers import DeepseekV3Config
    h, heads, ql, kvl, nope, rope, v, inter = MODELS[name]
    return DeepseekV3Config(vocab_size=vocab, hidden_size=h, intermediate_size=inter, num_hidden_layers=layers,
                            num_attention_heads=heads, num_key_value_heads=heads, q_lora_rank=ql, kv_lora_rank=kvl,
                            qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v,
                            first_k_dense_replace=layers + 1000, n_routed_experts=8, num_experts_per_tok=2,
                            moe_intermediate_size=256, max_position_embeddings=8192, use_cache=False)


# ---- (a) per-call overhead ------------------------------------------------------------------------

def _host_us_per_call(fns, calls: int, batches: int) -> list:
    """Median host time of one call of each of fns, with the device kept busy so launches never
    block. The variants' batches alternate (c, op, module, c, op, ...), so that the host's clock
    drift hits them alike."""
    per = [[] for _ in fns]
    for _ in range(batches):
        for i, fn in enumerate(fns):
            torch.cuda.synchronize()
            torch.cuda._sleep(int(calls * 60e-6 * 2e9))  # ~60 us of GPU time per call queued ahead
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            per[i].append((time.perf_counter() - t0) / calls * 1e6)
    torch.cuda.synchronize()
    return [statistics.median(p) for p in per]


def _device_us_per_call(fns, calls: int, batches: int) -> list:
    """Median device time of one call of each of fns (back-to-back calls between two events),
    batches alternating between the variants."""
    per = [[] for _ in fns]
    for _ in range(batches):
        for i, fn in enumerate(fns):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(calls):
                fn()
            b.record()
            b.synchronize()
            per[i].append(a.elapsed_time(b) * 1e3 / calls)
    return [statistics.median(p) for p in per]


@torch.no_grad()  # inference: with autograd recording, the modules would take torch's bf16 path
def overhead(calls: int, batches: int) -> list:
    from fp8proj import _handles, _lib, ops
    from fp8proj.torch import Fp8ProjLinear, Fp8ProjRMSNormLinear
    from torch import nn

    L = _lib.LIB
    rows = []
    stream = torch.cuda.current_stream().cuda_stream
    torch.manual_seed(0)
    # GLM-5's q_b_proj (16384 x 2048, after q_a_layernorm) and o_proj (6144 x 16384).
    qb = nn.Linear(2048, 16384, bias=False, dtype=BF16, device="cuda")
    op = nn.Linear(16384, 6144, bias=False, dtype=BF16, device="cuda")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm
    norm = DeepseekV3RMSNorm(2048, eps=1e-6).to(device="cuda", dtype=BF16)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(2048) + 0.5)
    norm_w = norm.weight.detach()
    force = dict(enabled=True, policy="all", threshold=0)  # FP8 at every M: the overhead of the FP8 path
    o_mod = Fp8ProjLinear.from_linear(op, name="o_proj", **force)
    q_mod = Fp8ProjRMSNormLinear.from_modules(norm, qb, name="q_b_proj", **force)
    o_ref = _handles.Projection(op.weight.detach(), name="o_proj_c", **force)
    q_ref = _handles.Projection(qb.weight.detach(), name="q_b_proj_c", rmsnorm_input=True, **force)
    wv, ws = ops.quantize_weight(op.weight.detach())

    for m in (1, 4096):
        ld = (m + 3) // 4 * 4
        x16k = torch.randn(m, 16384, dtype=BF16, device="cuda")
        x2k = torch.randn(m, 2048, dtype=BF16, device="cuda")
        xv = torch.empty(m, 16384, dtype=E4M3, device="cuda")
        xs = torch.empty(128, ld, dtype=F32, device="cuda")
        xv2 = torch.empty(m, 2048, dtype=E4M3, device="cuda")
        xs2 = torch.empty(16, ld, dtype=F32, device="cuda")
        y6k = torch.empty(m, 6144, dtype=BF16, device="cuda")
        y16k = torch.empty(m, 16384, dtype=BF16, device="cuda")
        ops.quantize_activation(x16k)  # plans and first-call work outside the timing
        qv, qs = ops.quantize_activation(x16k)
        ops.fp8_gemm(qv, qs, wv, ws)
        gemm = ops._GEMMS.get(wv, ws, m)
        # The op's arguments bound once, as x16k and norm_w are: what is timed is the op, not
        # nn.Module's attribute lookup (the "module" rows time the whole module call).
        o_w, o_id, q_w, q_id = o_mod.weight, o_mod._proj.id, q_mod.weight, q_mod._proj.id
        cases = {
            "quantize_activation": {
                "c": lambda: L.fp8proj_quantize_activation(x16k.data_ptr(), 16384, m, 16384, xv.data_ptr(),
                                                           xs.data_ptr(), ld, stream),
                "op": lambda: torch.ops.fp8proj.quantize_activation(x16k)},
            "rmsnorm_quantize": {
                "c": lambda: L.fp8proj_rmsnorm_quantize(x2k.data_ptr(), 2048, norm_w.data_ptr(), 1e-6, m, 2048,
                                                        xv2.data_ptr(), xs2.data_ptr(), ld, stream),
                "op": lambda: torch.ops.fp8proj.rmsnorm_quantize(x2k, norm_w, 1e-6)},
            "fp8_gemm": {
                "c": lambda: L.fp8proj_fp8_gemm_run(gemm, qv.data_ptr(), qs.data_ptr(), qs.shape[1], m,
                                                    y6k.data_ptr(), stream),
                "op": lambda: torch.ops.fp8proj.fp8_gemm(qv, qs, wv, ws)},
            "linear": {
                "c": lambda: L.fp8proj_projection_forward(o_ref.handle, x16k.data_ptr(), m, y6k.data_ptr(), stream),
                "op": lambda: torch.ops.fp8proj.linear(x16k, o_w, o_id),
                "module": lambda: o_mod(x16k)},
            "rmsnorm_linear": {
                "c": lambda: L.fp8proj_projection_forward_rmsnorm(q_ref.handle, x2k.data_ptr(), 2048,
                                                                  norm_w.data_ptr(), 1e-6, m, y16k.data_ptr(), stream),
                "op": lambda: torch.ops.fp8proj.rmsnorm_linear(x2k, norm_w, 1e-6, q_w, q_id),
                "module": lambda: q_mod(x2k)},
        }
        if m == 1:
            w16 = op.weight.detach()
            wv_o, ws_o = torch.empty_like(wv), torch.empty_like(ws)
            cases["quantize_weight"] = {
                "c": lambda: L.fp8proj_quantize_weight(w16.data_ptr(), 6144, 16384, wv_o.data_ptr(), ws_o.data_ptr(),
                                                       stream),
                "op": lambda: torch.ops.fp8proj.quantize_weight(w16)}
        for name, variants in cases.items():
            for fn in variants.values():
                fn()
            n_calls = calls if m == 1 else max(10, calls // 10)
            kinds = list(variants)  # "c" first: the reference of the same run
            hosts = dict(zip(kinds, _host_us_per_call([variants[k] for k in kinds], n_calls, batches)))
            devs = dict(zip(kinds, _device_us_per_call([variants[k] for k in kinds], n_calls, batches)))
            c_host, c_dev = hosts["c"], devs["c"]
            for kind in kinds:
                host, dev = hosts[kind], devs[kind]
                rows.append(dict(op=name, m=m if name != "quantize_weight" else 6144, path=kind,
                                 host_us=round(host, 3), device_us=round(dev, 3),
                                 host_overhead_us=round(host - c_host, 3), device_overhead_us=round(dev - c_dev, 3)))
                print(f"[overhead] {name:20s} M={m:5d} {kind:6s} host {host:8.2f} us (+{host - c_host:6.2f}) "
                      f"device {dev:9.2f} us (+{dev - c_dev:6.2f})", flush=True)
    return rows


# ---- (b) the transformers model ---------------------------------------------------------------------

class _AttnTimer:
    """CUDA events around every attention module's forward (pre/post hooks), summed per forward."""

    def __init__(self, modules):
        self.pairs, self.handles = [], []
        for m in modules:
            self.handles.append(m.register_forward_pre_hook(self._pre))
            self.handles.append(m.register_forward_hook(self._post))

    def _pre(self, mod, args):
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        self.pairs.append([e, None])

    def _post(self, mod, args, out):
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        self.pairs[-1][1] = e

    def take_ms(self) -> float:
        t = sum(a.elapsed_time(b) for a, b in self.pairs)
        self.pairs = []
        return t


@torch.no_grad()
def model_bench(names, chunks, reps: int, warmup: int, layers: int,
                targets=("q_b_proj", "o_proj"), max_tokens: int = 0) -> list:
    """max_tokens: the modules' workspace rows (larger prefills run in chunks of that many);
    0 = the largest prefill of the run, as an engine sizes it to its largest batch."""
    import transformers
    from fp8proj.integrations.transformers import patch

    rows = []
    for name in names:
        torch.manual_seed(0)
        cfg = model_config(name, layers=layers)
        with torch.device("cuda"):  # random init on the GPU: seconds instead of minutes for ~1.4B parameters
            model = transformers.DeepseekV3ForCausalLM(cfg).to(dtype=BF16).eval()
        attns = [layer.self_attn for layer in model.model.layers]
        before = [(a, attr, getattr(a, attr)) for a in attns for attr in ("q_a_layernorm",) + tuple(targets)
                  if hasattr(a, attr)]  # ALL_TARGETS names q_proj too, absent with a q LoRA
        rows_ws = max_tokens or max(chunks) * 1024
        # policy prefill, the tuned table's gate; one shared workspace of rows_ws rows per kind
        report = patch(model, enabled=True, targets=tuple(targets), max_tokens=rows_ws)
        after = [(a, attr, getattr(a, attr)) for a, attr, _ in before]
        print(report, flush=True)
        extra = sum(getattr(m, "extra_memory_bytes", lambda: 0)() for _, _, m in after)

        def mode(on: bool):
            for a, attr, m in (after if on else before):
                setattr(a, attr, m)

        timer = _AttnTimer(attns)
        for c in chunks:
            ids = torch.randint(0, cfg.vocab_size, (c, 1024), device="cuda")
            times = {False: [], True: []}
            attn_times = {False: [], True: []}
            logits = {}
            with torch.no_grad():
                for r in range(warmup + reps):
                    order = (False, True) if r % 2 == 0 else (True, False)
                    for on in order:
                        mode(on)
                        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        a.record()
                        out = model(input_ids=ids, use_cache=False).logits
                        b.record()
                        b.synchronize()
                        at = timer.take_ms()
                        if r >= warmup:
                            times[on].append(a.elapsed_time(b))
                            attn_times[on].append(at)
                        if r == warmup:
                            logits[on] = out.float()
                        del out
            rel = ((logits[True] - logits[False]).norm() / logits[False].norm()).item()
            del logits
            mo, mn = statistics.median(times[False]), statistics.median(times[True])
            ao, an = statistics.median(attn_times[False]), statistics.median(attn_times[True])
            row = dict(model=name, chunks=c, tokens=c * 1024, layers=layers, reps=reps, max_tokens=rows_ws,
                       attn_off_ms=round(ao, 3), attn_on_ms=round(an, 3), attn_speedup=round(ao / an, 4),
                       model_off_ms=round(mo, 3), model_on_ms=round(mn, 3), model_speedup=round(mo / mn, 4),
                       logits_rel_err=float(f"{rel:.3e}"), fp8_extra_bytes=extra)
            mode(True)
            row["explain_o_proj"] = attns[0].o_proj.explain(c * 1024)
            rows.append(row)
            print(f"[model] {name} C={c}: attention {ao:.2f} -> {an:.2f} ms ({ao / an:.3f}x), model {mo:.2f} -> "
                  f"{mn:.2f} ms ({mo / mn:.3f}x), logits rel err {rel:.2e}", flush=True)
            torch.cuda.empty_cache()
        for h in timer.handles:
            h.remove()
        del model
        torch.cuda.empty_cache()
    return rows


def _write(out: Path, overhead_rows, model_rows, meta, fp8ckpt=None, decode=None) -> None:
    import csv
    out.mkdir(parents=True, exist_ok=True)
    fp8ckpt = fp8ckpt or {"projections": [], "model": [], "memory": []}
    decode = decode or []
    for fname, rows in (("overhead.csv", overhead_rows), ("model.csv", model_rows),
                        ("fp8ckpt_proj.csv", fp8ckpt["projections"]), ("fp8ckpt_model.csv", fp8ckpt["model"]),
                        ("fp8ckpt_norm.csv", fp8ckpt.get("norm_fold", [])), ("decode.csv", decode)):
        if rows:
            fields = list(dict.fromkeys(k for r in rows for k in r))
            with open(out / fname, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=fields)
                w.writeheader()
                w.writerows(rows)
    (out / "results.json").write_text(json.dumps(dict(meta=meta, overhead=overhead_rows, model=model_rows,
                                                      fp8ckpt=fp8ckpt, decode=decode), indent=1, default=str))
    md = [f"# fp8proj Python package on {meta['gpu']}", "", f"Command: `{meta['command']}`", "",
          f"torch {meta['torch']}, transformers {meta['transformers']}, library {meta['library']}, "
          f"host CPU {meta.get('cpu', 'unknown')}", ""]
    if overhead_rows:
        md += ["## Per-call overhead over the C ABI call (eager)", "",
               "| op | M | path | host us/call | over C | device us/call | over C |", "|---|---|---|---|---|---|---|"]
        md += [f"| {r['op']} | {r['m']} | {r['path']} | {r['host_us']:.2f} | {r['host_overhead_us']:+.2f} | "
               f"{r['device_us']:.2f} | {r['device_overhead_us']:+.2f} |" for r in overhead_rows]
        md.append("")
    if model_rows:
        md += ["## transformers DeepseekV3ForCausalLM, prefill C x 1024 tokens, flag off vs on (same run)", "",
               "| model | C | attention off ms | on ms | speedup | model off ms | on ms | speedup | logits rel err |",
               "|---|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['model']} | {r['chunks']} | {r['attn_off_ms']:.2f} | {r['attn_on_ms']:.2f} | "
               f"{r['attn_speedup']:.3f}x | {r['model_off_ms']:.2f} | {r['model_on_ms']:.2f} | "
               f"{r['model_speedup']:.3f}x | {r['logits_rel_err']:.2e} |" for r in model_rows]
        md += ["", f"Workspace rows (max_tokens): {sorted({r['max_tokens'] for r in model_rows})}; a prefill "
               "longer than that runs in chunks of that many rows."]
    if fp8ckpt["projections"] or fp8ckpt["model"]:
        from .bench_fp8ckpt import summarize
        md += [""] + summarize(fp8ckpt["projections"], fp8ckpt["model"], fp8ckpt["memory"])
    if fp8ckpt.get("norm_fold"):
        md += ["", "## q_a_layernorm + an FP8-checkpoint q_b_proj: the norm fused (one rmsnorm_quantize pass) or not", "",
               "| model | M | unfused us | fused us | fused / unfused | bf16 us | fused over bf16 | unfused over bf16 | "
               "rel err fused / unfused (vs the exact norm's product) |", "|---|---|---|---|---|---|---|---|---|"]
        md += [f"| {r['model']} | {r['m']} | {r['unfused_us']:.1f} | {r['fused_us']:.1f} | "
               f"{r['fused_over_unfused']:.3f}x | {r['bf16_us']:.1f} | {r['fused_over_bf16']:.3f}x | "
               f"{r['unfused_over_bf16']:.3f}x | {r['rel_err_fused']:.2e} / {r['rel_err_unfused']:.2e} |"
               for r in fp8ckpt["norm_fold"]]
    if decode:
        from .bench_decode import summarize as summarize_decode
        md += [""] + summarize_decode(decode)
    (out / "results.md").write_text("\n".join(md) + "\n")


def _cpu_name() -> str:
    """The host CPU's model name: host-side overhead scales with it."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


PARTS = ("overhead", "model", "fp8ckpt", "fp8ckpt_norm", "decode")


def parse_args(argv=None) -> argparse.Namespace:
    """The arguments, checked before anything runs: parts, models, and the batch lists as ints."""
    ap = argparse.ArgumentParser(prog="python -m fp8proj.bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for overhead.csv, model.csv, results.json, results.md")
    ap.add_argument("--parts", default="overhead,model",
                    help="overhead, model, fp8ckpt, fp8ckpt_norm, decode (comma-separated; fp8ckpt: FP8 checkpoints, "
                         "fp8ckpt_norm: q_a_layernorm fused into an FP8-checkpoint q_b_proj at M = --norm-m, "
                         "bench_fp8ckpt.py; decode: the decode step under CUDA graphs, bench_decode.py)")
    ap.add_argument("--models", default="glm5,deepseek-v3")
    ap.add_argument("--chunks", default="4,16,64", help="prefill batches of 1024 tokens")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--targets", default="q_b_proj,o_proj",
                    help="the attention's projections to patch, comma-separated, or 'all' (every dense "
                         "projection: q_a_proj,q_b_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj)")
    ap.add_argument("--max-tokens", type=int, default=0,
                    help="the patched modules' workspace rows (a call with more rows runs in chunks); "
                         "default: model, the largest prefill of --chunks; decode, patch()'s default")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    # At most ~200 calls (<= 600 launches) per batch: the launch queue must not fill while the
    # sleep kernel holds the GPU, or the host would wait for the device after all.
    ap.add_argument("--calls", type=int, default=200, help="calls per timed batch at M=1 (M=4096: a tenth)")
    ap.add_argument("--batches", type=int, default=25)
    ap.add_argument("--decode", default="16,64", help="fp8ckpt, decode: decode batches (sequences at context 1024)")
    ap.add_argument("--norm-m", default="16,64,4096,16384", help="fp8ckpt_norm: token counts M")
    ap.add_argument("--decode-reps", type=int, default=200,
                    help="decode: timed rounds of the four graphs (a round takes a few ms)")
    ap.add_argument("--dg-prewarm", type=int, default=0,
                    help="fp8ckpt: compile DeepGEMM's kernels for every problem in this many processes first")
    ap.add_argument("--ckpt-dir", default="",
                    help="fp8ckpt: where the FP8 checkpoints are written (reused when present); default OUT/ckpt")
    a = ap.parse_args(argv)
    parts = a.parts.split(",")
    if set(parts) - set(PARTS):
        ap.error(f"--parts: unknown {sorted(set(parts) - set(PARTS))}; known: {','.join(PARTS)}")
    if set(a.models.split(",")) - set(MODELS):
        ap.error(f"--models: unknown {sorted(set(a.models.split(',')) - set(MODELS))}; known: {','.join(MODELS)}")
    for opt in ("chunks", "decode", "norm_m"):
        flag = "--" + opt.replace("_", "-")
        try:
            vals = [int(c) for c in getattr(a, opt).split(",") if c]
        except ValueError:
            ap.error(f"{flag}: comma-separated positive integers, got {getattr(a, opt)!r}")
        if any(x <= 0 for x in vals):
            ap.error(f"{flag}: comma-separated positive integers, got {getattr(a, opt)!r}")
        setattr(a, opt + "_list", vals)
    if "fp8ckpt_norm" in parts and not a.norm_m_list:
        ap.error("--parts fp8ckpt_norm needs --norm-m token counts (e.g. 16,64,4096)")
    if "decode" in parts and not a.decode_list:
        ap.error("--parts decode needs --decode batches (e.g. 16,64)")
    a.part_set = set(parts)
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    import fp8proj
    ok, why = fp8proj.cuda_status()
    if not ok:
        print(f"fp8proj.bench needs a Hopper GPU and the CUDA build of libfp8proj_c: {why}", file=sys.stderr)
        return 2
    import transformers
    parts = a.part_set
    meta = dict(command="python -m fp8proj.bench " + " ".join(argv if argv is not None else sys.argv[1:]),
                gpu=torch.cuda.get_device_name(), torch=torch.__version__, transformers=transformers.__version__,
                library=fp8proj.library_version(), python=platform.python_version(), cpu=_cpu_name(),
                tune_file=os.environ.get("FP8PROJ_TUNE_FILE", ""))
    ov = overhead(a.calls, a.batches) if "overhead" in parts else []
    _write(Path(a.out), ov, [], meta)
    from fp8proj.integrations.transformers import ALL_TARGETS
    targets = ALL_TARGETS if a.targets == "all" else tuple(a.targets.split(","))
    md = model_bench(a.models.split(","), a.chunks_list, a.reps, a.warmup,
                     a.layers, targets, a.max_tokens) if "model" in parts else []
    _write(Path(a.out), ov, md, meta)
    ck = None
    if "fp8ckpt" in parts:
        from .bench_fp8ckpt import bench_model as fp8ckpt_bench
        ck = {"projections": [], "model": [], "memory": []}
        ckpt_root = Path(a.ckpt_dir) if a.ckpt_dir else Path(a.out) / "ckpt"
        for name in a.models.split(","):
            p, m, mem = fp8ckpt_bench(name, model_config(name, layers=a.layers), ckpt_root / f"{name}-{a.layers}l",
                                      a.chunks_list, a.decode_list,
                                      a.reps, a.warmup, log=lambda s: print(s, flush=True),
                                      dg_prewarm=a.dg_prewarm)
            ck["projections"] += p
            ck["model"] += m
            ck["memory"].append(mem)
            _write(Path(a.out), ov, md, meta, ck)  # after each model: a cut-off run keeps what it measured
    if "fp8ckpt_norm" in parts:
        from .bench_fp8ckpt import norm_fold
        rows = []
        for name in a.models.split(","):
            rows += norm_fold(name, model_config(name, layers=a.layers), a.norm_m_list,
                              max(a.reps, 20), max(a.warmup, 5), log=lambda s: print(s, flush=True))
        ck = ck or {"projections": [], "model": [], "memory": []}
        ck["norm_fold"] = rows
        _write(Path(a.out), ov, md, meta, ck)
    dec = []
    if "decode" in parts:
        from .bench_decode import bench_model as decode_bench
        for name in a.models.split(","):
            # At least 10 warm-up rounds: a round is a few ms, and the clocks settle over tens of ms.
            dec += decode_bench(name, model_config(name, layers=a.layers), a.decode_list, a.decode_reps,
                                max(a.warmup, 10), log=lambda s: print(s, flush=True),
                                max_tokens=a.max_tokens)
            _write(Path(a.out), ov, md, meta, ck, dec)  # after each model, as above
    _write(Path(a.out), ov, md, meta, ck, dec)
    print(f"wrote {a.out}/results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
