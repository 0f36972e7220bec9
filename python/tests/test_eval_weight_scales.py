"""accuracy/eval.py with both scale formats of the FP8 weight copies in one run (--weight-scales
ue8m0,float), on the CPU at a tiny size: a random-init model of accuracy/tiny.json's shape (no
training, so this runs without matplotlib), the same batches through every run. The fp8proj rows
are skipped with the reason off Hopper; the torch emulations of both recipes run anywhere."""
import csv
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ACC = REPO / "accuracy"
TINY = ACC / "tiny.json"
sys.path.insert(0, str(ACC))

pytest.importorskip("transformers", reason="the accuracy model is transformers' DeepseekV3ForCausalLM")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import torch

    from common import load_config, model_config
    from transformers import DeepseekV3ForCausalLM

    cfg = load_config(TINY)
    root = tmp_path_factory.mktemp("evalscales")
    texts = root / "data" / cfg["corpus"]["texts_dir"]
    texts.mkdir(parents=True)
    rng = random.Random(7)
    words = "the king queen lord good sir what is this that thou art now love night day speak come go".split()
    for name in cfg["corpus"]["heldout_files"]:
        (texts / name).write_text(" ".join(rng.choice(words) for _ in range(4000)))
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(model_config(cfg)).to(torch.bfloat16)
    model.save_pretrained(root / "ck")
    return root


def test_both_formats_side_by_side(setup):
    out = setup / "out"
    p = subprocess.run([sys.executable, str(ACC / "eval.py"), "--config", str(TINY), "--checkpoint", str(setup / "ck"),
                        "--data", str(setup / "data"), "--out", str(out), "--device", "cpu",
                        "--weight-scales", "ue8m0,float"], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads((out / "eval.json").read_text())
    assert res["meta"]["weight_scales"] == ["ue8m0", "float"]
    rows = {r["run"]: r for r in res["rows"]}
    for f in ("ue8m0", "float"):
        for run in (f"fp8 prefill [w {f}]", f"fp8 all [w {f}]", f"fp8 prefill +q_a,kv_a,kv_b [w {f}]"):
            assert rows[run]["weight_scales"] == f
            assert rows[run]["status"].startswith("fp8proj unavailable: "), rows[run]["status"]
        em = rows[f"fp8 emulated (torch) [w {f}]"]
        assert em["status"] == "ok" and em["patched"] == 4 and em["weight_scales"] == f, em
        # Both against bf16 on the same positions: FP8's error is far above bf16's own.
        assert em["kl_mean"] > rows["bf16"]["kl_mean"] and em["top1"] > 0.5
    assert rows["fp8 emulated (torch) [w ue8m0]"]["kl_mean"] != rows["fp8 emulated (torch) [w float]"]["kl_mean"]
    with open(out / "eval.csv") as f:
        assert len(list(csv.DictReader(f))) == 2 + 2 * 5
    md = (out / "eval.md").read_text()
    assert "fp8 emulated (torch) [w float]" in md


def test_bad_format_is_refused(setup):
    p = subprocess.run([sys.executable, str(ACC / "eval.py"), "--config", str(TINY), "--checkpoint", str(setup / "ck"),
                        "--data", str(setup / "data"), "--out", str(setup / "bad"), "--device", "cpu",
                        "--weight-scales", "ue8m0,fp16"], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 2 and "--weight-scales 'ue8m0,fp16'" in p.stderr, p.stderr


def test_float_emulation_is_the_float_rule():
    """eval.py's emulation of the float recipe against an independent numpy / ml_dtypes coding:
    scale fl32(max(amax, 1e-4) / 448) per 128x128 block, code e4m3(fl32(w / scale))."""
    import ml_dtypes
    import numpy as np
    import torch

    import eval as ev

    g = torch.Generator().manual_seed(5)
    w = (torch.randn(200, 256, generator=g) * 0.02).to(torch.bfloat16)
    got = ev.emulate_weight(w, "float").numpy()
    wf = w.float().numpy()
    ref = np.zeros_like(wf)
    for i in range(0, 200, 128):
        for j in range(0, 256, 128):
            blk = wf[i:i + 128, j:j + 128]
            s = np.float32(max(np.abs(blk).max(), np.float32(1e-4))) / np.float32(448)
            q = np.clip((blk / s).astype(np.float32), -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
            ref[i:i + 128, j:j + 128] = q * s
    assert np.array_equal(got, ref)
