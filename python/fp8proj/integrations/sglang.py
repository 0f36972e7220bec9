"""fp8proj as an SGLang plugin: the reference design (sglang#31955) on Hopper.

The reference makes ``UnquantizedLinearMethod`` keep a private FP8 copy of the
MLA ``q_b_proj`` and ``o_proj`` weights at load and send prefill batches
(M > 512) to an FP8 GEMM, behind ``SGLANG_DSA_FP8_PROJ_GEMM``. This plugin does
the same without a fork, through SGLang's own plugin loader
(``sglang.srt.plugins.load_plugins``: entry-point group ``sglang.srt.plugins``,
hooks applied by dotted path with ``HookRegistry``):

1. ``DeepseekV2AttentionMLA.__init__`` (the attention of DeepSeek-V2/V3/V3.2
   and GLM-5, ``GlmMoeDsaForCausalLM``): tag ``q_b_proj`` and ``o_proj`` (plus
   the opt-in targets of ``FP8PROJ_ENGINE_TARGETS``) with their layer names,
   when they run the unquantized (bf16) method.
2. ``UnquantizedLinearMethod.process_weights_after_loading``: for a tagged
   layer on sm_90, the private FP8 copy; the bf16 weight stays. One log line
   per tagged layer, FP8 or why not.
3. ``UnquantizedLinearMethod.apply`` / ``apply_into``: for a layer with an FP8
   copy, ask fp8proj's gate. Batches it keeps in bf16 (every decode batch
   under policy ``prefill``) run SGLang's own bf16 code unchanged, so their
   outputs are bit-identical to a run without the plugin; larger batches run
   ``torch.ops.fp8proj.linear``. Under torch.compile the op is called
   directly and its M-gate decides at run time (no shape guard per M).

FP8 checkpoints (DeepSeek-V3/R1, Kimi-K2, GLM-5-FP8): their projections run
SGLang's ``Fp8LinearMethod`` instead, on e4m3 weights with fp32 scales per
128x128 block, which fp8proj's GEMM takes as they are. Step 1 tags those
projections too; then

4. ``Fp8LinearMethod.process_weights_after_loading``: after SGLang's own
   processing, a tagged layer still holding a plain row-major e4m3 ``weight``
   [N, K] and fp32 ``weight_scale_inv`` [ceil(N/128), ceil(K/128)] with
   ``weight_block_size`` [128, 128] (not MXFP8, not served as MXFP8, not
   Marlin-repacked, not AITER-preshuffled, scales not re-laid out for DeepGEMM)
   is taken on sm_90; every other one stays on SGLang's method, with the
   reason in the log and in ``REPORT.fp8_checkpoint``.
5. ``Fp8LinearMethod.apply``: for a taken layer, batches above the decode
   ceiling (policy ``prefill``; every batch under ``all``) run
   ``torch.ops.fp8proj.quantize_activation`` (power-of-two scales for a
   ``scale_fmt: "ue8m0"`` checkpoint, else fp32 amax/448, as SGLang's own
   kernels quantize) and ``torch.ops.fp8proj.fp8_gemm`` on ``layer.weight``
   and ``layer.weight_scale_inv``. Decode batches, pre-quantized (tuple)
   inputs and everything untaken run SGLang's apply unchanged.

Opt-in: ``SGLANG_DSA_FP8_PROJ_GEMM=1`` or ``FP8PROJ_PREFILL_FP8=1|prefill|all``.
With both unset ``register()`` registers no hook. Off sm_90 the layers are
tagged and logged but no copy is made, none is taken and ``apply`` is SGLang's.
"""

from __future__ import annotations

import inspect
import logging

import torch

from fp8proj.integrations import _engines
from fp8proj.integrations._engines import TagReport

logger = logging.getLogger("fp8proj.integrations.sglang")

ATTENTION_CLASS = "sglang.srt.models.deepseek_v2.DeepseekV2AttentionMLA"
UNQUANT_METHOD = "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod"
FP8_METHOD = "sglang.srt.layers.quantization.fp8.Fp8LinearMethod"
HOOK_TARGETS = (
    ATTENTION_CLASS + ".__init__",
    UNQUANT_METHOD + ".process_weights_after_loading",
    UNQUANT_METHOD + ".apply",
    UNQUANT_METHOD + ".apply_into",
    FP8_METHOD + ".process_weights_after_loading",
    FP8_METHOD + ".apply",
)

