"""What the SGLang and vLLM plugins share: the opt-in flags, which MLA
projections are tagged, the Hopper check and the per-layer FP8 state.

Both engines keep their own linear layers (ColumnParallelLinear /
RowParallelLinear) with the bf16 weight of this tensor-parallel shard as
``layer.weight``. The plugin never replaces those modules: it makes a private
fp8proj projection for the tagged ones at weight load, holds it outside the
module tree (``layer.__dict__``, so ``named_modules()``, ``state_dict()`` and
weight loading see exactly what they saw before) and sends ``apply()`` through
it. Nothing here imports an engine, so this module imports everywhere.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch

logger = logging.getLogger("fp8proj.integrations")

# The reference design's flag (sglang#31955) and fp8proj's own.
REFERENCE_FLAG = "SGLANG_DSA_FP8_PROJ_GEMM"
FP8PROJ_FLAG = "FP8PROJ_PREFILL_FP8"
TARGETS_ENV = "FP8PROJ_ENGINE_TARGETS"
DECODE_CEILING_ENV = "FP8PROJ_DECODE_CEILING"
DEFAULT_DECODE_CEILING = 512  # the C++ layer's default (ProjectionOptions::decode_ceiling)

# Tagged by default, as in the reference design: the two large dense GEMMs of
# MLA attention that stay bf16 even in quantized checkpoints.
DEFAULT_TARGETS = ("q_b_proj", "o_proj")
# Opt-in through FP8PROJ_ENGINE_TARGETS. The reference kept fused_qkv_a
# (2624 rows for GLM-5, not a multiple of 128) and kv_b_proj in bf16; fp8proj's
# kernel takes a partial last N block, so they may be tagged on request.
# q_proj is the plain query projection of models without q_lora (V2-Lite).
OPTIONAL_TARGETS = ("fused_qkv_a", "kv_b_proj", "q_proj")
# Engine attribute names of the attention projections, per target name.
ATTRIBUTE_NAMES = {
    "q_b_proj": ("q_b_proj",),
    "o_proj": ("o_proj",),
    "kv_b_proj": ("kv_b_proj",),
    "q_proj": ("q_proj",),
    # SGLang: fused_qkv_a_proj_with_mqa, vLLM: fused_qkv_a_proj.
    "fused_qkv_a": ("fused_qkv_a_proj_with_mqa", "fused_qkv_a_proj"),
}

_TRUE = ("1", "true", "yes", "on", "prefill", "all")
_FALSE = ("", "0", "false", "no", "off")


def _parse_bool(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"{name}={os.environ.get(name)!r}: expected 0/1 (or prefill/all for "
        f"{FP8PROJ_FLAG})"
    )


def policy_from_env() -> str:
    """``all`` when FP8PROJ_PREFILL_FP8=all, else ``prefill`` (the reference's
    meaning: decode batches stay bf16)."""
    value = os.environ.get(FP8PROJ_FLAG, "").strip().lower()
    return "all" if value == "all" else "prefill"


def sglang_enabled() -> tuple[bool, str]:
    """(enabled, which flag enabled it). SGLang's plugin is opt-in by the
    reference flag or by fp8proj's own; both unset means no hook at all."""
    if _parse_bool(REFERENCE_FLAG):
        return True, REFERENCE_FLAG
    if _parse_bool(FP8PROJ_FLAG):
        return True, FP8PROJ_FLAG
    return False, ""


def fp8_switched_off() -> bool:
    """True when FP8PROJ_PREFILL_FP8 is set to an explicit off value (0/false/no/off)."""
    value = os.environ.get(FP8PROJ_FLAG, "").strip().lower()
    return value != "" and value in _FALSE


