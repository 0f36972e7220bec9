"""Shared pieces of the engine plugin tests (opt-in: scripts/test_engines.sh).
(Not a conftest.py: python/tests/ has its own, and the test files import this by name.)

Each scenario builds a real model definition of the engine in a fresh Python
process (a driver script), because both engines load plugins once per process
and SGLang's hooks are process-global. The drivers write JSON; when
FP8PROJ_ENGINE_RESULTS names a folder, the JSON files are kept there.
"""

import importlib.util
import json
import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

_FLAGS = ("SGLANG_DSA_FP8_PROJ_GEMM", "FP8PROJ_PREFILL_FP8", "FP8PROJ_ENGINE_TARGETS")


def require_engine(module: str) -> None:
    """Skip the whole test module, visibly, unless the engine is importable."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(
            f"{module} is not installed in this Python ({sys.executable}); "
            "scripts/test_engines.sh installs the released engine into a /tmp venv",
            allow_module_level=True,
        )


def entry_point(group: str, name: str = "fp8proj"):
    found = [ep for ep in entry_points(group=group) if ep.name == name]
    return found[0] if found else None


_cache = {}


def run_driver(driver: str, model: str, tag: str, env: dict, extra=()) -> dict:
    """Run tests/engines/<driver>.py for one scenario and return its JSON."""
    key = (driver, model, tag)
    if key in _cache:
        return _cache[key]
    out_dir = os.environ.get("FP8PROJ_ENGINE_RESULTS") or os.path.join(
        os.environ.get("TMPDIR", "/tmp"), "fp8proj-engine-results")
    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, f"{driver}-{model}-{tag}.json")
    child_env = {k: v for k, v in os.environ.items() if k not in _FLAGS}
    child_env.update(env)
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, f"{driver}.py"), model, out, *extra],
        env=child_env, capture_output=True, text=True, timeout=1800)
    with open(out + ".log", "w") as f:
        f.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-6000:]
        pytest.fail(f"{driver} {model} [{tag}] exited with {proc.returncode}:\n{tail}")
    with open(out) as f:
        result = json.load(f)
    _cache[key] = result
    return result


def fake_quantize_weight_shapes(n: int, k: int):
    """Shapes fp8proj's quantize_weight op declares (its fake implementation)
    for an [N, K] bf16 weight: what the load-time FP8 copy is."""
    import torch

    import fp8proj  # noqa: F401  (registers torch.ops.fp8proj.*)

    # A meta tensor dispatches to the op's registered fake implementation.
    w = torch.empty(n, k, dtype=torch.bfloat16, device="meta")
    values, scales = torch.ops.fp8proj.quantize_weight(w)
    return tuple(values.shape), str(values.dtype), tuple(scales.shape), str(scales.dtype)