# Tagged and skipped layer names of every attention built in this process.
REPORT = TagReport()

_NAME = "_fp8proj_name"  # on a tagged layer: its full layer name
_PROJ = "_fp8proj"  # on a tagged layer with an FP8 copy: its EngineProjection
_CKPT = "_fp8proj_ckpt"  # on a taken FP8-checkpoint layer: its CheckpointProjection
_state = {"registered": False, "policy": "prefill", "targets": _engines.DEFAULT_TARGETS}


def register() -> None:
    """Entry point of group ``sglang.srt.plugins``; SGLang calls it in every
    process (server, scheduler, TP workers) before the model is built."""
    enabled, flag = _engines.sglang_enabled()
    if not enabled:
        logger.debug("[fp8proj] sglang plugin off (%s and %s unset)",
                     _engines.REFERENCE_FLAG, _engines.FP8PROJ_FLAG)
        return
    if _state["registered"]:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    _state["policy"] = _engines.policy_from_env()
    _state["targets"] = _engines.targets_from_env()
    HookRegistry.register(HOOK_TARGETS[0], _attention_init, HookType.AROUND)
    HookRegistry.register(HOOK_TARGETS[1], _process_weights, HookType.AROUND)
    HookRegistry.register(HOOK_TARGETS[2], _apply, HookType.AROUND)
    HookRegistry.register(HOOK_TARGETS[3], _apply_into, HookType.AROUND)
    HookRegistry.register(HOOK_TARGETS[4], _fp8_process_weights, HookType.AROUND)
    HookRegistry.register(HOOK_TARGETS[5], _fp8_apply, HookType.AROUND)
    _state["registered"] = True
    logger.info("[fp8proj] sglang plugin on (%s): targets %s, policy %s",
                flag, ",".join(_state["targets"]), _state["policy"])


def tag_attention(attn: torch.nn.Module, prefix: str,
                  targets: tuple[str, ...] | None = None) -> list[str]:
    """Tag the target projections of one MLA attention module by name.

    Only layers whose quant method is exactly ``UnquantizedLinearMethod`` (a
    bf16 projection: the private FP8 copy) or exactly ``Fp8LinearMethod`` (an
    FP8 checkpoint's projection: decided after loading) are tagged; any other
    method (another quantization) keeps its own path. Returns the tagged names."""
    from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod

    fp8_method = _fp8_method_class()
    targets = _state["targets"] if targets is None else targets
    tagged = []
    for target in targets:
        for attr in _engines.ATTRIBUTE_NAMES[target]:
            layer = getattr(attn, attr, None)
            if layer is None:
                continue
            name = f"{prefix}.{attr}" if prefix else attr
            method = getattr(layer, "quant_method", None)
            if type(method) is not UnquantizedLinearMethod and (
                    fp8_method is None or type(method) is not fp8_method):
                REPORT.skipped.append(
                    (name, f"quant method {type(method).__name__}, neither bf16 nor "
                           "Fp8LinearMethod"))
                continue
            layer.__dict__[_NAME] = name
            layer.__dict__.pop(_PROJ, None)
            layer.__dict__.pop(_CKPT, None)
            REPORT.tagged.append(name)
            tagged.append(name)
    return tagged


def _fp8_method_class():
    """SGLang's Fp8LinearMethod, or None where this SGLang has none."""
    try:
        from sglang.srt.layers.quantization.fp8 import Fp8LinearMethod
    except ImportError:
        return None
    return Fp8LinearMethod


def _attention_init(original, self, *args, **kwargs):
    result = original(self, *args, **kwargs)
    try:
        prefix = inspect.signature(original).bind(self, *args, **kwargs).arguments.get(
            "prefix", "")
    except TypeError:
        prefix = kwargs.get("prefix", "")
    tag_attention(self, prefix)
    return result


def _process_weights(original, method, layer, *args, **kwargs):
    result = original(method, layer, *args, **kwargs)
    name = layer.__dict__.get(_NAME)
    if name is not None:
        # Called again on reload (and twice by the overlapped loader): the
        # copy is always rebuilt from the weights as they are now.
        layer.__dict__.pop(_PROJ, None)
        proj = _engines.prepare_layer(layer, name, _state["policy"], "sglang", logger)
        if proj is not None:
            layer.__dict__[_PROJ] = proj
    return result


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def _fp8_for(layer, x, bias):
    """The layer's EngineProjection when this call should go through it."""
    proj = layer.__dict__.get(_PROJ)
    if proj is None or bias is not None or not isinstance(x, torch.Tensor):
        return None
    if torch.compiler.is_compiling():
        return proj  # the op's own M-gate decides at run time
    return proj if proj.uses_fp8(_rows(x)) else None


