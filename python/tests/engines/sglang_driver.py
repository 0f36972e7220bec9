"""Build a model definition with SGLang's own loader and report its linear layers.

Run in a fresh process per scenario (hooks are process-global):
    python sglang_driver.py MODEL OUT.json [--quant fp8|fp8-ue8m0|fp8-block64] [--apply]
--quant writes the FP8 checkpoint's quantization_config into config.json
(models.fp8_quant_configs): the projections then load through SGLang's
Fp8LinearMethod. --apply (needs a CUDA GPU) builds on the GPU and runs the
taken layers (apply_check below).
The flag comes from the environment (SGLANG_DSA_FP8_PROJ_GEMM /
FP8PROJ_PREFILL_FP8), as in ``python -m sglang.launch_server``. The path is
SGLang's: ``sglang.srt.plugins.load_plugins()`` (entry points of group
``sglang.srt.plugins``, hooks applied by dotted path), then the server
arguments published to the runtime context, a gloo world of one, and
``sglang.srt.model_loader.get_model`` with dummy weights on the CPU, which
builds the model class of the config's architecture and calls
``process_weights_after_loading`` on every layer.
"""

import argparse
import json
import logging
import os
import socket
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402



def _cpu_stand_ins() -> list:
    """What SGLang's PyPI wheel cannot do without a GPU, in code the plugin
    does not touch. Its CPU engine (SGLANG_USE_CPU_ENGINE=1) needs the CPU
    build of sgl-kernel, which is not on PyPI; without it SGLang takes its
    generic path, whose rotary embedding imports ``vllm._custom_ops.
    rotary_embedding`` at construction. That one name is provided (it raises
    if called: no forward through attention is run here)."""
    import types

    if "vllm" in sys.modules or _has_module("vllm"):
        return []
    def rotary_embedding(*args, **kwargs):
        raise NotImplementedError("stand-in: vllm._custom_ops.rotary_embedding")
    vllm_pkg = types.ModuleType("vllm")
    vllm_pkg.__path__ = []
    ops = types.ModuleType("vllm._custom_ops")
    ops.rotary_embedding = rotary_embedding
    vllm_pkg._custom_ops = ops
    sys.modules["vllm"], sys.modules["vllm._custom_ops"] = vllm_pkg, ops
    return ["vllm._custom_ops.rotary_embedding (import only)"]


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=sorted(models.MODELS))
    ap.add_argument("out")
    ap.add_argument("--quant", default="none",
                    choices=["none"] + sorted(models.fp8_quant_configs()))
    ap.add_argument("--apply", action="store_true")
    args = ap.parse_args()
    device = "cuda" if args.apply else "cpu"

    cap = models.LogCapture()
    for name in ("fp8proj", "sglang.srt.plugins"):
        logging.getLogger(name).addHandler(cap)
        logging.getLogger(name).setLevel(logging.INFO)

    import torch
    import sglang
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    load_plugins()
    hooks = sorted(HookRegistry._patched)
    stand_ins = _cpu_stand_ins()

    tmp = tempfile.mkdtemp(prefix="fp8proj-sglang-")
    model_dir = models.write_model_dir(args.model, tmp, args.quant)

    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.layers.linear import LinearBase
    from sglang.srt.model_loader import get_model
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(
        model_path=model_dir,
        device=device,
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        context_length=1024,
        disable_cuda_graph=True,
    )
    # What the scheduler process does after load_plugins(): publish the
    # server arguments and this process's place (rank 0 of a world of one).
    # DSA models (GLM-5): SGLang's server-argument resolution reads the GPU's
    # compute capability; without a GPU it is answered as Hopper's (9, 0)
    # during publish() only. The plugin's own sm_90 check asks
    # torch.cuda.is_available() first and still sees no GPU.
    real_capability = torch.cuda.get_device_capability
    if not torch.cuda.is_available():
        torch.cuda.get_device_capability = lambda device=None: (9, 0)
        stand_ins.append("torch.cuda.get_device_capability -> (9, 0) during publish()")
    try:
        publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0))
    finally:
        torch.cuda.get_device_capability = real_capability
    ps.init_distributed_environment(
        backend="gloo", world_size=1, rank=0, local_rank=0,
        distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
    ps.initialize_model_parallel(backend="gloo")
    model_config = ModelConfig.from_server_args(server_args)
    t0 = time.time()
    model = get_model(
        model_config=model_config,
        load_config=LoadConfig(load_format="dummy"),
        device_config=DeviceConfig(device),
    )
    build_s = time.time() - t0

    from fp8proj.integrations import _engines
    from fp8proj.integrations import sglang as plugin

    tagged = set(plugin.tagged_layers(model))
    layers = []
    for name, mod in model.named_modules():
        if not isinstance(mod, LinearBase):
            continue
        w = getattr(mod, "weight", None)
        n, k = (int(s) for s in w.shape) if w is not None and w.dim() == 2 else (-1, -1)
        entry = {
            "name": name,
            "class": type(mod).__name__,
            "method": type(mod.quant_method).__name__,
            "n": n,
            "k": k,
            "tagged": name in tagged,
        }
        if name in tagged:
            entry["tag"] = mod.__dict__.get("_fp8proj_name")
            entry["fp8_copy"] = _engines.planned_fp8_copy(n, k)
            entry["has_projection"] = "_fp8proj" in mod.__dict__
            entry["fp8_checkpoint"] = plugin.REPORT.fp8_checkpoint.get(name)
            entry["taken"] = "_fp8proj_ckpt" in mod.__dict__
        if entry["method"] == "Fp8LinearMethod":
            entry["fp8_method_state"] = _state_json(plugin._fp8_method_state(mod.quant_method, mod))
            entry["tensors"] = {
                attr: {"dtype": str(t.dtype), "shape": list(t.shape),
                       "contiguous": t.is_contiguous()}
                for attr in ("weight", "weight_scale_inv")
                if isinstance(t := getattr(mod, attr, None), torch.Tensor)}
        layers.append(entry)

    result = {
        "engine": "sglang",
        "version": sglang.__version__,
        "torch": torch.__version__,
        "model": args.model,
        "model_class": type(model).__name__,
        "model_module": type(model).__module__,
        "flags": {k: os.environ.get(k) for k in (
            _engines.REFERENCE_FLAG, _engines.FP8PROJ_FLAG, _engines.TARGETS_ENV)},
        "hooks_applied": hooks,
        "cpu_stand_ins": stand_ins,
        "build_s": round(build_s, 1),
        "linear_layers": layers,
        "parameters": {n: list(p.shape) for n, p in model.named_parameters()},
        "quant": args.quant,
        "device": device,
        "report_skipped": plugin.REPORT.skipped,
        "report_fp8_checkpoint": plugin.REPORT.fp8_checkpoint,
        "fp8_checkpoint_taken": plugin.fp8_checkpoint_layers(model),
        "fp8proj_log": cap.lines,
    }
    if args.apply:
        result["apply"] = apply_check(model, plugin)
    # A tagged layer off sm_90 runs SGLang's own bf16 apply: same output.
    for name, mod in model.named_modules():
        if args.quant == "none" and name in tagged and name.endswith("o_proj"):
            x = torch.randn(3, mod.weight.shape[1], dtype=torch.bfloat16)
            y = mod(x)
            y = y[0] if isinstance(y, tuple) else y
            ref = torch.nn.functional.linear(x, mod.weight)
            result["forward_equal_bf16"] = {name: bool(torch.equal(y, ref))}
            break
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


def _state_json(state) -> dict:
    import dataclasses

    return {k: (str(v) if not isinstance(v, (bool, str, type(None), tuple, list)) else v)
            for k, v in dataclasses.asdict(state).items()}


def apply_check(model, plugin) -> dict:
    """On the GPU, per taken layer: fill its weight and scales with a random
    checkpoint block (dummy weights are ~0), then call the layer as the model
    does. Above the decode ceiling the output must be fp8proj's GEMM on those
    tensors (bit-identical to block_fp8_linear, close to the dequantized
    product); at or below it, SGLang's own Fp8LinearMethod.apply (bit-identical
    to the same call with the layer untaken)."""
    import torch

    from fp8proj.bench_fp8ckpt import quantize_checkpoint_weight
    from fp8proj.fp8_linear import block_fp8_linear, block_fp8_linear_reference

    out = {}
    torch.manual_seed(0)
    for name, mod in model.named_modules():
        proj = mod.__dict__.get("_fp8proj_ckpt")
        if proj is None:
            continue
        n, k = proj.n, proj.k
        w, s = quantize_checkpoint_weight(torch.randn(n, k, device="cuda") * 0.02)
        with torch.no_grad():
            mod.weight.data.copy_(w)
            mod.weight_scale_inv.data.copy_(s)
            big = torch.randn(proj.decode_ceiling + 512, k, device="cuda", dtype=torch.bfloat16)
            y = mod(big)
            y = y[0] if isinstance(y, tuple) else y
            direct = block_fp8_linear(big, mod.weight, mod.weight_scale_inv, proj.act_fmt)
            # bf16 -> fp32 is exact: the same quantized activations, an fp32 product.
            ref = block_fp8_linear_reference(big.float(), mod.weight, mod.weight_scale_inv,
                                             proj.act_fmt)
            rel = float((y.float() - ref.float()).norm() / ref.float().norm())
            small = big[:16]
            ys = mod(small)
            ys = ys[0] if isinstance(ys, tuple) else ys
            mod.__dict__.pop("_fp8proj_ckpt")
            try:
                ys_sglang = mod(small)
                ys_sglang = ys_sglang[0] if isinstance(ys_sglang, tuple) else ys_sglang
                yb_sglang = mod(big)
                yb_sglang = yb_sglang[0] if isinstance(yb_sglang, tuple) else yb_sglang
            finally:
                mod.__dict__["_fp8proj_ckpt"] = proj
            rel_sglang = float((yb_sglang.float() - ref.float()).norm() / ref.float().norm())
        torch.cuda.synchronize()
        out[name] = {
            "m_big": big.shape[0], "m_small": small.shape[0], "act_scale_fmt": proj.act_fmt,
            "big_equal_block_fp8_linear": bool(torch.equal(y, direct)),
            "big_rel_err_vs_dequantized": rel,
            "sglang_big_rel_err_vs_dequantized": rel_sglang,
            "small_equal_sglang": bool(torch.equal(ys, ys_sglang)),
        }
    return out


if __name__ == "__main__":
    main()