def targets_from_env() -> tuple[str, ...]:
    """Target names from FP8PROJ_ENGINE_TARGETS (comma-separated), default
    q_b_proj,o_proj. Unknown names are an error, not silently ignored."""
    raw = os.environ.get(TARGETS_ENV, "").strip()
    if not raw:
        return DEFAULT_TARGETS
    names = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
    known = DEFAULT_TARGETS + OPTIONAL_TARGETS
    bad = [t for t in names if t not in known]
    if bad:
        raise ValueError(
            f"{TARGETS_ENV}={raw!r}: unknown target(s) {bad}; known: {list(known)}"
        )
    return names


def decode_ceiling_from_env() -> int:
    """FP8PROJ_DECODE_CEILING (integer >= 0, default 512): the largest decode
    batch. The FP8-checkpoint path reads it in Python (the bf16 path's C++
    layer reads the same variable): under policy ``prefill`` batches of at
    most this many rows stay on the engine's own FP8 kernels."""
    raw = os.environ.get(DECODE_CEILING_ENV, "").strip()
    if not raw:
        return DEFAULT_DECODE_CEILING
    try:
        value = int(raw, 10)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{DECODE_CEILING_ENV}={raw!r}: expected an integer >= 0")
    return value


def target_of_prefix(prefix: str, targets: tuple[str, ...]) -> str | None:
    """The target a layer name is, or None. Only projections directly under
    an ``self_attn`` module (the DeepSeek/GLM/Kimi naming,
    ``model.layers.N.self_attn.q_b_proj``) qualify, so an ``o_proj`` of
    another block (a vision tower, an indexer) is never tagged."""
    parts = prefix.split(".")
    if len(parts) < 2 or parts[-2] != "self_attn":
        return None
    for target in targets:
        if parts[-1] in ATTRIBUTE_NAMES[target]:
            return target
    return None


def arch_status() -> tuple[bool, str]:
    """(True, "") when the FP8 path can run here: an sm_90 GPU and fp8proj's
    CUDA build. Elsewhere the plugins change nothing."""
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) != (9, 0):
        return False, f"GPU is sm_{major}{minor}, the FP8 path is sm_90 only"
    import fp8proj

    ok, reason = fp8proj.cuda_status()
    return (True, "") if ok else (False, reason)


