"""Build a model definition with vLLM's own loader and report its linear layers.

Run in a fresh process per scenario (vLLM loads plugins once per process):
    python vllm_driver.py MODEL OUT.json [--quantization fp8proj]
MODEL is glm5 or deepseek_v3 (tests/engines/models.py). The path is the one
``vllm serve`` takes: load_general_plugins() (entry points), EngineArgs ->
VllmConfig, then vllm.model_executor.model_loader.get_model with dummy weights,
which calls get_quant_method(layer, prefix) for every layer and
process_weights_after_loading after the weights are in place. CPU platform
(VLLM_TARGET_DEVICE=cpu), TP 1, gloo.
"""

import argparse
import json
import logging
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def _cpu_stand_ins() -> list:
    """Two stand-ins for what the PyPI (CUDA) wheel of vLLM cannot do on a
    CPU, neither of them in code the plugin touches:
    - the CPU platform has no sparse (DSA) attention backend, so GLM-5's
      MLAAttention is built with use_sparse=False (vLLM's CPU MLA backend);
      its DSA indexer and every linear layer are built as vLLM builds them;
    - vLLM's CPU GEMM packing (dispatch_cpu_unquantized_gemm) calls C ops of
      vLLM's CPU build, absent from the CUDA wheel; it is answered the way
      vLLM answers it for layers it does not pack (cpu_linear = F.linear,
      weight kept); likewise its CPU MoE weight prepacking (weights kept as
      loaded).
    Returns the names of the stand-ins installed."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return []
    import torch
    from vllm.model_executor.layers import utils as layer_utils
    from vllm.model_executor.layers.attention import mla_attention

    cls = mla_attention.MLAAttention
    original_init = cls.__init__

    def init(self, *args, **kwargs):
        kwargs["use_sparse"] = False
        return original_init(self, *args, **kwargs)

    cls.__init__ = init

    def dispatch_cpu_unquantized_gemm(layer, remove_weight):
        layer.cpu_linear = torch.nn.functional.linear

    layer_utils.dispatch_cpu_unquantized_gemm = dispatch_cpu_unquantized_gemm
    from vllm.model_executor.layers.fused_moe.experts import cpu_moe

    cpu_moe.cpu_prepack_moe_weight = lambda weight, isa: weight
    return ["MLAAttention(use_sparse=False)", "dispatch_cpu_unquantized_gemm -> F.linear",
            "cpu_prepack_moe_weight -> identity"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=sorted(models.MODELS))
    ap.add_argument("out")
    ap.add_argument("--quantization", default=None)
    args = ap.parse_args()

    cap = models.LogCapture()
    logging.getLogger("fp8proj").addHandler(cap)
    logging.getLogger("fp8proj").setLevel(logging.INFO)

    import torch
    import vllm
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    from vllm.model_executor.layers import quantization as q

    registered = "fp8proj" in q.QUANTIZATION_METHODS
    tmp = tempfile.mkdtemp(prefix="fp8proj-vllm-")
    model_dir = models.write_model_dir(args.model, tmp)

    from vllm.config import set_current_vllm_config
    from vllm.distributed import (
        ensure_model_parallel_initialized,
        init_distributed_environment,
    )
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.model_loader import get_model

    engine_args = EngineArgs(
        model=model_dir,
        tokenizer=model_dir,
        skip_tokenizer_init=True,
        quantization=args.quantization,
        load_format="dummy",
        dtype="bfloat16",
        max_model_len=1024,
        enforce_eager=True,
        trust_remote_code=False,
        # vLLM's reference CPU MLA backend (the AMX one packs weights with C ops
        # of vLLM's CPU build, absent from the PyPI wheel).
        attention_backend="CPU_MLA",
    )
    vllm_config = engine_args.create_engine_config()
    cpu_stand_ins = _cpu_stand_ins()
    t0 = time.time()
    with set_current_vllm_config(vllm_config):
        init_distributed_environment(
            world_size=1, rank=0, local_rank=0,
            distributed_init_method=f"file://{tmp}/dist", backend="gloo")
        ensure_model_parallel_initialized(1, 1)
        model = get_model(vllm_config=vllm_config)
    build_s = time.time() - t0

    from fp8proj.integrations import _engines

    layers = []
    for name, mod in model.named_modules():
        if not isinstance(mod, LinearBase):
            continue
        n = int(getattr(mod, "output_size_per_partition", mod.output_size))
        k = int(getattr(mod, "input_size_per_partition", mod.input_size))
        method = getattr(mod, "quant_method", None)
        entry = {
            "name": name,
            "class": type(mod).__name__,
            "method": type(method).__name__,
            "method_module": type(method).__module__,
            "n": n,
            "k": k,
        }
        if type(method).__name__ == "Fp8ProjLinearMethod":
            entry["fp8_copy"] = _engines.planned_fp8_copy(n, k)
            entry["has_projection"] = method.projection is not None
        layers.append(entry)

    params = {n: list(p.shape) for n, p in model.named_parameters()}
    result = {
        "engine": "vllm",
        "version": vllm.__version__,
        "torch": torch.__version__,
        "model": args.model,
        "model_class": type(model).__name__,
        "model_module": type(model).__module__,
        "quantization": args.quantization,
        "fp8proj_registered": registered,
        "quant_config": type(vllm_config.quant_config).__name__
        if vllm_config.quant_config is not None else None,
        "build_s": round(build_s, 1),
        "cpu_stand_ins": cpu_stand_ins,
        "linear_layers": layers,
        "parameters": params,
        "fp8proj_log": cap.lines,
    }
    # A tagged layer still computes what vLLM's unquantized method computes
    # (off sm_90 it is that method): one forward per distinct method type.
    checked = {}
    for name, mod in model.named_modules():
        if isinstance(mod, LinearBase) and name.endswith("self_attn.o_proj"):
            x = torch.randn(3, mod.input_size_per_partition, dtype=torch.bfloat16)
            y = mod(x)
            y = y[0] if isinstance(y, tuple) else y
            checked[name] = list(y.shape)
            break
    result["forward_checked"] = checked
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
