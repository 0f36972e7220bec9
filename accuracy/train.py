"""Trains the accuracy model (accuracy/config.json) on the Shakespeare corpus and writes a
Hugging Face checkpoint.

    python3 accuracy/train.py [--config accuracy/config.json] [--data .data] --out DIR

DIR receives: checkpoint/ (or --checkpoint-dir: model.safetensors in bf16 with Hugging Face names + config.json),
checkpoint.sha256, train_log.csv (step, tokens, train loss, val loss, lr, seconds),
train_summary.json (time, tokens/s, final losses, versions), loss_curve.png.

fp32 master weights and AdamW, bf16 autocast on CUDA (fp32 on CPU, where the tests run it at a
tiny size). Random windows of seq_len + 1 bytes from the training plays, seeded. The learning
rate warms up linearly, then follows a cosine to min_lr_ratio; its progress is the larger of
step / max_steps and elapsed / time_budget_s, so the run ends within the time budget with the
schedule completed, whichever of the two limits binds first.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path

import torch

from common import (DEFAULT_CONFIG, DEFAULT_DATA, check_projection_shapes, load_config, model_config, read_bytes,
                    sha256_file, split_corpus, versions)


def lr_at(progress: float, step: int, t: dict) -> float:
    if step < t["warmup_steps"]:
        return t["lr"] * (step + 1) / t["warmup_steps"]
    p = min(max(progress, 0.0), 1.0)
    lo = t["lr"] * t["min_lr_ratio"]
    return lo + 0.5 * (t["lr"] - lo) * (1.0 + math.cos(math.pi * p))


@torch.no_grad()
def val_loss(model, val: torch.Tensor, windows: int, seq_len: int, batch: int, device, amp) -> float:
    """Mean next-byte loss (nats) over the first `windows` non-overlapping windows of the
    held-out text: a fixed set, so the curve is comparable step to step."""
    model.eval()
    n = min(windows, (val.numel() - 1) // seq_len)
    total, count = 0.0, 0
    for i in range(0, n, batch):
        rows = [val[j * seq_len:(j + 1) * seq_len + 1] for j in range(i, min(i + batch, n))]
        x = torch.stack(rows).to(device)
        with amp():
            logits = model(input_ids=x[:, :-1], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                 x[:, 1:].reshape(-1), reduction="sum")
        total += loss.item()
        count += x[:, 1:].numel()
    model.train()
    return total / max(count, 1)


def plot(log: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    tr = [r for r in log if r["train_loss"] is not None]
    va = [r for r in log if r["val_loss"] is not None]
    ax.plot([r["tokens"] / 1e6 for r in tr], [r["train_loss"] / math.log(2) for r in tr], label="train (batch)")
    ax.plot([r["tokens"] / 1e6 for r in va], [r["val_loss"] / math.log(2) for r in va], "o-",
            label="held-out plays")
    ax.set_xlabel("training tokens (millions of bytes)")
    ax.set_ylabel("bits per byte")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description="Train the fp8proj accuracy model")
    ap.add_argument("--config", default=str(DEFAULT_CONFIG))
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--checkpoint-dir", type=Path, help="where the checkpoint goes (default OUT/checkpoint)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()

    cfg = load_config(a.config)
    t = cfg["train"]
    out = a.out
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(a.device)
    torch.manual_seed(t["seed"])

    train_files, eval_files = split_corpus(cfg, a.data)
    train = torch.frombuffer(bytearray(read_bytes(train_files)), dtype=torch.uint8).long()
    val = torch.frombuffer(bytearray(read_bytes(eval_files)), dtype=torch.uint8).long()
    print(f"training bytes {train.numel():,} from {len(train_files)} files; held-out "
          f"{[p.name for p in eval_files]} {val.numel():,} bytes", flush=True)

    from transformers import DeepseekV3ForCausalLM

    config = model_config(cfg)
    config._attn_implementation = "sdpa"
    model = DeepseekV3ForCausalLM(config).to(device)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.1f} M parameters; projections:", *check_projection_shapes(config), sep="\n  ")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=t["lr"], betas=tuple(t["betas"]), fused=device.type == "cuda")
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        amp = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    else:
        import contextlib

        amp = contextlib.nullcontext

    gen = torch.Generator().manual_seed(t["seed"])
    seq, bs = t["seq_len"], t["batch_size"]
    log: list[dict] = []
    tokens = 0
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    step = 0
    while True:
        elapsed = time.perf_counter() - t0
        progress = max(step / t["max_steps"], elapsed / t["time_budget_s"])
        if progress >= 1.0:
            break
        lr = lr_at(progress, step, t)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, train.numel() - seq - 1, (bs,), generator=gen)
        batch = torch.stack([train[s:s + seq + 1] for s in starts.tolist()]).to(device, non_blocking=True)
        with amp():
            logits = model(input_ids=batch[:, :-1], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                 batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t["grad_clip"])
        opt.step()
        step += 1
        tokens += bs * seq
        vl = None
        if step % t["val_every"] == 0:
            vl = val_loss(model, val, t["val_windows"], seq, bs, device, amp)
        if step % t["log_every"] == 0 or vl is not None or step == 1:
            lv = loss.item()
            if not math.isfinite(lv):
                sys.exit(f"training diverged at step {step}: loss {lv}")
            el = time.perf_counter() - t0
            log.append({"step": step, "tokens": tokens, "train_loss": lv, "val_loss": vl, "lr": lr, "seconds": el})
            print(f"step {step:5d}  tokens {tokens / 1e6:7.2f}M  loss {lv:.4f} ({lv / math.log(2):.3f} bpb)"
                  + (f"  held-out {vl:.4f} ({vl / math.log(2):.3f} bpb)" if vl is not None else "")
                  + f"  lr {lr:.2e}  {el:6.1f}s  {tokens / el:,.0f} tok/s", flush=True)
    sync()
    train_s = time.perf_counter() - t0
    final_val = val_loss(model, val, t["val_windows"], seq, bs, device, amp)
    log.append({"step": step, "tokens": tokens, "train_loss": None, "val_loss": final_val, "lr": None,
                "seconds": train_s})
    stop = "max_steps" if step >= t["max_steps"] else "time_budget_s"
    print(f"trained {step} steps ({stop} reached), {tokens:,} tokens in {train_s:.1f} s "
          f"({tokens / train_s:,.0f} tokens/s); held-out {final_val / math.log(2):.4f} bpb", flush=True)

    # The checkpoint: bf16 weights under Hugging Face names, config.json beside them.
    ck = a.checkpoint_dir or out / "checkpoint"
    model.eval()
    model.to(torch.bfloat16)
    model.save_pretrained(ck, safe_serialization=True)
    st = sorted(ck.glob("*.safetensors"))
    digests = {p.name: sha256_file(p) for p in st}
    with open(out / "checkpoint.sha256", "w") as f:
        for name, d in digests.items():
            f.write(f"{d}  {name}\n")
            print(f"sha256 {d}  {name}")

    with open(out / "train_log.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["step", "tokens", "train_loss", "val_loss", "lr", "seconds"])
        w.writeheader()
        w.writerows(log)
    summary = {
        "config": str(a.config), "parameters": params, "steps": step, "stopped_by": stop, "tokens": tokens,
        "train_seconds": train_s, "tokens_per_second": tokens / train_s,
        "final_train_loss_nats": next((r["train_loss"] for r in reversed(log) if r["train_loss"] is not None), None),
        "final_heldout_bpb": final_val / math.log(2), "heldout_files": [p.name for p in eval_files],
        "train_files": len(train_files), "train_bytes": train.numel(), "checkpoint_sha256": digests,
        "versions": versions(), "device": str(device),
    }
    (out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    h = cfg["model"]
    plot(log, out / "loss_curve.png",
         f"DeepSeek-V3 MLA, hidden {h['hidden_size']}, {h['num_hidden_layers']} layers, {params / 1e6:.0f} M params; "
         f"{tokens / 1e6:.1f} M bytes in {train_s:.0f} s on {summary['versions'].get('device', device)}")
    print(f"wrote {out}", flush=True)


if __name__ == "__main__":
    main()