def planned_fp8_copy(n: int, k: int) -> dict:
    """Shapes and bytes of the FP8 copy fp8proj makes of an [N, K] bf16
    weight: e4m3 values [N, K] plus fp32 scales of 128x128 blocks
    [ceil(N/128), ceil(K/128)]. Used by the load log and the engine tests."""
    scales = (-(-n // 128), -(-k // 128))
    return {
        "values_shape": (n, k),
        "scales_shape": scales,
        "extra_bytes": n * k + 4 * scales[0] * scales[1],
        "eligible": k % 128 == 0 and n > 0,
    }


@dataclass
class TagReport:
    """What a plugin tagged and skipped, in load order (for logs and tests).
    ``fp8_checkpoint``: per tagged layer of an FP8 checkpoint (the engine's own
    FP8 linear method), the decision made after the engine's weight processing:
    ``{"n", "k", "eligible", "taken", "reason", "act_scale_fmt", "policy"}``
    (the last decision wins: a reload decides again)."""

    tagged: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    fp8_checkpoint: dict = field(default_factory=dict)

    def clear(self) -> None:
        self.tagged.clear()
        self.skipped.clear()
        self.fp8_checkpoint.clear()


def _op_handle(module) -> int:
    """The integer id ``torch.ops.fp8proj.linear`` takes for this module's
    C++ layer."""
    handle = getattr(module, "handle", None)
    if handle is None:
        proj = getattr(module, "_proj", None)
        handle = getattr(proj, "id", None)
    if not isinstance(handle, int):
        raise RuntimeError(
            f"{type(module).__name__} exposes no integer layer handle; fp8proj's "
            "Python package does not match this plugin"
        )
    return handle


class EngineProjection:
    """The private FP8 side of one tagged engine layer.

    Holds an ``fp8proj.torch.Fp8ProjLinear`` made over the engine's own bf16
    weight Parameter (shared, not copied), which owns the FP8 copy and the
    gate. ``run`` goes through the gated torch op (or, eager, the module over
    the same C++ layer): its fake implementation lets torch.compile trace it,
    its M-gate picks FP8 or bf16 per call.
    """

    def __init__(self, name: str, weight: torch.nn.Parameter, policy: str):
        from fp8proj.torch import Fp8ProjLinear

        self.name = name
        self.n, self.k = (int(s) for s in weight.shape)
        self.policy = policy
        self.module = Fp8ProjLinear(weight, None, name=name, enabled=True, policy=policy)
        self.has_fp8 = self.module.memory()["fp8_values"] > 0
        self.handle = _op_handle(self.module) if self.has_fp8 else -1

    def uses_fp8(self, m: int) -> bool:
        return self.has_fp8 and bool(self.module.uses_fp8(m))

    def explain(self, m: int) -> str:
        return str(self.module.explain(m))

    def extra_memory_bytes(self) -> int:
        return int(self.module.extra_memory_bytes())

    def run(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """y = x . weight^T through the gate. Traced (torch.compile): the op,
        whose M-gate decides per call. Eager: the module, which runs the same
        C++ layer and also re-quantizes a weight changed in place since load
        (its version counter moved)."""
        x2 = x.reshape(-1, self.k)
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        if torch.compiler.is_compiling():
            y = torch.ops.fp8proj.linear(x2, weight, self.handle)
        else:
            y = self.module(x2)
        return y.reshape(*x.shape[:-1], self.n)


def prepare_layer(
    layer: torch.nn.Module,
    name: str,
    policy: str,
    engine: str,
    log: logging.Logger,
) -> EngineProjection | None:
    """Make the FP8 copy of one tagged layer after its weights are loaded, or
    say in one log line why it stays bf16. Never raises for an ineligible
    layer: an engine must start with the flag on wherever it starts without."""
    weight = getattr(layer, "weight", None)
    if weight is None or weight.dim() != 2:
        log.info("[fp8proj] %s %s: stays bf16 (no 2-D weight)", engine, name)
        return None
    n, k = weight.shape
    plan = planned_fp8_copy(n, k)
    if weight.dtype != torch.bfloat16:
        log.info("[fp8proj] %s %s [N=%d K=%d]: stays bf16 (weight is %s, not bf16)",
                 engine, name, n, k, weight.dtype)
        return None
    if getattr(layer, "bias", None) is not None:
        log.info("[fp8proj] %s %s [N=%d K=%d]: stays bf16 (layer has a bias)",
                 engine, name, n, k)
        return None
    if not plan["eligible"]:
        log.info("[fp8proj] %s %s [N=%d K=%d]: stays bf16 (K not a multiple of 128)",
                 engine, name, n, k)
        return None
    ok, reason = arch_status()
    if not ok:
        log.info("[fp8proj] %s %s [N=%d K=%d]: stays bf16 (%s)", engine, name, n, k,
                 reason)
        return None
    if not weight.is_cuda:
        log.info("[fp8proj] %s %s [N=%d K=%d]: stays bf16 (weight on %s)", engine,
                 name, n, k, weight.device)
        return None
    proj = EngineProjection(name, weight, policy)
    if not proj.has_fp8:
        log.info("[fp8proj] %s %s [N=%d K=%d]: stays bf16 (%s)", engine, name, n, k,
                 proj.explain(1 << 20))
        return None
    log.info(
        "[fp8proj] %s %s [N=%d K=%d]: FP8 copy made (+%.1f MiB), policy %s; %s",
        engine, name, n, k, proj.extra_memory_bytes() / 2**20, policy,
        proj.explain(4096),
    )
    return proj


# ---- FP8 checkpoints: the engine's own FP8 linear method --------------------------------------
#
# An FP8 checkpoint's projections load through the engine's FP8 linear method, not the unquantized
# one: e4m3 weights with fp32 scales per 128x128 block, already what fp8proj's GEMM takes. After the
# engine's own weight processing, a tagged layer whose tensors are still in that plain form is
# taken: its apply() runs fp8proj's activation quantization and GEMM on layer.weight and
# layer.weight_scale_inv as they are (no copy, no re-quantization). The decision is made from
# plain values (the engine glue reads its own attribute names), so it is testable without an engine.


@dataclass
class Fp8MethodState:
    """What an engine's FP8 linear method left on one layer after its weight processing, in
    engine-neutral terms (SGLang's names in sglang.py, ``_fp8_method_state``)."""

    block_size: tuple | None  # the weight's quantization block [N, K]; None: per-tensor / channel
    scale_fmt: str | None = None  # the checkpoint's scale_fmt ("ue8m0", "float" or None)
    mxfp8: bool = False  # MXFP8 (1x32 blocks, UE8M0 scales)
    marlin: bool = False  # weight-only FP8 through Marlin: the weight is repacked
    served_as_mxfp8: bool = False  # block FP8 served through an MXFP8 view (swizzled copies)
    preshuffled: bool = False  # weight rewritten in place into a backend's tile layout
    cpu_packed: bool = False  # weight packed for a CPU backend (AMX, VNNI)
    static_input_scale: bool = False  # a calibrated per-tensor activation scale
    scales_requantized: bool = False  # scales rewritten for DeepGEMM's UE8M0 path at load
    act_dtype: torch.dtype | None = None  # the model's activation dtype


def fp8_checkpoint_skip_reason(weight, scales, state: Fp8MethodState) -> str:
    """"" when fp8proj can take this layer of an FP8 checkpoint as the engine left it, else
    why not (one line for the load log and the report)."""
    from fp8proj.fp8_linear import block_fp8_skip_reason

    if state.mxfp8:
        return "MXFP8 (1x32 blocks, UE8M0 scales), not 128x128 block FP8"
    if state.block_size is None:
        return "per-tensor or per-channel FP8 (no weight_block_size), not 128x128 blocks"
    if tuple(state.block_size) != (128, 128):
        return f"weight_block_size {list(state.block_size)}, not [128, 128]"
    if state.marlin:
        return "weight-only FP8 through Marlin (weight repacked for Marlin)"
    if state.served_as_mxfp8:
        return "served through the engine's MXFP8 view of the block scales (block_fp8_mxfp8_ready)"
    if state.preshuffled:
        return "weight preshuffled in place for AITER (aiter_bpreshuffled), not row-major"
    if state.cpu_packed:
        return "weight packed for the CPU AMX backend"
    if state.static_input_scale:
        return "a static activation scale (activation_scheme static), not 1x128 dynamic groups"
    if state.act_dtype is not None and state.act_dtype != torch.bfloat16:
        return f"activations are {state.act_dtype}; fp8proj's ops take bf16"
    if weight is None or scales is None:
        return "no weight or weight_scale_inv"
    why = block_fp8_skip_reason(weight, scales)
    if why and state.scales_requantized:
        return f"weight_scale_inv re-laid out for DeepGEMM's UE8M0 path at load ({why})"
    return why


class CheckpointProjection:
    """fp8proj's side of one taken FP8-checkpoint layer: no weight of its own. ``run`` reads the
    layer's weight and scales per call, as the engine's apply does (a reload in place is seen;
    the engine's reload calls process_weights_after_loading again, which decides again)."""

    def __init__(self, name: str, weight: torch.Tensor, scales: torch.Tensor, act_fmt: str,
                 policy: str, decode_ceiling: int):
        from fp8proj.fp8_linear import scales_as_fp32

        self.name = name
        self.n, self.k = (int(s) for s in weight.shape)
        self.act_fmt = act_fmt
        self.policy = policy
        self.decode_ceiling = decode_ceiling
        self.weight_scale_fmt = "float" if scales.dtype == torch.float32 else "ue8m0"
        # UE8M0 scales widened once, exactly (4 bytes per block): the GEMM takes fp32 scales.
        self.scales_fp32 = scales_as_fp32(scales)

    def uses_fp8proj(self, m: int) -> bool:
        """Under ``prefill`` decode batches (m <= decode ceiling) stay on the engine's own FP8
        kernels (bit-identical to a run without the plugin); ``all`` takes every batch."""
        return m > 0 and (self.policy == "all" or m > self.decode_ceiling)

    def extra_memory_bytes(self) -> int:
        return self.scales_fp32.numel() * 4 if self.scales_fp32 is not None else 0

    def run(self, x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
            bias: torch.Tensor | None = None) -> torch.Tensor:
        from fp8proj.fp8_linear import block_fp8_linear

        s = self.scales_fp32 if self.scales_fp32 is not None else scales
        return block_fp8_linear(x, weight, s, self.act_fmt, bias)

    def prepare(self, weight: torch.Tensor, scales: torch.Tensor) -> None:
        """One call at load, outside any CUDA graph capture: fp8_gemm makes its plan for this
        weight then (a plan allocates, which a capture refuses)."""
        with torch.no_grad():
            self.run(torch.zeros(4, self.k, dtype=torch.bfloat16, device=weight.device), weight, scales)


def take_fp8_checkpoint_layer(
    weight, scales, state: Fp8MethodState, name: str, policy: str, engine: str,
    log: logging.Logger, report: TagReport | None = None,
) -> CheckpointProjection | None:
    """Decide for one tagged FP8-checkpoint layer after the engine's weight processing: taken
    (a CheckpointProjection) or left on the engine's method, with one log line either way and the
    decision in ``report.fp8_checkpoint[name]``. Never raises for an ineligible layer."""
    from fp8proj.fp8_linear import activation_scale_format

    n, k = (int(v) for v in weight.shape) if weight is not None and weight.dim() == 2 else (-1, -1)
    act_fmt = activation_scale_format(state.scale_fmt)
    entry = {"n": n, "k": k, "eligible": False, "taken": False, "reason": "",
             "act_scale_fmt": act_fmt, "policy": policy}
    if report is not None:
        report.fp8_checkpoint[name] = entry
    why = fp8_checkpoint_skip_reason(weight, scales, state)
    if not why:
        entry["eligible"] = True
        ok, why = arch_status()
        if ok and fp8_switched_off():
            # Under the reference flag, an explicit FP8PROJ_PREFILL_FP8=0 turns fp8proj's FP8
            # off in both paths, as the C++ layer does for the bf16 one.
            why = f"{FP8PROJ_FLAG}={os.environ.get(FP8PROJ_FLAG)} turns fp8proj's FP8 off"
        if ok and not weight.is_cuda:
            why = f"weight on {weight.device}"
    if why:
        entry["reason"] = why
        log.info("[fp8proj] %s %s [N=%d K=%d]: FP8 checkpoint layer stays on the engine's FP8 "
                 "method (%s)", engine, name, n, k, why)
        return None
    ceiling = decode_ceiling_from_env()
    proj = CheckpointProjection(name, weight, scales, act_fmt, policy, ceiling)
    proj.prepare(weight, scales)
    entry["taken"] = True
    entry["extra_bytes"] = proj.extra_memory_bytes()
    log.info("[fp8proj] %s %s [N=%d K=%d]: FP8 checkpoint layer taken: its e4m3 weight and %s "
             "weight_scale_inv as loaded (no copy, +%d bytes), activations 1x128 groups with %s "
             "scales; policy %s (%s)", engine, name, n, k, proj.weight_scale_fmt,
             proj.extra_memory_bytes(), "power-of-two" if act_fmt == "ue8m0" else "fp32 amax/448",
             policy, "every batch" if policy == "all" else f"batches of more than {ceiling} rows")
    return proj