def _apply(original, method, layer, x, bias=None, *args, **kwargs):
    proj = _fp8_for(layer, x, bias)
    if proj is None:
        return original(method, layer, x, bias, *args, **kwargs)
    return proj.run(x, layer.weight)


def _apply_into(original, method, layer, x, output, bias=None, *args, **kwargs):
    proj = _fp8_for(layer, x, bias)
    if proj is None:
        return original(method, layer, x, output, bias, *args, **kwargs)
    output.copy_(proj.run(x, layer.weight))
    return output


def _fp8_method_state(method, layer) -> _engines.Fp8MethodState:
    """What SGLang 0.5.23's Fp8LinearMethod left on ``layer`` after its
    process_weights_after_loading, by the names it uses
    (sglang/srt/layers/quantization/fp8.py, fp8_utils.py)."""
    config = getattr(method, "quant_config", None)
    scales = getattr(layer, "weight_scale_inv", None)
    weight = getattr(layer, "weight", None)
    return _engines.Fp8MethodState(
        block_size=(tuple(method.weight_block_size)
                    if getattr(method, "block_quant", False) and method.weight_block_size
                    else None),
        scale_fmt=getattr(config, "scale_fmt", None),
        mxfp8=bool(getattr(method, "use_mxfp8", False)),
        marlin=bool(getattr(method, "use_marlin", False)),
        served_as_mxfp8=bool(getattr(method, "block_fp8_as_mxfp8", False)
                             and getattr(layer, "block_fp8_mxfp8_ready", False)),
        preshuffled=bool(getattr(layer, "aiter_bpreshuffled", False)
                         or getattr(weight, "is_shuffled", False)),
        cpu_packed=bool(getattr(layer, "use_intel_amx_backend", False)),
        static_input_scale=getattr(layer, "input_scale", None) is not None,
        scales_requantized=bool(getattr(scales, "format_ue8m0", False)),
        act_dtype=getattr(layer, "orig_dtype", None),
    )


def _fp8_process_weights(original, method, layer, *args, **kwargs):
    result = original(method, layer, *args, **kwargs)
    name = layer.__dict__.get(_NAME)
    if name is not None:
        # Called again on reload: decided again on the tensors as they are now.
        layer.__dict__.pop(_CKPT, None)
        proj = _engines.take_fp8_checkpoint_layer(
            getattr(layer, "weight", None), getattr(layer, "weight_scale_inv", None),
            _fp8_method_state(method, layer), name, _state["policy"], "sglang", logger,
            REPORT)
        if proj is not None:
            layer.__dict__[_CKPT] = proj
    return result


def _fp8_apply(original, method, layer, x, bias=None, *args, **kwargs):
    proj = layer.__dict__.get(_CKPT)
    # Pre-quantized inputs (an (fp8, scale) tuple, Mxfp8SwizzledInput) and
    # anything but a bf16 CUDA tensor of the layer's K are SGLang's.
    if (proj is None or args or kwargs or not isinstance(x, torch.Tensor)
            or x.dtype != torch.bfloat16 or not x.is_cuda or x.shape[-1] != proj.k
            or not proj.uses_fp8proj(_rows(x))):
        return original(method, layer, x, bias, *args, **kwargs)
    return proj.run(x, layer.weight, layer.weight_scale_inv, bias)


def fp8_checkpoint_layers(model: torch.nn.Module) -> list[str]:
    """Names of the FP8-checkpoint layers of ``model`` that fp8proj took."""
    return [n for n, m in model.named_modules() if _CKPT in m.__dict__]


def tagged_layers(model: torch.nn.Module) -> list[str]:
    """Names of the layers of ``model`` this plugin tagged."""
    return [n for n, m in model.named_modules() if _NAME in m.__dict__]


def fp8_layers(model: torch.nn.Module) -> list[str]:
    """Names of the layers of ``model`` that hold an FP8 copy."""
    return [n for n, m in model.named_modules() if _PROJ in m.__dict__]
