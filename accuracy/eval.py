"""What FP8 projections do to a trained model's predictions: the held-out plays through the
accuracy model with bf16 projections and with fp8proj's FP8 path, against the fp32 floor.

    python3 accuracy/eval.py --checkpoint DIR [--config accuracy/config.json] [--data .data] --out OUT
                             [--weight-scales ue8m0|float|ue8m0,float]

Runs (one model each, all fed the same batches):
  fp32                 the checkpoint in fp32 (TF32 off): the reference for the noise floor
  bf16                 the checkpoint in bf16: the reference for every FP8 run
  fp8 prefill|all      fp8proj.integrations.transformers.patch(policy=...), q_b_proj and o_proj
  fp8 ... +q_a,kv_a,kv_b  the same with every attention projection offered to the patch; what
                       the package declines is listed with its reason
  fp8 emulated         q_b_proj and o_proj through a torch emulation of the same recipe (1x128
                       activation groups, 128x128 weight blocks, power-of-two scales at or above
                       amax/448, e4m3 values, fp32 product, bf16 output) where M > 512, as the
                       prefill gate does: the expected numerics, on any device; on the GPU the
                       fp8proj rows should land beside it
With --weight-scales ue8m0,float every FP8 run (the emulation included) runs once per scale format of
the FP8 weight copies (suffix "[w ue8m0]" / "[w float]"), all on the same batches: the two formats
side by side, each against bf16 and fp32.
Per run against its reference, over every predicted position of non-overlapping windows of
seq_len bytes (batch x seq_len tokens per call, so M > 512 and the prefill gate engages): bits
per byte, KL(reference || run) of the next-byte distribution (mean, median, p99, max, as
llama.cpp's --kl-divergence reports them), top-1 agreement; then greedy continuations of
new_tokens bytes from `prompts` prompts of the held-out text: bytes before the first
divergence, prompts identical throughout, per-position agreement.

Without fp8proj or a Hopper GPU the FP8 runs are listed as "fp8proj unavailable: <reason>" and
skipped, and the rest runs (this is how the CPU test exercises the script at a tiny size).
Writes OUT/eval.json, OUT/eval.csv, OUT/eval.md.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import time
from pathlib import Path

import numpy as np
import torch

from common import DEFAULT_CONFIG, DEFAULT_DATA, load_config, read_bytes, split_corpus, versions

DEFAULT_TARGETS = ("q_b_proj", "o_proj")
ALL_TARGETS = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")

# The bars of the accuracy issue: FP8 against bf16.
BARS = {"bpb_rel_increase": 0.005, "kl_mean": 1e-3, "top1": 0.99}


E4M3_MAX = 448.0


def _float_scale(amax: torch.Tensor, eps: float) -> torch.Tensor:
    """fp8proj's fp32 ("float") rule: fl32(max(amax, eps) / 448). The divisor is a tensor: torch
    divides by a Python scalar as a multiplication by its reciprocal on CUDA, another rounding."""
    a = amax.float().clamp_min(eps)
    return a / torch.full_like(a, E4M3_MAX)


def _pow2_scale(amax: torch.Tensor) -> torch.Tensor:
    """The power of two at or above amax/448 (fp8proj's UE8M0 rule), amax clamped at 1e-10."""
    q = amax.float().clamp_min(1e-10) / E4M3_MAX
    s = torch.exp2(torch.ceil(torch.log2(q)))
    s = torch.where(s < q, s * 2, s)  # a float log2 can round across a power of two
    return torch.where(s * 0.5 >= q, s * 0.5, s)


def emulate_weight(w: torch.Tensor, scales: str = "ue8m0") -> torch.Tensor:
    """dequant(quant(W)) in fp32 with 128x128 blocks (the last row block may be partial); scales
    "ue8m0" (power of two at or above amax/448, amax clamped at 1e-10 here as for activations:
    the weights' 1e-4 clamp never binds on a trained projection) or "float" (amax/448, 1e-4)."""
    n, k = w.shape
    assert k % 128 == 0, "K must be a multiple of 128"
    pad = (-n) % 128
    wp = torch.nn.functional.pad(w.float(), (0, 0, 0, pad)).view((n + pad) // 128, 128, k // 128, 128)
    amax = wp.abs().amax(dim=(1, 3), keepdim=True)
    s = _pow2_scale(amax) if scales == "ue8m0" else _float_scale(amax, 1e-4)
    q = (wp / s).to(torch.float8_e4m3fn).float() * s
    return q.view(n + pad, k)[:n]


def emulate_activation(x: torch.Tensor) -> torch.Tensor:
    m, k = x.shape
    g = x.float().view(m, k // 128, 128)
    s = _pow2_scale(g.abs().amax(dim=-1, keepdim=True))
    return ((g / s).to(torch.float8_e4m3fn).float() * s).view(m, k)


class EmulatedFp8Linear(torch.nn.Module):
    """A bias-free nn.Linear whose calls with M > threshold rows run the block-scaled FP8 recipe
    in torch: the expected numerics of fp8proj's FP8 path, on any device."""

    def __init__(self, linear: torch.nn.Linear, threshold: int = 512, scales: str = "ue8m0"):
        super().__init__()
        self.linear, self.threshold = linear, threshold
        self.wq = emulate_weight(linear.weight.detach(), scales)
        self.fp8_calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        if x2.shape[0] <= self.threshold:
            return self.linear(x)
        self.fp8_calls += 1
        y = emulate_activation(x2) @ self.wq.T
        return y.to(x.dtype).view(*x.shape[:-1], -1)


def emulate_patch(model, targets=DEFAULT_TARGETS, threshold: int = 512, scales: str = "ue8m0") -> list[str]:
    names = []
    for name, mod in list(model.named_modules()):
        for t in targets:
            lin = getattr(mod, t, None)
            if isinstance(lin, torch.nn.Linear) and lin.bias is None and lin.in_features % 128 == 0:
                setattr(mod, t, EmulatedFp8Linear(lin, threshold, scales))
                names.append(f"{name}.{t}")
    return names


def fp8_unavailable_reason(device: torch.device) -> str | None:
    """None when fp8proj can run its FP8 path here, else why not."""
    try:
        import fp8proj
        import fp8proj.integrations.transformers  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure is a reason, reported verbatim
        return f"cannot import fp8proj ({type(e).__name__}: {e})"
    ok, why = fp8proj.cuda_status()
    if not ok:
        return why or "fp8proj.cuda_status() is False"
    if device.type != "cuda":
        return f"evaluation runs on {device}, not on the GPU"
    return None


def load_model(ckpt: Path, dtype: torch.dtype, device: torch.device):
    from transformers import DeepseekV3ForCausalLM

    model = DeepseekV3ForCausalLM.from_pretrained(ckpt, dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval()


class Run:
    def __init__(self, name: str, dtype: torch.dtype, policy: str | None = None, targets=None,
                 emulated: bool = False, scales: str = "ue8m0", emulation: str = ""):
        self.name, self.dtype, self.policy, self.targets = name, dtype, policy, targets
        self.emulated = emulated
        self.scales = scales        # the FP8 weight copies' scale format
        self.emulation = emulation  # the name of the emulated run with the same recipe
        self.model = None
        self.status = "ok"
        self.patched: list[str] = []
        self.skipped: list[tuple[str, str]] = []
        self.explain: str = ""
        self.fp8_modules_at_m = 0
        self.nll: list[np.ndarray] = []
        self.logp_last = None
        self.seconds = 0.0
        self.greedy = None

    @property
    def fp8(self) -> bool:
        return self.policy is not None or self.emulated


def patch_run(run: Run, m_eval: int) -> None:
    from fp8proj.integrations.transformers import patch

    try:
        report = patch(run.model, enabled=True, policy=run.policy, targets=run.targets, scales=run.scales)
    except Exception as e:  # noqa: BLE001 - the package's refusal is a result, reported
        run.status = f"patch failed: {type(e).__name__}: {e}"
        return
    run.patched = list(report.patched)
    run.skipped = [(str(n), str(r)) for n, r in report.skipped]
    if not run.patched:
        run.status = "nothing patched: " + "; ".join(f"{n}: {r}" for n, r in run.skipped[:5])
        return
    engaged = 0
    for name in run.patched:
        mod = run.model.get_submodule(name)
        if hasattr(mod, "uses_fp8") and mod.uses_fp8(m_eval):
            engaged += 1
        if not run.explain and hasattr(mod, "explain"):
            run.explain = f"{name}: {mod.explain(m_eval)}"
    run.fp8_modules_at_m = engaged
    if engaged == 0:
        run.status = f"no patched module takes the FP8 path at M = {m_eval} ({run.explain})"


def stats(kl: np.ndarray) -> dict:
    return {"kl_mean": float(kl.mean()), "kl_median": float(np.median(kl)),
            "kl_p99": float(np.quantile(kl, 0.99)), "kl_max": float(kl.max())}


def greedy(model, prompts: torch.Tensor, new_tokens: int) -> torch.Tensor:
    from transformers import GenerationConfig

    gc = GenerationConfig(do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                          eos_token_id=None, pad_token_id=0, bos_token_id=None)
    with torch.no_grad():
        out = model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), generation_config=gc)
    return out[:, prompts.shape[1]:].cpu()


def greedy_agreement(a: torch.Tensor, b: torch.Tensor) -> dict:
    same = (a == b)
    n = same.shape[1]
    first_diff = torch.where(same.all(1), torch.full((same.shape[0],), n),
                             (~same).int().argmax(1))
    return {"greedy_prefix_mean": float(first_diff.float().mean()),
            "greedy_prefix_median": float(first_diff.float().median()),
            "greedy_identical": int(same.all(1).sum()), "greedy_prompts": int(same.shape[0]),
            "greedy_position_agreement": float(same.float().mean()), "greedy_new_tokens": n}


def fmt(v, spec):
    return "" if v is None else format(v, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description="bf16 vs fp8proj FP8 projections on the accuracy model")
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--config", default=str(DEFAULT_CONFIG))
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--weight-scales", default="ue8m0",
                    help="scale format(s) of the FP8 weight copies: ue8m0, float, or ue8m0,float (every FP8 run once "
                         "per format, same batches)")
    a = ap.parse_args()
    formats = list(dict.fromkeys(f.strip() for f in a.weight_scales.split(",") if f.strip()))
    if not formats or any(f not in ("ue8m0", "float") for f in formats):
        ap.error(f"--weight-scales {a.weight_scales!r}: expected ue8m0, float or ue8m0,float")
    cfg = load_config(a.config)
    e = cfg["eval"]
    device = torch.device(a.device)
    a.out.mkdir(parents=True, exist_ok=True)
    if device.type == "cuda":
        # The fp32 run is the floor: true fp32 GEMMs, not TF32.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False

    _, eval_files = split_corpus(cfg, a.data)
    text = torch.frombuffer(bytearray(read_bytes(eval_files)), dtype=torch.uint8).long()
    seq, bs = e["seq_len"], e["batch_size"]
    windows = min(e["max_windows"], text.numel() // seq)
    x_all = text[:windows * seq].view(windows, seq)
    m_eval = bs * seq
    print(f"eval: {windows} windows of {seq} bytes from {[p.name for p in eval_files]}, batch {bs} "
          f"(M = {m_eval} tokens per projection call)", flush=True)

    runs = [Run("fp32", torch.float32), Run("bf16", torch.bfloat16)]
    for f in formats:
        tag = "" if formats == ["ue8m0"] else f" [w {f}]"  # one format, the default: the names as before
        emulation = f"fp8 emulated (torch){tag}"
        for pol in ("prefill", "all"):
            runs.append(Run(f"fp8 {pol}{tag}", torch.bfloat16, pol, DEFAULT_TARGETS, scales=f, emulation=emulation))
        for pol in ("prefill", "all"):
            runs.append(Run(f"fp8 {pol} +q_a,kv_a,kv_b{tag}", torch.bfloat16, pol, ALL_TARGETS, scales=f))
        runs.append(Run(emulation, torch.bfloat16, None, DEFAULT_TARGETS, emulated=True, scales=f))

    why = fp8_unavailable_reason(device)
    for r in runs:
        if r.fp8 and not r.emulated and why:
            r.status = f"fp8proj unavailable: {why}"
            print(f"{r.name}: {r.status} -- skipped", flush=True)
            continue
        r.model = load_model(a.checkpoint, r.dtype, device)
        if r.emulated:
            r.patched = emulate_patch(r.model, r.targets, scales=r.scales)
            r.fp8_modules_at_m = len(r.patched) if m_eval > 512 else 0
            r.explain = ("torch emulation of the block-scaled recipe where M > 512 (the prefill gate); "
                         f"M = {m_eval} here")
            print(f"{r.name}: {len(r.patched)} modules emulated", flush=True)
            if not r.patched or m_eval <= 512:
                r.status = f"emulation would not engage (M = {m_eval} <= 512 or nothing to patch)"
                r.model = None
        elif r.fp8:
            patch_run(r, m_eval)
            print(f"{r.name}: patched {len(r.patched)} modules, skipped {len(r.skipped)}; "
                  f"{r.fp8_modules_at_m} on the FP8 path at M = {m_eval}; {r.status}", flush=True)
            if r.explain:
                print(f"  explain {r.explain}", flush=True)
            if r.status != "ok":
                r.model = None
    live = [r for r in runs if r.model is not None]
    by = {r.name: r for r in runs}
    pairs = [("bf16", "fp32")] + [(r.name, "bf16") for r in runs if r.fp8] + [(r.name, "fp32") for r in runs if r.fp8]
    # fp8proj's runs of q_b_proj + o_proj against the emulation of the same recipe (same weight scale
    # format): whether the library computes the recipe it documents (expected: near the bf16 floor,
    # not near the FP8 error).
    pairs += [(r.name, r.emulation) for r in runs if r.policy is not None and r.emulation]
    kl = {p: [] for p in pairs}
    top1 = {p: [] for p in pairs}

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        for i in range(0, windows, bs):
            x = x_all[i:i + bs].to(device)
            logp = {}
            for r in live:
                sync()
                t0 = time.perf_counter()
                logits = r.model(input_ids=x, use_cache=False).logits[:, :-1]
                sync()
                r.seconds += time.perf_counter() - t0
                lp = torch.log_softmax(logits.double(), dim=-1)
                r.nll.append((-lp.gather(-1, x[:, 1:, None]).squeeze(-1)).flatten().cpu().numpy())
                logp[r.name] = lp
            for (t, ref) in pairs:
                if t in logp and ref in logp:
                    p, q = logp[ref], logp[t]
                    kl[(t, ref)].append((p.exp() * (p - q)).sum(-1).flatten().clamp_min(0).cpu().numpy())
                    top1[(t, ref)].append((p.argmax(-1) == q.argmax(-1)).flatten().cpu().numpy())
            del logp

    # Greedy continuations from prompts spread evenly over the held-out text.
    span = e["prompt_len"] + e["new_tokens"]
    starts = np.linspace(0, text.numel() - span - 1, e["prompts"]).astype(np.int64)
    prompts = torch.stack([text[s:s + e["prompt_len"]] for s in starts]).to(device)
    for r in live:
        t0 = time.perf_counter()
        r.greedy = greedy(r.model, prompts, e["new_tokens"])
        print(f"{r.name}: greedy {e['prompts']} x {e['new_tokens']} bytes in {time.perf_counter() - t0:.1f} s",
              flush=True)

    bpb = {r.name: float(np.concatenate(r.nll).mean() / math.log(2)) for r in live}
    rows = []
    for r in runs:
        row = {"run": r.name, "reference": "" if r.name == "fp32" else ("fp32" if r.name == "bf16" else "bf16"),
               "weight_scales": r.scales if r.fp8 else "",
               "status": r.status, "bpb": bpb.get(r.name), "forward_s": r.seconds if r.model is not None else None,
               "patched": len(r.patched), "skipped": len(r.skipped), "fp8_modules_at_m": r.fp8_modules_at_m}
        ref = row["reference"]
        if r.name in bpb and ref in bpb:
            row["bpb_rel_increase"] = bpb[r.name] / bpb[ref] - 1.0
            row.update(stats(np.concatenate(kl[(r.name, ref)])))
            row["top1"] = float(np.concatenate(top1[(r.name, ref)]).mean())
            row.update(greedy_agreement(r.greedy, by[ref].greedy))
            if r.fp8 and "fp32" in bpb:
                row["kl_mean_vs_fp32"] = float(np.concatenate(kl[(r.name, "fp32")]).mean())
                row["top1_vs_fp32"] = float(np.concatenate(top1[(r.name, "fp32")]).mean())
            if (r.name, r.emulation) in kl and kl[(r.name, r.emulation)]:
                row["kl_mean_vs_emulated"] = float(np.concatenate(kl[(r.name, r.emulation)]).mean())
                row["top1_vs_emulated"] = float(np.concatenate(top1[(r.name, r.emulation)]).mean())
            if r.fp8:
                row["bars"] = {
                    "bpb_rel_increase": row["bpb_rel_increase"] <= BARS["bpb_rel_increase"],
                    "kl_mean": row["kl_mean"] <= BARS["kl_mean"], "top1": row["top1"] >= BARS["top1"]}
        rows.append(row)

    positions = int(sum(len(v) for v in by["bf16"].nll)) if by["bf16"].nll else 0
    meta = {"checkpoint": str(a.checkpoint), "config": str(a.config), "eval_files": [p.name for p in eval_files],
            "windows": windows, "seq_len": seq, "batch_size": bs, "m_per_call": m_eval, "positions": positions,
            "prompts": e["prompts"], "prompt_len": e["prompt_len"], "new_tokens": e["new_tokens"],
            "device": str(device), "versions": versions(), "bars": BARS, "weight_scales": formats,
            "fp8proj": why or "available"}
    try:
        import fp8proj

        meta["fp8proj_version"] = fp8proj.__version__
    except Exception:  # noqa: BLE001
        pass
    details = {r.name: {"patched": r.patched, "skipped": r.skipped, "explain": r.explain} for r in runs if r.fp8}
    (a.out / "eval.json").write_text(json.dumps({"meta": meta, "rows": rows, "patch": details}, indent=2) + "\n")

    cols = ["run", "reference", "weight_scales", "status", "bpb", "bpb_rel_increase", "kl_mean", "kl_median", "kl_p99", "kl_max",
            "top1", "kl_mean_vs_fp32", "top1_vs_fp32", "kl_mean_vs_emulated", "top1_vs_emulated", "greedy_prefix_mean", "greedy_prefix_median",
            "greedy_identical", "greedy_prompts", "greedy_position_agreement", "patched", "skipped",
            "fp8_modules_at_m", "forward_s"]
    with open(a.out / "eval.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)

    md = [f"# bf16 vs FP8 projections on the accuracy model\n",
          f"Held-out text: {', '.join(meta['eval_files'])}; {windows} windows x {seq} bytes = {positions:,} predicted "
          f"positions, {bs} windows per call (M = {m_eval}). Greedy: {e['prompts']} prompts of {e['prompt_len']} "
          f"bytes, {e['new_tokens']} new bytes each. Device {meta['versions'].get('device', device)}; torch "
          f"{meta['versions'].get('torch')}, transformers {meta['versions'].get('transformers')}, fp8proj "
          f"{meta.get('fp8proj_version', 'not importable')}.\n",
          "| run | vs | bits/byte | Δ bpb | KL mean | KL median | KL p99 | KL max | top-1 | greedy prefix (mean / median) "
          "| greedy identical | greedy per position | KL mean vs fp32 | KL mean vs emulated |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if row["status"] != "ok":
            md.append(f"| {row['run']} | {row['reference']} | {row['status']} ||||||||||||")
            continue
        if row["run"] == "fp32":
            md.append(f"| fp32 | — | {row['bpb']:.5f} | | | | | | | | | | | |")
            continue
        md.append(
            f"| {row['run']} | {row['reference']} | {row['bpb']:.5f} | {100 * row['bpb_rel_increase']:+.3f}% | "
            f"{row['kl_mean']:.2e} | {row['kl_median']:.2e} | {row['kl_p99']:.2e} | {row['kl_max']:.2e} | "
            f"{100 * row['top1']:.3f}% | {row['greedy_prefix_mean']:.1f} / {row['greedy_prefix_median']:.0f} | "
            f"{row['greedy_identical']}/{row['greedy_prompts']} | {100 * row['greedy_position_agreement']:.2f}% | "
            f"{fmt(row.get('kl_mean_vs_fp32'), '.2e')} | {fmt(row.get('kl_mean_vs_emulated'), '.2e')} |")
    md.append("\nKL is KL(reference ‖ run) in nats per position; Δ bpb is relative to the reference. The bf16 row "
              "is the noise floor: what bf16 itself costs against fp32. 'vs emulated': fp8proj's run against the torch "
              "emulation of its recipe (same projections, same gate at M > 512).\n")
    md.append(f"Bars (FP8 vs bf16): Δ bpb ≤ {100 * BARS['bpb_rel_increase']}%, mean KL ≤ {BARS['kl_mean']}, "
              f"top-1 ≥ {100 * BARS['top1']}%.\n")
    for row in rows:
        if "bars" in row:
            missed = [k for k, ok in row["bars"].items() if not ok]
            md.append(f"- {row['run']}: " + ("all three bars met" if not missed else "MISSED: " + ", ".join(missed)))
    md.append("\n## What the patch did\n")
    for name, d in details.items():
        st = by[name].status
        md.append(f"- **{name}**: {st}; patched {len(d['patched'])} modules"
                  + (f", declined {len(d['skipped'])}: " + "; ".join(sorted({f'{n.split(".")[-1]}: {r}' for n, r in d['skipped']}))
                     if d["skipped"] else "")
                  + (f"; {by[name].fp8_modules_at_m} on the FP8 path at M = {m_eval}" if d["patched"] else ""))
        if d["explain"]:
            md.append(f"  - explain: `{d['explain']}`")
    (a.out / "eval.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    print(f"wrote {a.out}/eval.json, eval.csv, eval.md")


if __name__ == "__main__":
    main()
