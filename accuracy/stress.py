"""Activation stress check: the MLA projections' GEMMs on activations with outlier channels (a
few channels f x the median magnitude, as trained LLMs show), block-scaled FP8 (fp8proj's
recipe: 1x128 activation groups and 128x128 weight blocks, power-of-two scales at or above
amax/448) against per-tensor FP8 (one fp32 scale amax/448 per operand), beside the bf16 GEMM.

    python3 accuracy/stress.py [--checkpoint DIR] [--config accuracy/config.json] --out OUT

Weights: the checkpoint's layer --layer projections (the trained model's), else N(0, 0.02^2)
of the config's shapes. Activations: N(0, 1) rows, bf16-rounded, with --outliers channels
multiplied by each factor. Per projection, factor and recipe: the relative Frobenius error of
the output against the fp64 product of the bf16 operands; the same for the part of the output
that the normal channels carry (what per-tensor scaling loses: their values fall under e4m3's
smallest subnormal, 2^-9 of the scale); the share of nonzero normal-channel activations that
quantize to zero. CPU only (torch float8_e4m3fn); writes OUT/stress.{csv,json,md}.
"""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import torch

from common import DEFAULT_CONFIG, load_config, model_config, versions

E4M3_MAX = 448.0
PROJS = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")


def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(torch.float64)


def e4m3(x: torch.Tensor) -> torch.Tensor:
    # |x| <= 448 by construction of every scale below; round to nearest even, as the GPU's cvt.
    return x.to(torch.float32).to(torch.float8_e4m3fn).to(torch.float64)


def pow2_scale(amax: torch.Tensor) -> torch.Tensor:
    """The power of two at or above amax/448 (fp8proj's UE8M0 rule), amax clamped at 1e-10."""
    q = amax.clamp_min(1e-10) / E4M3_MAX
    s = torch.exp2(torch.ceil(torch.log2(q)))
    # A float log2 can round across a power of two either way; fix it so that q <= s < 2q.
    s = torch.where(s < q, s * 2, s)
    return torch.where(s * 0.5 >= q, s * 0.5, s)


def block_activation(x: torch.Tensor) -> torch.Tensor:
    m, k = x.shape
    g = x.view(m, k // 128, 128)
    s = pow2_scale(g.abs().amax(-1, keepdim=True))
    return (e4m3(g / s) * s).view(m, k)


def block_weight(w: torch.Tensor) -> torch.Tensor:
    n, k = w.shape
    out = torch.empty_like(w)
    for i in range(0, n, 128):
        for j in range(0, k, 128):
            b = w[i:i + 128, j:j + 128]
            s = pow2_scale(b.abs().max())
            out[i:i + 128, j:j + 128] = e4m3(b / s) * s
    return out


def per_tensor(t: torch.Tensor) -> torch.Tensor:
    s = t.abs().max().clamp_min(1e-10) / E4M3_MAX
    return e4m3(t / s) * s


def rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a - ref).norm() / ref.norm())


def load_weights(args, cfg) -> dict[str, torch.Tensor]:
    if args.checkpoint:
        from safetensors import safe_open

        out = {}
        files = sorted(Path(args.checkpoint).glob("*.safetensors"))
        if not files:
            raise SystemExit(f"no .safetensors in {args.checkpoint}")
        for f in files:
            with safe_open(f, "pt") as h:
                for p in PROJS:
                    name = f"model.layers.{args.layer}.self_attn.{p}.weight"
                    if name in h.keys():
                        out[p] = h.get_tensor(name).to(torch.float64)
        missing = [p for p in PROJS if p not in out]
        if missing:
            raise SystemExit(f"{args.checkpoint}: layer {args.layer} lacks {missing}")
        return out
    c = model_config(cfg)
    h, heads = c.hidden_size, c.num_attention_heads
    shapes = {"q_a_proj": (c.q_lora_rank, h),
              "q_b_proj": (heads * (c.qk_nope_head_dim + c.qk_rope_head_dim), c.q_lora_rank),
              "kv_a_proj_with_mqa": (c.kv_lora_rank + c.qk_rope_head_dim, h),
              "kv_b_proj": (heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank),
              "o_proj": (h, heads * c.v_head_dim)}
    g = torch.Generator().manual_seed(args.seed + 1)
    return {p: bf16(torch.randn(s, generator=g, dtype=torch.float64) * 0.02) for p, s in shapes.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description="FP8 GEMM error on activations with outlier channels")
    ap.add_argument("--checkpoint", help="Hugging Face checkpoint directory (else random weights of --config)")
    ap.add_argument("--config", default=str(DEFAULT_CONFIG))
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--m", type=int, default=512, help="activation rows")
    ap.add_argument("--outliers", type=int, default=4, help="outlier channels per activation")
    ap.add_argument("--factors", default="1,10,100,300,1000,3000,10000,30000,100000", help="outlier magnitude / median magnitude")
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    cfg = load_config(a.config)
    weights = load_weights(a, cfg)
    factors = [float(f) for f in a.factors.split(",")]

    rows = []
    for p, w in weights.items():
        n, k = w.shape
        w = bf16(w)
        g = torch.Generator().manual_seed(a.seed + PROJS.index(p))
        base = torch.randn(a.m, k, generator=g, dtype=torch.float64)
        chans = torch.randperm(k, generator=g)[:a.outliers]
        normal = torch.ones(k, dtype=torch.bool)
        normal[chans] = False
        med = float(base.abs().median())
        wq = {"block 1x128/128x128": block_weight(w), "per-tensor": per_tensor(w)}
        for f in factors:
            x = base.clone()
            # The outlier channels' median magnitude is f x that of the others.
            x[:, chans] *= f * med / float(base[:, chans].abs().median())
            x = bf16(x)
            ref = x @ w.T
            ref_normal = x[:, normal] @ w[:, normal].T
            yb = bf16(ref)  # the bf16 GEMM: fp32-exact-ish accumulation, one bf16 rounding
            rows.append({"projection": p, "n": n, "k": k, "factor": f, "recipe": "bf16", "y_rel_err": rel(yb, ref),
                         "y_normal_rel_err": None, "x_normal_flushed": 0.0, "x_rel_err": 0.0})
            for recipe, xq in (("block 1x128/128x128", block_activation(x)), ("per-tensor", per_tensor(x))):
                y = bf16(xq @ wq[recipe].T)
                y_normal = xq[:, normal] @ wq[recipe][:, normal].T
                xn = x[:, normal]
                flushed = float(((xq[:, normal] == 0) & (xn != 0)).sum() / (xn != 0).sum())
                rows.append({"projection": p, "n": n, "k": k, "factor": f, "recipe": recipe,
                             "y_rel_err": rel(y, ref), "y_normal_rel_err": rel(y_normal, ref_normal),
                             "x_normal_flushed": flushed, "x_rel_err": rel(xq, x)})
        print(f"{p} [{n}x{k}] done", flush=True)

    cols = ["projection", "n", "k", "factor", "recipe", "y_rel_err", "y_normal_rel_err", "x_normal_flushed",
            "x_rel_err"]
    with open(a.out / "stress.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=cols)
        wr.writeheader()
        wr.writerows(rows)
    meta = {"weights": a.checkpoint or f"random N(0, 0.02^2), shapes of {a.config}", "layer": a.layer, "m": a.m,
            "outliers": a.outliers, "factors": factors, "seed": a.seed, "versions": versions()}
    (a.out / "stress.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")

    md = ["# FP8 GEMM error on activations with outlier channels\n",
          f"Weights: {meta['weights']} (layer {a.layer}). Activations: {a.m} rows of N(0, 1), {a.outliers} channels at "
          f"factor x the median magnitude, bf16. Errors are relative Frobenius against the fp64 product of the bf16 "
          f"operands; 'normal part' is the output the non-outlier channels carry; 'flushed' is the share of nonzero "
          f"normal-channel activations that quantize to 0.\n",
          "| projection | N x K | factor | bf16 | block FP8 | per-tensor FP8 | block, normal part | per-tensor, normal part "
          "| flushed (block) | flushed (per-tensor) |", "|---|---|---|---|---|---|---|---|---|---|"]
    by = {(r["projection"], r["factor"], r["recipe"]): r for r in rows}
    for p in weights:
        for fct in factors:
            b, bl, pt = (by[(p, fct, r)] for r in ("bf16", "block 1x128/128x128", "per-tensor"))
            md.append(f"| {p} | {bl['n']}x{bl['k']} | {fct:g} | {b['y_rel_err']:.2e} | {bl['y_rel_err']:.2e} | "
                      f"{pt['y_rel_err']:.2e} | {bl['y_normal_rel_err']:.2e} | {pt['y_normal_rel_err']:.2e} | "
                      f"{100 * bl['x_normal_flushed']:.2f}% | {100 * pt['x_normal_flushed']:.2f}% |")
    (a.out / "stress.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
